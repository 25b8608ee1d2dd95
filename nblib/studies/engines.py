"""Notebook 06: the capture audit on engine code nobody here wrote, through the command users run.

    findings, rows, reports = engines.audit_all(engines.TARGETS, ["sim"], replays=50)
    run = engines.cli("examples/audit/hf_moe.py:qwen2_moe", "sim")  # the audit command's run, a child
    gap = engines.sim_gap(["sim"])  # where the simulator cannot stand in for CUDA, measured

The targets live outside nblib, in examples/audit/, because that is where a user's engine is: the
audit reports sites in the caller's code and leaves nblib's, torch's and site-packages' frames out.
- hf_moe.py: transformers' Qwen2-MoE and DeepSeek-V3 decoders (small configs, random weights) with
  the shared expert forked onto a side stream by a wrapper of each decoder layer's forward: the race
  (the normed states read on the side stream and released before the join) and two fixes.
- dsv4_attention.py: a transcription of SGLang's DeepSeek-V4 multi-stream attention prepare path,
  fused q/kv projection on and off: a model of the engine's stream ordering, not the engine.

Each target is audited with nblib.instruments.audit.target (what `python -m nblib audit` calls) on
each backend asked for. The audited graph is then replayed and compared with the eager step, so the
table also says whether the race showed in the output at these sizes: the audit names a race from
the capture alone, whether or not a replay loses it.
"""

import ast
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from nblib.backends import device as devices
from nblib.core.paths import ROOT
from nblib.instruments import audit
from nblib.instruments.audit import target as AT
from nblib.instruments.audit.records import HazardSummary

HF = "examples/audit/hf_moe.py"
DSV4 = "examples/audit/dsv4_attention.py"
REPLAYS = 50  # replays of each audited graph, compared with the eager step
CLI_TIMEOUT = 300  # seconds for one audit child (importing transformers takes ~15 s)


class Target(BaseModel):
    model: str
    form: str
    spec: str  # the TARGET as a user writes it
    expect: Literal["hazards", "clean"] | None  # None: no expectation, the audit's verdict is the finding


def _hf(model, title):
    return [
        Target(model=title, form="buggy", spec=f"{HF}:{model}", expect="hazards"),
        Target(model=title, form="record_stream", spec=f"{HF}:{model}_record_stream", expect="clean"),
        Target(model=title, form="hold_until_join", spec=f"{HF}:{model}_hold_until_join", expect="clean"),
    ]


TARGETS = [*_hf("qwen2_moe", "transformers Qwen2-MoE"), *_hf("deepseek_v3", "transformers DeepSeek-V3")]
TRANSCRIPTION = [
    Target(model="SGLang DeepSeek-V4 prepare (transcription)", form=f, spec=f"{DSV4}:{f}", expect=None)
    for f in ("fused", "unfused")
]
# the decode step without a cache: transformers checks torch.cuda.is_current_stream_capturing() before
# a data-dependent branch, a question the simulator's facade cannot answer for torch.cuda
NO_CACHE = Target(
    model="transformers Qwen2-MoE, no cache", form="buggy", spec=f"{HF}:qwen2_moe_no_cache", expect=None
)


class Finding(BaseModel):
    """One target audited on one backend."""

    model: str
    form: str
    backend: str
    target: str
    expect: str | None
    status: Literal["clean", "hazards", "failed"]
    hazards: int
    tensor_pairs: int  # distinct (allocation, reuse) pairs behind the hazards
    ops: int
    failure: str | None = None
    rule: str | None = None  # the capture rule a failed capture broke
    replays: int = 0
    replays_differing: int = 0  # replays whose output differs from the eager step's at all
    max_abs_diff: float | None = None
    # Each replay's largest difference from the eager step. A graph replay may round differently
    # from the eager step (another kernel order), so a difference means corruption only beyond the
    # floor that the same model's fixed forms show on the same backend (see `beyond_floor`).
    diffs: list[float] = []
    seconds: float

    @property
    def agrees(self):
        return self.expect is None or self.status == self.expect


class Audited(BaseModel):
    """Which audit a row comes from: the target's model and form, and the backend."""

    model_config = ConfigDict(extra="forbid")
    model: str
    form: str
    backend: str


class TargetHazard(HazardSummary, Audited):
    """One hazard as the notebook's table shows it: the audit it comes from, then the hazard's
    summary (HazardRecord.summary), in that order of fields."""


def hazard_rows(t, rep) -> list[TargetHazard]:
    """Target `t`'s report `rep` (a TargetReport), one row per hazard."""
    return [
        TargetHazard(model=t.model, form=t.form, backend=rep.backend, **h.summary().model_dump())
        for h in rep.hazards
    ]


def _pairs(rep):
    return len({(h.first.tensor.name, h.second.tensor.name) for h in rep.hazards})


def _replay(step, rep, dev, replays):
    """Replays of the audited graph that differ from the eager step, and the largest difference.
    The step's rewind() (if any) resets the state a step advances (a cache's write position)."""
    rewind = getattr(step, "rewind", lambda: None)
    rewind()
    ref = step().clone()
    graph, out = rep.audit_report.graph, rep.audit_report.result
    diffs = []
    for _ in range(replays):
        rewind()
        graph.replay()
        dev.synchronize()
        diffs.append((out.float() - ref.float()).abs().max().item())
    return diffs


def in_repository(spec: str) -> str:
    """A target of this repository's examples (path.py:function, the path from the repository's root)
    with the path made absolute, so it loads whatever the process's working folder (JupyterLab starts
    a notebook's kernel in the notebook's folder, papermill here in the repository's)."""
    path, _, fn = spec.rpartition(":")
    return f"{ROOT / path}:{fn}" if path.endswith(".py") and not Path(path).is_absolute() else spec


def audit_one(t, dev, replays=0):
    """Build the target with the facade, audit it (audit_target.audit_step, the CLI's own path),
    replay it `replays` times against the eager step. Returns (Finding, TargetReport)."""
    t0 = time.perf_counter()
    loaded = AT.load(in_repository(t.spec))
    prev = dev.current_stream()
    try:
        step = loaded.fn(dev)
    except Exception as e:  # a build that fails is a finding (e.g. an op the backend lacks), not a crash
        failure = AT.Failure(stage="build", message=f"building {t.spec} failed: {type(e).__name__}: {e}")
        rep = AT.TargetReport(target=t.spec, backend=dev.name, label=t.spec, status="failed", failure=failure)
        step = None
    finally:
        audit.restore_stream(dev, prev)
    if step is not None:
        rep = AT.audit_step(step, dev, target=t.spec)
    diffs = _replay(step, rep, dev, replays) if rep.status != "failed" and replays else []
    f = Finding(
        model=t.model,
        form=t.form,
        backend=dev.name,
        target=t.spec,
        expect=t.expect,
        status=rep.status,
        hazards=len(rep.hazards),
        tensor_pairs=_pairs(rep),
        ops=rep.ops,
        failure=rep.failure.message if rep.failure else None,
        rule=rep.failure.rule if rep.failure else None,
        replays=replays if rep.status != "failed" else 0,
        replays_differing=sum(d > 0 for d in diffs),
        max_abs_diff=max(diffs) if diffs else None,
        diffs=diffs,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return f, rep


def backends_for(dev):
    """The notebook's backend, and the simulator beside CUDA (it runs anywhere, in seconds)."""
    return [dev.name] if dev.name == "sim" else [dev.name, "sim"]


def audit_all(targets, backends, replays=0):
    """Every target on every backend: (findings, hazard rows, {(spec, backend): TargetReport})."""
    findings, rows, reports = [], [], {}
    for b in backends:
        dev = devices.get(b)
        for t in targets:
            f, rep = audit_one(t, dev, replays)
            findings.append(f)
            rows += hazard_rows(t, rep)
            reports[(t.spec, b)] = rep
    return findings, rows, reports


class CliRun(BaseModel):
    """`python -m nblib audit TARGET --backend B` as a user runs it: its exit code, its time, and its
    report as --json prints it (None where it printed none: stderr says why)."""

    command: str  # the command line as a user types it
    exit_code: int
    seconds: float
    report: AT.TargetReport | None = None
    stderr: str = ""


def cli(spec, backend, timeout=CLI_TIMEOUT):
    """The command's run in a child process (a fresh interpreter that imports torch and the target as a
    user's does, while this process audits): the child runs nblib.instruments.audit.target, the function
    and JSON that `python -m nblib audit TARGET --json` prints, through that module's own entry point."""
    cmd = [sys.executable, "-m", AT.__name__, spec, "--backend", backend]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
    shown = f"python -m nblib audit {spec} --backend {backend}"
    rep = AT.TargetReport.model_validate_json(p.stdout) if p.stdout.strip().startswith("{") else None
    return CliRun(
        command=shown,
        exit_code=p.returncode,
        seconds=round(time.perf_counter() - t0, 1),
        report=rep,
        stderr=p.stderr.strip()[-2000:] if rep is None else "",
    )


def cli_async(spec, backend):
    """cli() in a thread: the child imports torch and transformers while the notebook works."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(cli, spec, backend)
    pool.shutdown(wait=False)
    return future


def source(name, path=HF):
    """The source of a class or function of an example file, as the notebook shows it."""
    text = (ROOT / path).read_text()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    return ast.get_source_segment(text, node)


def sim_gap(backends):
    """The no-cache decode step on each backend: where the simulator stops standing in for CUDA,
    measured (the failure's op, line and rule), not guessed."""
    return [audit_one(NO_CACHE, devices.get(b))[0] for b in backends]


def captured_ops(rep):
    """The distinct ops one audited capture recorded (what the simulator had to implement)."""
    return sorted({op.name for tr in rep.audit_report.traces for op in tr.ops})


def beyond_floor(findings):
    """(replays of the buggy forms that differ from the eager step by more than the largest difference
    any fixed form of the same model shows on the same backend, that largest floor). A fixed form's
    replays differ only by rounding, so that is the floor; with no fixed form replayed, any difference."""
    floors = {}
    for f in findings:
        if f.expect == "clean" and f.diffs:
            key = (f.model, f.backend)
            floors[key] = max(floors.get(key, 0.0), *f.diffs)
    lost = sum(
        d > floors.get((f.model, f.backend), 0.0) for f in findings if f.expect == "hazards" for d in f.diffs
    )
    return lost, max(floors.values(), default=0.0)


def verdict(findings):
    """One sentence from the findings: does the audit name the race in every buggy form, and nothing
    in every fixed one, on every backend that ran?"""
    judged = [f for f in findings if f.expect is not None]
    wrong = [f for f in judged if not f.agrees]
    buggy = [f for f in judged if f.expect == "hazards"]
    fixed = [f for f in judged if f.expect == "clean"]
    backends = sorted({f.backend for f in findings})
    lost, floor = beyond_floor(findings)
    replayed = sum(f.replays for f in buggy)
    head = (
        f"On {' and '.join(backends)}, the audit names the shared expert's race in "
        f"{sum(f.agrees for f in buggy)} of {len(buggy)} buggy forms and finds nothing in "
        f"{sum(f.agrees for f in fixed)} of {len(fixed)} fixed forms"
    )
    if wrong:
        head += "; wrong: " + ", ".join(f"{f.model} {f.form} on {f.backend} ({f.status})" for f in wrong)
    latent = " (the race is latent at these sizes: the audit finds it from the capture alone)"
    tail = (
        f"; {lost} of {replayed} of the buggy forms' replays differed from the eager step by more than "
        f"the fixed forms' graph-vs-eager rounding (at most {floor:.2g})" + (latent if not lost else "")
        if replayed
        else ""
    )
    return head + tail + "."
