"""What raises the simulator's rate under the copying designs of notebook 02: their copies' bytes, or
the side-stream kernels themselves?

Usage: python scripts/sim_copy_probe.py OUTDIR [--designs campaign main_stash] [--runs 5] [--seed 0]

On params/sim.yaml (bf16, overlap on, transient logits), the protocol of `--runs` runs from `--seed`
for the arm without instrument and for each design three ways: as the timing model has it; with the
design's side-stream clones moving no bytes (each still a kernel node's launch latency); and with those
clones taking no time at all (Timing.free_side_ops, a counterfactual the suite never uses). The values
are copied in every case: only when the top-k runs moves. Writes OUTDIR/results.json (with the commit)
and OUTDIR/README.md, and prints the table; about a minute a row on a 2-core CPU.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nblib.backends import device  # noqa: E402
from nblib.core import stats  # noqa: E402
from nblib.core.files import write_text  # noqa: E402
from nblib.instruments.gediff import DESIGNS  # noqa: E402
from nblib.schema import params as P  # noqa: E402
from nblib.studies import designs, protocol  # noqa: E402

CLONES = ("aten.clone.default", "aten.copy_.default")
KNOBS = dict(index_dtype="bf16", overlap="on", logits_policy="transient")


def run(prof, arm, variant, seeds):
    dev = device.get("sim")
    if variant == "bytes free":
        dev.timing = dataclasses.replace(dev.timing, free_side_ops=CLONES, free_side_bytes=True)
    elif variant == "clones free":
        dev.timing = dataclasses.replace(dev.timing, free_side_ops=CLONES)
    w = {**prof["workload"], "seed": seeds[0]}
    proto = designs.run_arm(dev, prof["model"], prof["buckets"], w, arm, seeds, KNOBS, 3, None, 2048)[0]
    return proto.pooled.corrupted_sessions, proto.pooled.sessions


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--designs", nargs="+", default=["campaign", "main_stash"], choices=DESIGNS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    prof = P.load(ROOT / "params" / "sim.yaml")
    seeds = protocol.seeds(a.seed, a.runs)
    commit = (
        os.environ.get("NBLIB_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    off = run(prof, "off", "as is", seeds)
    rows = [dict(arm="off", timing="as is", corrupted=off[0], sessions=off[1], fisher_p=None)]
    for d in a.designs:
        for variant in ("as is", "bytes free", "clones free"):
            k, n = run(prof, d, variant, seeds)
            p = stats.fisher(k, n, *off)["p"]
            rows.append(dict(arm=d, timing=variant, corrupted=k, sessions=n, fisher_p=p))
            print(rows[-1], flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    write_text(a.out / "results.json", json.dumps(dict(commit=commit, seeds=seeds, rows=rows), indent=1))
    lines = [
        f"# The copying designs' side-stream kernels on the simulator, at {commit}",
        "",
        f"`python scripts/sim_copy_probe.py OUTDIR --runs {a.runs} --seed {a.seed}` (params/sim.yaml)",
        "",
        "| arm | timing | corrupted sessions | Fisher p against off |",
        "|---|---|---|---|",
    ]
    for r in rows:
        p = "-" if r["fisher_p"] is None else f"{r['fisher_p']:.2g}"
        lines.append(f"| {r['arm']} | {r['timing']} | {r['corrupted']}/{r['sessions']} | {p} |")
    write_text(a.out / "README.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
