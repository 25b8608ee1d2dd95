"""`--confirm` across the audit's zoo and the example targets, on one backend.

Usage: python scripts/confirm_table.py OUTDIR [--backend sim|cuda] [--replays 20]
Each zoo case (its planted race and its twin; the shared-pool case captures twice and is left out),
each example target under examples/audit/ and each form of the field's bugs (examples/field/cases.py)
is built on a fresh device facade, audited, and confirmed
with `--replays` forced replays per schedule (nblib.instruments.audit.confirm). Writes OUTDIR/confirm.json
and OUTDIR/table.md (with the commit: $NBLIB_COMMIT, else HEAD) and prints the table. Exit 0 when every
racy form has every hazard confirmed (but the zoo case whose readers' results are discarded, which must
have none), every clean form stays equal to eager under every forced order, and a field form whose
capture is expected to fail fails; 1 otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from field_table import load_cases  # noqa: E402  (scripts/, the script's own folder)

from nblib.backends import device  # noqa: E402
from nblib.core.files import write_text  # noqa: E402
from nblib.instruments.audit import confirm as audit_confirm  # noqa: E402
from nblib.instruments.audit import target as audit_target  # noqa: E402
from nblib.instruments.audit.zoo import CASES  # noqa: E402
from nblib.studies.engines import in_repository  # noqa: E402

HARMLESS = {"fan_in_partial_wait"}  # its readers' results are discarded: no value depends on the order
TARGETS = [
    *(
        f"examples/audit/decode_step.py:{f}"
        for f in ("racy", "join_before_free", "record_stream", "persistent_buffer")
    ),
    *(f"examples/audit/dsv4_attention.py:{f}" for f in ("fused", "unfused")),
    *(
        f"examples/audit/hf_moe.py:{m}{f}"
        for m in ("qwen2_moe", "deepseek_v3")
        for f in ("", "_record_stream", "_hold_until_join")
    ),
]


def field_targets():
    """(target, whether its capture is expected to fail) for each form of examples/field/cases.py."""
    return [(f.target, f.expect.status == "failed") for c in load_cases().CASES for f in c.forms]


def row(name, build, backend, replays, harmless=False, fails=False):
    dev = device.get(backend)
    t0 = time.perf_counter()
    step = build(dev)
    rep = audit_target.audit_step(step, dev, target=name)
    if rep.status == "failed" or fails:
        failure = rep.failure.message if rep.failure else None
        return dict(target=name, status=rep.status, right=fails == (rep.status == "failed"), failure=failure)
    c = audit_confirm.confirm(step, dev, rep, replays=replays)
    checks = list({k.delayed: k for k in c.hazards}.values()) or c.branches
    confirmed = sum(k.confirmed for k in c.hazards)
    if c.eager_differs is not None:
        right = True  # undecided, and said so: a step whose eager runs differ confirms nothing
    elif rep.hazards:
        right = confirmed == 0 if harmless else confirmed == len(c.hazards)
    else:
        right = all(not k.confirmed for k in c.branches)
    return dict(
        target=name,
        status=rep.status if c.eager_differs is None else f"{rep.status}, undecided: eager runs differ",
        hazards=len(rep.hazards),
        confirmed=confirmed,
        forced=f"{sum(k.differing for k in checks)}/{sum(k.replays for k in checks)}",
        natural=f"{c.natural.differing}/{c.natural.replays}",
        seconds=round(time.perf_counter() - t0, 2),
        right=right,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--backend", default="sim", choices=("sim", "cuda"))
    ap.add_argument("--replays", type=int, default=20)
    a = ap.parse_args()
    if a.replays < 1:
        sys.exit(f"--replays must be at least 1, got {a.replays}")
    commit = (
        os.environ.get("NBLIB_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    rows = []
    for c in CASES:
        if c.name == "shared_pool_two_captures":
            continue
        for racy in (True, False):
            name = f"zoo:{c.name}:{'race' if racy else 'twin'}"
            rows.append(row(name, lambda dev, c=c, r=racy: c.build(dev, r)[0], a.backend, a.replays,
                            harmless=racy and c.name in HARMLESS))  # fmt: skip
    for t in TARGETS:
        rows.append(row(t, audit_target.load(in_repository(t)).fn, a.backend, a.replays))
    for t, fails in field_targets():
        rows.append(row(t, audit_target.load(in_repository(t)).fn, a.backend, a.replays, fails=fails))
    out = Path(a.out)
    where = device.gpu_name() if a.backend == "cuda" else "the CPU simulator"
    result = dict(commit=commit, backend=a.backend, device=where, replays=a.replays, rows=rows)
    write_text(out / "confirm.json", json.dumps(result, indent=1))
    cols = ["target", "status", "hazards", "confirmed", "forced", "natural", "seconds", "right"]
    lines = [
        f"# `--confirm` on the zoo, the example targets and the field's bugs, {a.backend} ({where}), "
        f"{a.replays} replays, at {commit}",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
        *("| " + " | ".join(str(r.get(k, "-")) for k in cols) + " |" for r in rows),
    ]
    write_text(out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(r["right"] for r in rows) else 1)


if __name__ == "__main__":
    main()
