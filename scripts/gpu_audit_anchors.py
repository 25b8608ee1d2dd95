"""Who catches what: the capture audit beside PyTorch's CUDA sanitizer and NVIDIA compute-sanitizer,
on the same targets, each tool in child processes with their own timeouts (about 6 minutes on an H200).

Usage: python scripts/gpu_audit_anchors.py OUTDIR [--tools audit csan ...] [--groups zoo hf ...]
                                          [--workers N] [--backend sim]
Writes OUTDIR/anchors.json (pydantic: every cell with its verdict, detail and seconds) and OUTDIR/README.md.

Targets (--groups):
  zoo        nblib.instruments.audit.zoo: every planted race and its synchronised twin
  miniature  the suite's decode model, ci profile: the racy configuration (bf16, overlap on,
             transient logits) and the persistent-buffer fix, every ci bucket
  hf         examples/audit/hf_moe.py: transformers Qwen2-MoE and DeepSeek-V3, shared expert on a
             side stream, buggy and the two fixes
  dsv4       examples/audit/dsv4_attention.py: the transcription of SGLang's DeepSeek-V4 prepare
             path (a model of its ordering, not the engine), fused projection on and off
  field      examples/field/: the engines' real bugs, each buggy and fixed form (examples/field/cases.py
             says which race is expected; a form whose capture fails expects nothing)
Tools (--tools):
  audit                       nblib's capture audit (one child per target)
  csan                        TORCH_CUDA_SANITIZER=1: torch.cuda._sanitizer (one child per target;
                              it raises at the first race it sees, which aborts that capture)
  memcheck, racecheck         compute-sanitizer --tool memcheck / racecheck around one child per
                              group, which captures each target and replays it REPLAYS times;
  memcheck-nocache, ...       the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1
  tcgd                        torch-cudagraph-debug (PyPI): its TensorProbe on each tensor of the step's
                              output, the eager step's snapshot compared with each of TCGD_REPLAYS
                              natural replays' (compare_snapshots, at its default allclose tolerance);
                              targets of the TARGET contract (hf, dsv4, field) only, since it needs a
                              step to run eagerly and captured
A cell is race, clean, error (the tool or the capture failed: the why is its detail, taken from the
tool's output), timeout, or not run (the why). --backend sim runs the audit tool on the simulator: a
dry run of the plumbing on a CPU machine.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

from nblib.core.files import write_json, write_text  # noqa: E402

GROUPS = ("zoo", "miniature", "hf", "dsv4", "field")
SANITIZERS = ("memcheck", "racecheck", "memcheck-nocache", "racecheck-nocache")
TOOLS = ("audit", "csan", *SANITIZERS, "tcgd")
TIMEOUT = {"audit": 120, "csan": 120, "tcgd": 120, **dict.fromkeys(SANITIZERS, 90)}  # seconds per child
REPLAYS = 3
TCGD_REPLAYS = 20  # natural replays torch-cudagraph-debug compares with eager, as --confirm's N
HF, DSV4 = "examples/audit/hf_moe.py", "examples/audit/dsv4_attention.py"
MARK = "@@anchor "  # the child's marker lines: MARK + JSON
# compute-sanitizer's report lines that name a finding (errors of memcheck, hazards of racecheck)
FINDING = re.compile(r"^=+ (Invalid |Race reported|.*[Hh]azard|Program hit|Leaked|Uninitialized|Malloc/Free)")
SUMMARY = re.compile(r"^=+ (ERROR|RACECHECK) SUMMARY: (\d+)")


class Spec(BaseModel):
    name: str
    group: str
    expect: Literal["race", "clean"] | None


class Cell(BaseModel):
    verdict: Literal["race", "clean", "error", "timeout", "not run"]
    detail: str = ""
    seconds: float | None = None  # the target's work inside the child (build, capture, replays)


class AnchorRow(BaseModel):
    target: str
    group: str
    expect: str | None
    cells: dict[str, Cell]


class ToolSummary(BaseModel):
    tool: str
    caught: int  # race on a target with a planted race
    missed: int  # clean on one
    false_alarms: int  # race on a correctly synchronised target
    errors: int
    timeouts: int
    not_run: int
    child_seconds: float  # wall time of all its children, one after another


class ChildResult(BaseModel):
    """One child process: what it was asked, what it printed, how it ended."""

    tool: str
    group: str
    targets: list[str]
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    not_run: str | None = None  # why no child was started


class AnchorTable(BaseModel):
    meta: dict
    tools: list[str]
    rows: list[AnchorRow]
    summary: list[ToolSummary]


# ------------------------------------------------------------------------------------------------
# targets (in the child: built and run on a device)
# ------------------------------------------------------------------------------------------------


def specs(groups=GROUPS):
    from nblib.instruments.audit import zoo as audit_zoo

    out = []
    if "zoo" in groups:
        for c in audit_zoo.CASES:
            out += [Spec(name=f"zoo:{c.name}/race", group="zoo", expect="race")]
            out += [Spec(name=f"zoo:{c.name}/twin", group="zoo", expect="clean")]
    if "miniature" in groups:
        out += [Spec(name="miniature:transient", group="miniature", expect="race")]
        out += [Spec(name="miniature:persistent", group="miniature", expect="clean")]
    if "hf" in groups:
        for m in ("qwen2_moe", "deepseek_v3"):
            out += [Spec(name=f"{HF}:{m}", group="hf", expect="race")]
            out += [
                Spec(name=f"{HF}:{m}_{f}", group="hf", expect="clean")
                for f in ("record_stream", "hold_until_join")
            ]
    if "dsv4" in groups:
        out += [Spec(name=f"{DSV4}:{f}", group="dsv4", expect=None) for f in ("fused", "unfused")]
    if "field" in groups:
        out += _field_specs()
    return out


def _field_specs():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # field_table is this script's neighbour, however it was loaded
    from field_table import load_cases

    expect = {"hazards": "race", "clean": "clean", "failed": None}
    return [
        Spec(name=f.target, group="field", expect=expect[f.expect.status])
        for c in load_cases().CASES
        for f in c.forms
    ]


def _miniature():
    """The ci profile's model and buckets: the shapes notebook 03 audits in the tests."""
    from nblib.schema import params as P

    prof = P.load(ROOT / "params" / "ci.yaml")
    return prof["model"], prof["buckets"]


def capture(dev, name):
    """Build the target and capture it; returns the graphs and a function that readies a replay."""
    from nblib.engine.runner import Runner
    from nblib.instruments.audit import target as audit_target
    from nblib.instruments.audit import zoo as audit_zoo

    if name.startswith("zoo:"):
        case, variant = name[4:].split("/")
        c = next(x for x in audit_zoo.CASES if x.name == case)
        return [g for g, _ in audit_zoo.capture_all(dev, c.build(dev, variant == "race"))], lambda: None
    if name.startswith("miniature:"):
        from nblib.engine import build

        model, buckets = _miniature()
        m = build.model(dev, model, index_dtype="bf16", overlap="on", logits_policy=name.split(":")[1])
        runner = Runner(m, buckets, "graph")
        runner.capture()
        return [g for gs in runner.graphs.values() for g in gs], lambda: None
    step = audit_target.load(name).fn(dev)
    g = dev.CUDAGraph()
    with dev.graph(g):
        step()
    return [g], getattr(step, "rewind", lambda: None)


def run_capture(dev, name):
    graphs, ready = capture(dev, name)
    for _ in range(REPLAYS):
        ready()
        for g in graphs:
            g.replay()
    dev.synchronize()
    return Cell(verdict="clean", detail=f"{len(graphs)} graph(s) captured, {REPLAYS} replays")


def run_audit(dev, name):
    from nblib.instruments.audit import target as audit_target
    from nblib.instruments.audit import zoo as audit_zoo
    from nblib.studies import overlap

    if name.startswith("zoo:"):
        case, variant = name[4:].split("/")
        row = audit_zoo.run_one(dev, next(c for c in audit_zoo.CASES if c.name == case), variant == "race")
        if row.reported == "error":
            return Cell(verdict="error", detail=(row.audit_error or "").splitlines()[0])
        return Cell(verdict="race" if row.hazards else "clean", detail=f"{row.hazards} hazard(s)")
    if name.startswith("miniature:"):
        model, buckets = _miniature()
        rep, _, _ = overlap.audit_model(dev, model, buckets, "bf16", "on", name.split(":")[1])
        return Cell(verdict="race" if rep.hazards else "clean", detail=rep.summary())
    rep = audit_target.audit(name, device=dev)
    if rep.status == "failed":
        return Cell(verdict="error", detail=rep.failure.message[:300])
    return Cell(verdict="race" if rep.hazards else "clean", detail=f"{len(rep.hazards)} hazard(s)")


def run_csan(dev, name):
    from torch.cuda._sanitizer import CUDASanitizerErrors

    try:
        cell = run_capture(dev, name)
    except Exception as e:  # CSAN raises inside the capture; capture_end may fail on top of it
        found = e
        while found is not None and not isinstance(found, CUDASanitizerErrors):
            found = found.__context__ or found.__cause__
        if found is None:
            raise
        first = str(found.errors[0]).splitlines() if found.errors else [""]
        kernels = [
            first[i + 1].split("(")[0] for i, x in enumerate(first[:-1]) if x.endswith("during kernel:")
        ]
        return Cell(verdict="race", detail=f"{len(found.errors)} error(s): {' vs '.join(kernels)}")
    return cell


def run_tcgd(dev, name):
    """torch-cudagraph-debug's eager-vs-graph differential on the step's output: a natural-timing
    check, so a race counts as caught only where a replay actually differs from eager."""
    import torch
    from torch.utils._pytree import tree_flatten

    from nblib.instruments.audit import target as audit_target

    if dev.name != "cuda":
        return Cell(verdict="not run", detail="torch-cudagraph-debug needs CUDA")
    if name.startswith(("zoo:", "miniature:")):
        return Cell(verdict="not run", detail="not a TARGET-contract step (no eager run of its own)")
    try:
        from torch_cudagraph_debug.tensor_debug import (
            RecordAction,
            TensorComparisonOptions,
            TensorProbe,
            compare_snapshots,
        )
    except ImportError as e:
        return Cell(verdict="not run", detail=f"torch-cudagraph-debug not importable: {e}")
    step = audit_target.load(name).fn(dev)
    rewind, stream = getattr(step, "rewind", lambda: None), torch.cuda.current_stream()

    def record(probe, out):  # TensorProbe takes one tensor: each tensor of the step's output
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for i, t in enumerate(tensors):
            probe(t, name=f"output{i}")

    eager = TensorProbe("eager", [RecordAction()], when="always")
    rewind()
    with dev.serial():  # the reference runs in host order: no overlap for a race to lose
        record(eager, step())
    want = eager.snapshot(synchronize=stream)
    probe = TensorProbe("graph", [RecordAction()])
    rewind()
    g = dev.CUDAGraph()
    with dev.graph(g):
        record(probe, step())
    options, differ = TensorComparisonOptions(), 0  # the tool's default: allclose, rtol 1e-5, atol 1e-8
    for _ in range(TCGD_REPLAYS):
        rewind()
        g.replay()
        differ += not compare_snapshots(want, probe.snapshot(synchronize=stream), options=options).ok
    del g  # the graph goes before the probe's captured resources
    probe.close(synchronize=False)
    eager.close()
    verdict = "race" if differ else "clean"
    return Cell(verdict=verdict, detail=f"{differ} of {TCGD_REPLAYS} natural replays differ from eager")


def child(tool, backend, names):
    """Each target in turn between start and end markers, so a sanitizer's lines (printed on the
    same stdout) fall between the markers of the target that caused them."""
    import warnings

    warnings.filterwarnings("ignore")  # CSAN is on by TORCH_CUDA_SANITIZER=1, from the parent
    from nblib.backends.device import get

    dev = get(backend)
    runner = {"audit": run_audit, "csan": run_csan, "tcgd": run_tcgd}.get(tool, run_capture)
    for name in names:
        print(MARK + json.dumps(dict(event="start", target=name)), flush=True)
        t0 = time.perf_counter()
        try:
            cell = runner(dev, name)
        except Exception as e:
            cell = Cell(verdict="error", detail=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
        dev.synchronize()
        cell.seconds = round(time.perf_counter() - t0, 2)
        print(MARK + json.dumps(dict(event="end", target=name, cell=cell.model_dump())), flush=True)


# ------------------------------------------------------------------------------------------------
# the parent: children, then the table
# ------------------------------------------------------------------------------------------------


def sanitizer_path():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for p in ("/usr/local/cuda/bin/compute-sanitizer", "/opt/nvidia/compute-sanitizer/compute-sanitizer"):
        if os.path.exists(p):
            return p
    return None


def jobs(tools, targets):
    """(tool, group, target names) per child: one target a child for audit and CSAN (a CSAN error
    aborts its capture), one group a child under compute-sanitizer (each start costs the most).
    compute-sanitizer's children first: they are the longest, the short ones fill in around them."""
    out = []
    for tool in sorted(tools, key=lambda t: t not in SANITIZERS):
        if tool in ("audit", "csan"):
            out += [(tool, t.group, [t.name]) for t in targets]
        else:
            for g in dict.fromkeys(t.group for t in targets):
                out.append((tool, g, [t.name for t in targets if t.group == g]))
    return out


def run_job(tool, group, names, backend, timeout=None):
    timeout = timeout or TIMEOUT[tool]
    res = ChildResult(tool=tool, group=group, targets=names)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--child", tool, backend, *names]
    if tool == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    if tool in SANITIZERS:
        exe = sanitizer_path()
        if exe is None:
            res.not_run = "compute-sanitizer not found on PATH, in /usr/local/cuda/bin or /opt/nvidia"
            return res
        if tool.endswith("-nocache"):
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        cmd = [exe, "--tool", tool.split("-")[0], "--report-api-errors", "no", *cmd]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False
        )
        res.returncode, res.stdout, res.stderr = p.returncode, p.stdout, p.stderr[-4000:]
    except subprocess.TimeoutExpired as e:
        res.timed_out = True
        res.stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        res.stderr = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "")[
            -4000:
        ]
    res.seconds = round(time.perf_counter() - t0, 1)
    return res


def _why(res):
    """The child's last words: the tool's own error line if it printed one, else stderr's last line."""
    lines = [x for x in (res.stdout + "\n" + res.stderr).splitlines() if x.strip() and not x.startswith(MARK)]
    errs = [x for x in lines if re.search(r"Error|error|Traceback|not supported|Killed", x)]
    return (errs or lines or [f"exit {res.returncode}, no output"])[-1].strip()[:300]


def cells_of(res):
    """{target: Cell} from one child's output."""
    if res.not_run:
        return {n: Cell(verdict="not run", detail=res.not_run) for n in res.targets}
    out, current, found = {}, None, []
    for line in res.stdout.splitlines():
        if line.startswith(MARK):
            m = json.loads(line[len(MARK) :])
            if m["event"] == "start":
                current, found = m["target"], []
            else:
                cell = Cell(**m["cell"])
                if res.tool in SANITIZERS and cell.verdict == "clean" and found:
                    cell = Cell(
                        verdict="race", detail=f"{len(found)} report(s): {found[0]}", seconds=cell.seconds
                    )
                out[m["target"]], current = cell, None
        elif current is not None and FINDING.match(line):
            found.append(line.strip("= ").strip()[:200])
    for n in res.targets:
        if n in out:
            continue
        if res.timed_out:
            out[n] = Cell(verdict="timeout", detail=f"the child ran past {TIMEOUT.get(res.tool, '?')} s")
        else:
            out[n] = Cell(
                verdict="error", detail=("at this target: " if n == current else "not reached: ") + _why(res)
            )
    return out


def summarise(tool, rows, results):
    cells = [(r.expect, r.cells[tool]) for r in rows if tool in r.cells]
    v = lambda want, verdict: sum(e == want and c.verdict == verdict for e, c in cells)
    return ToolSummary(
        tool=tool,
        caught=v("race", "race"),
        missed=v("race", "clean"),
        false_alarms=v("clean", "race"),
        errors=sum(c.verdict == "error" for _, c in cells),
        timeouts=sum(c.verdict == "timeout" for _, c in cells),
        not_run=sum(c.verdict == "not run" for _, c in cells),
        child_seconds=round(sum(r.seconds for r in results if r.tool == tool), 1),
    )


def build_table(targets, results, meta):
    """The table from the specs and the children's results (fake ones in the tests)."""
    tools = list(dict.fromkeys(r.tool for r in results))
    by_target = {t.name: {} for t in targets}
    for res in results:
        for name, cell in cells_of(res).items():
            by_target.setdefault(name, {})[res.tool] = cell
    rows = [
        AnchorRow(target=t.name, group=t.group, expect=t.expect, cells=by_target[t.name]) for t in targets
    ]
    return AnchorTable(
        meta=meta, tools=tools, rows=rows, summary=[summarise(x, rows, results) for x in tools]
    )


def markdown(table):
    from nblib.publish.show import markdown_table

    short = lambda c: c.verdict + (f" ({c.seconds:.1f} s)" if c.seconds is not None else "")
    rows = [
        dict(
            target=r.target,
            expect=r.expect or "-",
            **{t: short(r.cells[t]) if t in r.cells else "-" for t in table.tools},
        )
        for r in table.rows
    ]
    why = [
        f"- {r.target}, {t}: {c.verdict}: {c.detail}"
        for r in table.rows
        for t, c in r.cells.items()
        if c.verdict in ("error", "timeout", "not run") or (c.verdict == "race" and t != "audit")
    ]
    meta = ", ".join(f"{k} {v}" for k, v in table.meta.items())
    return "\n\n".join([
        "# Who catches what: the capture audit, CSAN, compute-sanitizer and torch-cudagraph-debug",
        f"Produced by `python scripts/gpu_audit_anchors.py` ({meta}).",
        "## Per tool", markdown_table([s.model_dump() for s in table.summary]),
        "## Per target (seconds: the target's work inside the child)", markdown_table(rows),
        "## What each tool said where it did not say clean", "\n".join(why) or "_(nothing)_",
    ])  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    ap.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    ap.add_argument("--workers", type=int, default=12, help="children side by side (one GPU, shared)")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    args = ap.parse_args(argv)
    import torch

    if args.backend == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this on the GPU machine (or --backend sim --tools audit)")
    if args.backend == "sim" and set(args.tools) != {"audit"}:
        raise SystemExit("--backend sim runs the audit only: pass --tools audit")
    from nblib.backends.device import get
    from nblib.core.results import environment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets = specs(args.groups)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda j: run_job(*j, args.backend), jobs(args.tools, targets)))
    meta = dict(
        **environment(get(args.backend)), seconds=round(time.perf_counter() - t0, 1), workers=args.workers
    )
    table = build_table(targets, results, meta)
    write_json(out / "anchors.json", json.loads(table.model_dump_json()))
    write_text(out / "README.md", markdown(table) + "\n")
    print(markdown(table))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
