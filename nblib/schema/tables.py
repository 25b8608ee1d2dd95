"""The tables inside results.json, one pydantic model per table's row: the rows each study builds (as
dicts, columns in the order the notebook shows them) and nblib.schema.results validates, leaf by leaf.

A row model is what a reader of a loaded results file gets: `r.toggles[0].bucket`. Rows another
module defines (notebook 00's symptom matrix, nblib.studies.overlap.MatrixRow, which notebook 03
reads; its configuration, nblib.studies.overlap.Configuration) are used from there, not restated here.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, create_model

from nblib.studies import designs as D
from nblib.studies.overlap import Configuration

FORBID = ConfigDict(extra="forbid")


class Table(BaseModel):
    """A row of one of results.json's tables: no key the model does not know."""

    model_config = FORBID


# ------------------------------------------------------------------------------------------------
# notebook 00
# ------------------------------------------------------------------------------------------------


class ProtocolCheck(Table):
    """The protocol's verdict on one configuration, pooled over its seed runs (studies.protocol)."""

    index_dtype: str
    mode: str
    overlap: str
    runs: str  # each run's count, "k/n, k/n, ..."
    corrupted_sessions: int
    sessions: int
    lo: float  # the pooled rate's Wilson interval
    hi: float
    corrupted_steps: int
    steps: int
    dispersion_p: float  # whether the runs' rates differ more than chance would make them
    expected: str
    holds: bool


class Alias(Table):
    """Two tensors of one graph's pool whose bytes overlap (Runner.aliases): a freed block handed on."""

    index_dtype: str
    overlap: str
    bucket: int
    first: str
    first_stream: str
    first_addr: str
    first_nbytes: int
    second: str
    second_stream: str
    second_addr: str
    second_nbytes: int
    shared_bytes: int


class WindowBucket(Table):
    """Per bucket: the context lengths of the steps that corrupted and those that did not (bf16)."""

    bucket: int
    steps: int
    corrupted_steps: int
    shortest_corrupted: int | None  # None: no step corrupted
    longest_clean: int | None  # None: no step was clean
    clean_above_shortest_corrupted: int


class WindowStep(Table):
    """One replayed step with overlap on: its longest and summed context, its batch and bad rows."""

    index_dtype: str
    bucket: int
    ctx_max: int
    ctx_sum: int
    bs: int
    bad_rows: int


class FingerprintCheck(Table):
    """One clean (or corrupting) check of the fingerprint (reproduce.fingerprint)."""

    check: str
    scope: str
    corrupted: int
    sessions: int
    upper95: float  # the rate's 95% upper bound
    holds: bool | None  # None: nothing measured there
    expected: str
    why: str


# ------------------------------------------------------------------------------------------------
# notebook 01
# ------------------------------------------------------------------------------------------------


class CanaryRow(Table):
    """One (index dtype, overlap, bucket): its replays' corruption and what the canary saw of the pages."""

    index_dtype: str
    overlap: str
    bucket: int
    sessions: int
    corrupted_sessions: int
    steps: int
    corrupted_steps: int
    tail_steps: int
    tail_corrupted_steps: int
    pages_watched: int
    pages_changed: int
    pages_expected: int
    expected_unchanged: int
    pages_outside_live: int
    scratch_writes: int
    free_page_writes: int
    live_overwrites: int
    steps_with_live_overwrite: int
    replays: int


# ------------------------------------------------------------------------------------------------
# notebook 02
# ------------------------------------------------------------------------------------------------

# Per bucket, each arm's steps there as "corrupted/steps" (designs.bucket_table): one column per arm run,
# named after the arm, so a column is absent where its arm was not run.
BucketSteps = create_model(
    "BucketSteps",
    __base__=Table,
    __doc__="One bucket's steps under each arm run, as 'corrupted/steps' (designs.bucket_table).",
    bucket=(int, ...),
    **{arm: (str | None, None) for arm in D.ARMS},
)


class Overhead(Table):
    """One instrument's replay time on one bucket (instruments.overhead.replay_times)."""

    instrument: str
    bucket: int
    replays: int
    warmup: int
    ctx: int | None = None  # entries a request in the timed batch holds (absent in older results)
    median_ms: float
    calls: int
    method: str  # the timer: "cuda events" on CUDA, the timing model's name on the simulator
    ratio: float | None  # median over the plain replay's; None for the plain replay itself


# ------------------------------------------------------------------------------------------------
# notebook 03
# ------------------------------------------------------------------------------------------------


class Toggle(Configuration):
    """One (configuration, bucket): its replays' corruption and the audit's hazards (overlap.toggles)."""

    bucket: int
    sessions: int | None  # None: not replayed (not_replayed says why)
    corrupted_sessions: int | None
    steps: int | None
    corrupted_steps: int | None
    not_replayed: str
    hazards: int
    audit: Literal["hazard", "clean"]
    tensors: str  # the racing tensor pairs, "a (side) / b (main); ..."
    alloc_free: str  # the first pair's allocation and free sites


class GraphCheck(Configuration):
    """One forked capture's audit against the graph built (overlap.graph_rows, graph_check.rows): the
    counts of CrossCheck.row() and the first entries of each list (graph_check.DETAILS)."""

    bucket: int
    hazards: int
    source: str  # where the graph was read: the simulator's or CUDA's driver
    nodes: int
    confirmed: int
    confirmed_by_order: int
    contradicted: int
    undecidable: int
    missed: int
    lacking: int
    unclaimed: int
    blind: int
    internal: int
    by_order: int
    topological: bool
    agree: bool
    lacking_ops: list[str]
    undecidable_pairs: list[str]
    contradicted_pairs: list[str]
    missed_pairs: list[str]
    confirmed_pairs: list[str]
    blind_nodes: list[str]
    internal_nodes: list[str]
    by_order_ops: list[str]
    unclaimed_nodes: list[str]
    context: list[str]


class GraphUnread(Configuration):
    """A forked capture whose graph the driver would not hand over: the refused call, no verdict."""

    bucket: int
    agree: None
    error: str


class ZooCase(Table):
    """One zoo scenario audited and its graph read back (overlap.zoo_rows)."""

    case: str
    variant: str
    expected: str
    reported: str
    right: bool
    graph_agrees: bool
    graph_error: str  # "": the graph was read


class CsanRun(Table):
    """PyTorch's CUDA sanitizer on one logits policy's capture (instruments.csan.row; CUDA only)."""

    logits_policy: str | None
    csan: Literal["failed to run", "error", "nothing"]
    kernels: str
    where: str
    captured: list[int] | None  # the buckets captured before CSAN stopped it
    control: bool | None  # whether CSAN reported its own planted control race


class OverlapCheck(Table):
    """What the audit must get right, checked on the toggles' rows (overlap.checks)."""

    check: str
    configurations: int
    failures: int
    holds: bool
    expected: Literal["hazard", "clean"]
    where: str


# ------------------------------------------------------------------------------------------------
# notebook 04
# ------------------------------------------------------------------------------------------------


class FixRun(Table):
    """One variant on one bucket: its replays' corruption (studies.fix)."""

    variant: str
    bucket: int
    sessions: int
    corrupted_sessions: int
    steps: int
    corrupted_steps: int
    tail_steps: int
    tail_corrupted_steps: int


class Pooled(Table):
    """One variant pooled over the buckets the plan pools (studies.fix)."""

    variant: str
    buckets: list[int]
    corrupted_sessions: int
    sessions: int
    rate: float
    lo: float  # the Wilson interval's bounds
    hi: float


class StepTime(Table):
    """One variant's decode step on one bucket: the median and quartiles over its replays."""

    variant: str
    bucket: int
    median_ms: float
    q1_ms: float
    q3_ms: float
    replays: int
    ctx: int
    method: str  # the timer (caveats.timing_label says what its numbers are)


class Speed(Table):
    """Per bucket: each variant's median step (fix.SPEED_KEYS; absent where the variant did not run), the
    overlap's gain (off / on - 1) and each fix's share of it (fix.speed)."""

    bucket: int
    overlap_on_ms: float | None = None
    overlap_off_ms: float | None = None
    persistent_ms: float | None = None
    record_stream_ms: float | None = None
    overlap_gain: float | None = None  # present where both overlap on and off ran
    overlap_helps: bool | None = None
    persistent_kept: float | None = None  # None as well where the overlap gained nothing to keep
    persistent_vs_on: float | None = None
    record_stream_kept: float | None = None
    record_stream_vs_on: float | None = None


class Branches(Table):
    """Per bucket: what the overlap could hide (the shorter branch alone) and what it did hide."""

    bucket: int
    indexer_ms: float
    main_ms: float
    could_hide_ms: float
    hidden_ms: float  # overlap off minus the buggy overlap
    helps: bool
