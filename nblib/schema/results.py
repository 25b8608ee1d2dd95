"""results: one pydantic model per notebook's results.json (00 to 07) and one for a run's index.json.

A notebook writes its file key by key (nblib.core.results.Results); when its last cell marks status
ok, nblib.setup's hook validates the whole file through the notebook's model, so a key the model
does not know, or one it needs and the notebook did not write, fails that notebook's own run.

While status is "running" only the header (where, on which code, with which parameters) is
required: a notebook that died mid-way leaves a partial file, and it must still load. Once status is
"ok", every body key is required except those named in OLDER: keys that files written before
the key existed lack (they load with None).

Every table is typed to its leaves: a row's model is in nblib.schema.tables, or beside the code that
builds it (the studies' and the audit's models). The header's params and fixed are mappings whose
keys differ per notebook (nblib.schema.params checks params key by key at setup); their values are
ParamValue, JSON's leaves or one level of list or mapping of them.
"""

import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from nblib.core.phases import PhaseTime
from nblib.schema import tables as T
from nblib.studies import designs as D
from nblib.studies import engines as E
from nblib.studies import forced as F
from nblib.studies import method as M
from nblib.studies import overlap as O
from nblib.studies import protocol as P

__all__ = [
    "MODELS",
    "Canary01",
    "Dropped",
    "Engines06",
    "Fix04",
    "GraphVsEager02",
    "IndexFile",
    "IndexRecord",
    "Method07",
    "Overlap03",
    "ParamValue",
    "Report05",
    "Reproduce00",
    "ResultsFile",
    "Scalar",
    "load",
    "load_if_any",
    "validate",
]

FORBID = ConfigDict(extra="forbid")

# A value of the header's params or fixed as JSON holds it: a leaf (seed, logits_policy), a list of
# leaves (buckets, index_dtypes) or a mapping of leaves (the model's shapes, the workload).
Scalar = str | bool | int | float | None
ParamValue = Scalar | list[Scalar] | dict[str, Scalar]


class Dropped(BaseModel):
    """The index dtypes this GPU's kernels cannot run, left out of index_dtypes (nblib.run.notebook)."""

    model_config = FORBID
    index_dtypes: list[str]
    reason: str


class ResultsFile(BaseModel):
    """The header every results.json carries (Results.__init__ and Results.finish), and the rule that
    body keys are required once status is ok."""

    model_config = FORBID
    # wall_seconds/phases: absent from the files of the first GPU runs, written without the phase clock
    OLDER: ClassVar[frozenset[str]] = frozenset({"wall_seconds", "phases"})

    notebook: str
    status: Literal["running", "ok"]
    backend: str
    device: str
    torch: str
    triton: str | None  # None where Triton is not installed (the simulator runs without it)
    commit: str
    python: str
    # the profile keys this notebook declares, defaults applied: already checked key by key against
    # nblib.schema.params at setup, and their set differs per notebook
    params: dict[str, ParamValue]
    # what the notebook runs whatever the profile says; its keys differ per notebook
    fixed: dict[str, ParamValue] | None = None
    dropped: Dropped | None = None  # CUDA only, where this GPU cannot run an index dtype listed
    seconds: float | None = None
    wall_seconds: float | None = None
    phases: list[PhaseTime] | None = None
    verdict: str | None = None

    @model_validator(mode="after")
    def _complete_when_ok(self):
        if self.status != "ok":
            return self
        # the header's own optional keys: fixed and dropped are written only where they apply
        needed = set(type(self).model_fields) - {"fixed", "dropped"} - self.OLDER
        missing = sorted(needed - self.model_fields_set)
        if missing:
            raise ValueError(f"status ok but {', '.join(missing)} missing")
        return self


class Fingerprint(BaseModel):
    """Notebook 00: the corrupting configuration pooled over buckets > 1 (reproduce.corrupting),
    with the clean checks (reproduce.fingerprint)."""

    model_config = FORBID
    checks: list[T.FingerprintCheck]
    corrupted_sessions: int
    sessions: int
    session_rate: float
    corrupted_steps: int
    steps: int
    step_rate: float
    buckets: list[int]
    buckets_corrupting: list[int]


class Reproduce00(ResultsFile, O.Reproduced):
    """Notebook 00; notebook 03 reads it as the Reproduced it is (its header and symptom matrix)."""

    # absent from results written before the protocol ran, or before its seed blocks
    OLDER: ClassVar[frozenset[str]] = ResultsFile.OLDER | {
        "protocol_checks", "protocol", "protocol_verdict", "blocks_verdict"
    }  # fmt: skip

    notebook: Literal["00_reproduce"]
    protocol_verdict: str | None = None  # the protocol's sentence, shown under its figure
    blocks_verdict: str | None = None  # the seed blocks' sentence; None: seed_blocks empty
    protocol_checks: list[T.ProtocolCheck] | None = None
    protocol: P.Protocol | None = None  # None: the corrupting configuration was not run
    matrix: list[O.MatrixRow] | None = None
    aliases: list[T.Alias] | None = None
    fingerprint: Fingerprint | None = None
    window: list[T.WindowBucket] | None = None
    window_steps: list[T.WindowStep] | None = None


class CanaryTotals(BaseModel):
    model_config = FORBID
    pages_changed: int
    pages_expected: int
    pages_outside_live: int
    live_overwrites: int


class Canary01(ResultsFile):
    notebook: Literal["01_canary"]
    canary: list[T.CanaryRow] | None = None
    corrupting_buckets: list[int] | None = None
    canary_at_corrupting: CanaryTotals | None = None


class SessionsNeeded(BaseModel):
    model_config = FORBID
    baseline: float
    fisher: int
    normal: int


class MechanismRow(D.Mechanism):
    model_config = FORBID
    design: str


class DesignForced(F.ForcedArm):
    """Notebook 02: one arm's captures under the forced order (studies.forced), with the arm's name."""

    model_config = FORBID
    design: str


class GraphVsEager02(ResultsFile):
    OLDER: ClassVar[frozenset[str]] = ResultsFile.OLDER | {
        "campaign_verdict", "bucket_table", "forced", "forced_verdict"
    }  # fmt: skip
    notebook: Literal["02_graph_vs_eager"]
    off: D.Arm | None = None
    designs: list[D.Arm] | None = None
    mechanism: list[MechanismRow] | None = None
    timing_method: str | None = None
    explanation: D.Explanation | None = None
    campaign_verdict: str | None = None  # None: the campaign's design was not among the arms
    bucket_table: list[T.BucketSteps] | None = None
    forced: list[DesignForced] | None = None
    forced_verdict: str | None = None
    recommended: str | None = None
    signature: list[str] | None = None
    sessions_needed: list[SessionsNeeded] | None = None
    zero_failure_1pct: int | None = None
    overhead: list[T.Overhead] | None = None


class Overlap03(ResultsFile):
    # csan_verdict: written on CUDA only (CSAN needs it); csan is None on the simulator;
    # hazard_sentences: absent from results written before the notebook stored them
    # forced, forced_verdict: absent from results written before the forced order was run
    OLDER: ClassVar[frozenset[str]] = ResultsFile.OLDER | {
        "csan_verdict",
        "hazard_sentences",
        "forced",
        "forced_verdict",
    }

    notebook: Literal["03_stream_overlap"]
    transient_rows_from: str | None = None
    toggles: list[T.Toggle] | None = None
    hazards: list[O.OverlapHazard] | None = None
    hazard_sentences: list[str] | None = None  # one per racy configuration: its first hazard
    forced: list[F.ForcedRow] | None = None  # each hazard under the forced order (audit_confirm)
    forced_verdict: str | None = None
    graph_check: list[T.GraphCheck | T.GraphUnread] | None = None
    zoo: list[T.ZooCase] | None = None
    graph_verdict: str | None = None
    audit_one_capture_seconds: float | None = None
    audit_analysis_ms: float | None = None
    csan: list[T.CsanRun] | None = None
    csan_verdict: str | None = None
    checks: list[T.OverlapCheck] | None = None


class FixPlan(BaseModel):
    model_config = FORBID
    needed: int
    target: float
    racy_buckets: list[int]
    pooled_buckets: list[int]
    sessions: dict[int, int]  # clean sessions per bucket a fix runs
    floor: dict[int, int] | None = None  # sessions each bucket must count (absent in older results)


class FixAudit(BaseModel):
    model_config = FORBID
    variant: str
    ok: bool
    hazards: int
    summary: str
    buckets: list[int]


class FixCheck(BaseModel):
    model_config = FORBID
    check: str
    measured: str
    holds: bool | None  # None: a speed check on the simulator's timing model, not judged


class MicroBatchAudit(BaseModel):
    """Notebook 04's two overlapped micro-batches, one buffer layout (nblib.studies.microbatch)."""

    model_config = FORBID
    layout: Literal["shared", "per micro-batch"]
    status: Literal["clean", "hazards", "failed"]
    hazards: int
    kinds: str
    bytes_of: str
    streams: str


class Fix04(ResultsFile):
    OLDER: ClassVar[frozenset[str]] = ResultsFile.OLDER | {"micro_batches", "micro_batches_verdict"}
    notebook: Literal["04_persistent_buffer_fix"]
    plan: FixPlan | None = None
    rows: list[T.FixRun] | None = None
    pooled: list[T.Pooled] | None = None
    audit: list[FixAudit] | None = None
    times: list[T.StepTime] | None = None
    speed: list[T.Speed] | None = None
    overlap_branches: list[T.Branches] | None = None
    overlap_story: str | None = None
    micro_batches: list[MicroBatchAudit] | None = None
    micro_batches_verdict: str | None = None
    checks: list[FixCheck] | None = None


class Report05(ResultsFile):
    notebook: Literal["05_report"]
    notebooks: dict[str, bool] | None = None  # which measuring notebooks the writeup read
    commits: list[str] | None = None


class CliRecord(BaseModel):
    model_config = FORBID
    command: str
    exit_code: int
    seconds: float
    hazards: int | None  # None: the command printed no report
    stderr: str


class Engines06(ResultsFile):
    notebook: Literal["06_audit_your_engine"]
    findings: list[E.Finding] | None = None
    hazards: list[E.TargetHazard] | None = None
    cli: CliRecord | None = None
    captured_ops: list[str] | None = None
    no_cache: list[E.Finding] | None = None
    transcription: list[E.Finding] | None = None
    transcription_hazards: list[E.TargetHazard] | None = None


class Method07(ResultsFile):
    notebook: Literal["07_method_on_your_engine"]
    design: str | None = None  # the probe differential's design
    rows: list[M.MethodRow] | None = None
    confirm_report: str | None = None  # one buggy form's `audit --confirm` report, as the command prints it


MODELS: dict[str, type[ResultsFile]] = {
    m.model_fields["notebook"].annotation.__args__[0]: m
    for m in (Reproduce00, Canary01, GraphVsEager02, Overlap03, Fix04, Report05, Engines06, Method07)
}


def validate(data):
    """The model of data's notebook, validated; raises pydantic.ValidationError (or ValueError for
    a notebook no model covers)."""
    name = data.get("notebook")
    if name not in MODELS:
        raise ValueError(f"results.json of unknown notebook {name!r}: choose one of {', '.join(MODELS)}")
    return MODELS[name].model_validate(data)


def load(path):
    """One results.json file through its notebook's model."""
    return validate(json.loads(Path(path).read_text()))


def load_if_any(path):
    """load(path); None where there is no such file, or one this code's models do not fit (another
    commit's: a reader that needs this commit's run has none there)."""
    try:
        return load(path)
    except (OSError, json.JSONDecodeError, ValidationError):
        return None


class IndexRecord(BaseModel):
    """One notebook's line in index.json (nblib.run.suite)."""

    model_config = FORBID
    notebook: str
    status: Literal["ok", "failed"]
    html: str
    error: str | None
    seconds: float
    verdict: str | None
    backend: str | None
    device: str | None
    commit: str | None
    wall_seconds: float | None = None  # older indexes lack it
    phases: list[PhaseTime] = []  # older indexes lack it


class IndexFile(BaseModel):
    model_config = FORBID
    params: str  # the profile, as shown (runindex.shown_path)
    notebooks: list[IndexRecord]
