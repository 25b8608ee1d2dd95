"""The capture audit on CUDA, in one command (about 1-2 minutes on an H200):

  1. the root cause of the broken captures, each half in a fresh process: a graph captured while
     torch first imports torch._dynamo under a dispatch mode (what the old recorder did) outlives
     its last reference, and a collection inside a later capture destroys it there; then the same
     with the fixed recorder;
  2. the zoo (nblib.instruments.audit.zoo), every scenario captured plainly and audited in this one
     process, each audited graph read back through the driver and cross-checked with the audit;
  3. the decode model audited after all those captures, in the same process;
  4. the parity cases (nblib.instruments.audit.parity) in a child process, restarted after a case
     that leaves the process unable to capture; the simulator's column beside CUDA's.

Usage: python scripts/gpu_audit_zoo.py OUTDIR [--backend sim]
(--backend sim runs the same on the CPU simulator: a dry run of this script, used by the tests.)
Writes OUTDIR/results.json (meta, summary, one row per zoo scenario with expected and reported
verdicts and the cross-check, the parity table, the root cause, the model audit) and OUTDIR/README.md.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from nblib.core import tables  # noqa: E402
from nblib.core.results import environment, write_json  # noqa: E402

CHILD_TIMEOUT = 150  # seconds per child process


# ------------------------------------------------------------------------------------------------
# children (fresh processes)
# ------------------------------------------------------------------------------------------------


def child_rootcause(backend, fixed):
    """A graph captured at the first op under a dispatch mode; dropped; then a capture in which the
    collector runs. fixed=False: a bare dispatch mode (the old recorder's situation); True: the
    recorder as it is now (audit_capture)."""
    import gc
    import warnings
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from nblib.backends.device import get
    from nblib.instruments import audit

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    out = dict(fixed=fixed, dynamo_imported_before=("torch._dynamo" in sys.modules))
    gc.disable()
    dev = get(backend)
    x = torch.ones(1 << 16, device=dev.torch_device)
    dev.synchronize()

    def first():
        if fixed:
            return weakref.ref(audit.audit_capture(lambda: x * 2, device=dev).graph)
        g = dev.CUDAGraph()
        with dev.graph(g), Passthrough():
            x * 2
        return weakref.ref(g)

    try:
        ref = first()
    except Exception as e:
        out["first_capture"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        print(json.dumps(out), flush=True)
        return
    out["first_capture"] = "ok"
    out["graph_outlived_its_references"] = ref() is not None
    gc.enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            g2 = dev.CUDAGraph()
            with dev.graph(g2):
                z = x + 1
                gc.collect()  # the collector runs inside this capture
                z = z * 2
            g2.replay()
            dev.synchronize()
            out["later_capture"] = "ok" if torch.equal(z, (x + 1) * 2) else "wrong result"
        except Exception as e:
            out["later_capture"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    out["warnings"] = [str(w.message).splitlines()[0] for w in caught]
    print(json.dumps(out), flush=True)


def child_parity(backend, start):
    """Parity cases from index `start`; one JSON line per case; exit 3 after a case that leaves the
    process unable to capture (the parent restarts from the next case)."""
    from nblib.backends.device import get
    from nblib.instruments.audit import parity as audit_parity

    dev = get(backend)
    for i, c in enumerate(audit_parity.CASES[start:], start):
        row = audit_parity.run_one(dev, c)
        print(json.dumps(dict(index=i, **row.__dict__)), flush=True)
        if not row.captures_again:
            sys.exit(3)


def run_child(backend, args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--child", backend, *args],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            cwd=ROOT,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        return [], f"timed out after {CHILD_TIMEOUT} s", (e.stderr or b"")[-2000:]
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return lines, p.returncode, p.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# the parent
# ------------------------------------------------------------------------------------------------


def rootcause(backend):
    out = {}
    for fixed in (False, True):
        lines, rc, err = run_child(backend, ["rootcause", str(int(fixed))])
        out["with the recorder fixed" if fixed else "before the fix"] = (
            lines[-1] if lines else dict(failed=f"exit {rc}", stderr=err)
        )
    return out


def zoo(dev):
    from nblib.instruments.audit import zoo as audit_zoo

    t0 = time.perf_counter()
    rows = audit_zoo.run(dev, keep_graph=True)
    out = []
    for r in rows:
        d = r.as_dict()
        checks = audit_zoo.graph_check(r)
        d["graph_check"] = checks
        d["graph_agrees"] = bool(checks) and all(c.get("agree") for c in checks)
        out.append(d)
    return out, audit_zoo.summary(rows), time.perf_counter() - t0


def model_audit(dev):
    """The decode model's configurations audited after everything above, in the same process, and
    each audited capture read back and cross-checked with the graph as built (studies.overlap)."""
    from nblib.studies import overlap

    tiny = dict(heads=4, dim=32, topk=16, max_ctx=1024, d_model=256, ffn=1024, num_pages=64, vocab=512)
    tiny.update(trunk_layers=2, trunk_width=256, indexer_programs=1)
    rows = []
    for dtype, policy in (
        ("bf16", "transient"),
        ("bf16", "record_stream"),
        ("bf16", "persistent"),
        ("fp8", "transient"),
    ):
        row = dict(index_dtype=dtype, overlap="on", logits_policy=policy)
        try:
            rep, runner, _ = overlap.audit_model(dev, tiny, [2, 8], dtype, "on", policy, keep_graph=True)
            graph = overlap.graph_rows(rep, runner, {})
            row.update(captured=len(rep.traces), incomplete=rep.incomplete, hazards=len(rep.hazards))
            row.update(graph=graph, graph_agrees=bool(graph) and all(g.get("agree") for g in graph))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        rows.append(row)
    return rows


def parity(backend):
    from nblib.backends.sim import SimDevice
    from nblib.instruments.audit import parity as audit_parity

    cuda_rows, start, restarts = [], 0, []
    while start < len(audit_parity.CASES):
        lines, rc, err = run_child(backend, ["parity", str(start)])
        cuda_rows += [audit_parity.ParityRow(**{k: v for k, v in x.items() if k != "index"}) for x in lines]
        done = lines[-1]["index"] + 1 if lines else start
        if rc != 0:
            restarts.append(
                dict(after=audit_parity.CASES[done - 1].name if lines else None, exit=rc, stderr=err[-500:])
            )
        if not lines and rc != 0:  # the case at `start` killed the child before it could answer
            c = audit_parity.CASES[start]
            cuda_rows.append(
                audit_parity.ParityRow(
                    case=c.name,
                    rule=c.rule,
                    backend=backend,
                    outcome="crash",
                    error=f"exit {rc}",
                    warnings=str(err)[-300:],
                    captures_again=False,
                )
            )
            done = start + 1
        start = done
    sim_rows = audit_parity.run(SimDevice())
    return audit_parity.table(sim_rows, cuda_rows), restarts


def md_table(header, rows):
    return tables.markdown(header, rows).split("\n")


def markdown(res):
    s, m = res["summary"], res["meta"]
    lines = [
        "# The capture audit on CUDA",
        "",
        f"{m.get('device')}, torch {m.get('torch')}, driver {m.get('cuda_driver')}, "
        f"commit {m.get('commit')}.",
        f"Zoo: {s['right']}/{s['scenarios']} verdicts right ({s['races']} planted races), "
        f"{s['false_alarms']} false alarms, {s['captures_broken_by_the_audit']} captures broken by the "
        "audit; "
        f"the graph cross-check agrees on {s['graph_agrees']}/{s['scenarios']}.",
        "",
    ]
    zoo_rows = [
        (
            r["case"],
            r["variant"],
            r["expected"],
            r["reported"],
            ", ".join(r["kinds"]),
            r["graph_agrees"],
            (r["plain_error"] or r["audit_error"] or "").split("\n")[0][:80],
        )
        for r in res["zoo"]
    ]
    lines += md_table(("case", "variant", "expected", "reported", "kinds", "graph agrees", "error"), zoo_rows)
    parity_rows = [
        (
            r["rule"],
            r["case"],
            r["cuda"][:90],
            r["cuda_rule"],
            r["sim_rule"],
            "documented difference" if r["documented_difference"] and not r["same"] else r["same"],
            r["cuda_reports"],
            r["as_documented"],
            r["cuda_captures_again"],
        )
        for r in res["parity"]
    ]
    lines += ["", "## Parity", ""]
    lines += md_table(
        (
            "rule",
            "case",
            "CUDA",
            "CUDA rule",
            "sim rule",
            "same",
            "CUDA reports it",
            "as the rules say",
            "CUDA captures again",
        ),
        parity_rows,
    )
    notes = sorted(
        {(r["rule"], r["documented_difference"]) for r in res["parity"] if r["documented_difference"]}
    )
    lines += ["", *(f"- {rule}: {text}" for rule, text in notes)]
    lines += ["", "## Root cause", "", "```", json.dumps(res["rootcause"], indent=1), "```", ""]
    return "\n".join(lines)


def driver_version():
    try:
        v = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
        return f"{v.value // 1000}.{v.value % 1000 // 10}"
    except OSError:
        return None


def write_text(path, text):
    """Atomically, like write_json."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(outdir, backend):
    from nblib.backends.device import get

    t0 = time.perf_counter()
    out = Path(outdir)
    dev = get(backend)
    res = dict(meta=dict(environment(dev), cuda_driver=driver_version(), cuda_runtime=torch.version.cuda))
    print("root cause ...", flush=True)
    res["rootcause"] = rootcause(backend)
    print("zoo ...", flush=True)
    res["zoo"], res["summary"], zoo_s = zoo(dev)
    res["summary"]["graph_agrees"] = sum(r["graph_agrees"] for r in res["zoo"])
    res["summary"]["zoo_seconds"] = round(zoo_s, 1)
    print(json.dumps(res["summary"]), flush=True)
    print("model audit ...", flush=True)
    try:
        res["model_audit"] = model_audit(dev)
    except Exception:
        res["model_audit"] = dict(error=traceback.format_exc(limit=-4))
    print("parity ...", flush=True)
    res["parity"], res["parity_restarts"] = parity(backend)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(out / "results.json", res)
    write_text(out / "README.md", markdown(res))
    print(f"wrote {out}/results.json in {res['seconds']} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        backend, kind, arg = sys.argv[2:]
        if kind == "rootcause":
            child_rootcause(backend, bool(int(arg)))
        else:
            child_parity(backend, int(arg))
        sys.exit(0)
    ap = argparse.ArgumentParser(description="The capture audit on CUDA: root cause, zoo, model, parity.")
    ap.add_argument("outdir")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "sim"])
    a = ap.parse_args()
    if a.backend == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run this on the H200, or pass --backend sim for a dry run on the CPU")
    main(a.outdir, a.backend)
