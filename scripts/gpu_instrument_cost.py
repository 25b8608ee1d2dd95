"""What the canary and the differential cost per replay on this GPU, as notebook 02 measures it
(nblib.instruments.overhead.replay_times on the profile's model at its largest bucket), without
running the notebook's sessions: a quick check after an instrument changes.
  python scripts/gpu_instrument_cost.py OUTDIR [--params params/gpu.yaml] [--replays 50]
writes OUTDIR/instrument_cost.json (the rows, the commit, device and versions)."""

import argparse
import json
import sys
from pathlib import Path

from kernels.harness import meta, write_atomic
from nblib.backends import device
from nblib.instruments import overhead
from nblib.schema import params as P


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--params", default=str(P.ROOT / "params" / "gpu.yaml"))
    ap.add_argument("--replays", type=int, default=50)
    a = ap.parse_args(argv)
    try:
        prof = P.load(a.params)  # a bad profile fails here, in one line
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"gpu_instrument_cost.py: {e}")
    if not device.has_cuda():
        sys.exit("gpu_instrument_cost.py: needs a CUDA GPU (notebook 02 measures the simulator's)")
    dev = device.get("cuda")
    rows = overhead.replay_times(
        dev,
        prof["model"],
        max(prof["buckets"]),
        a.replays,
        logits_policy="transient",
        seed=prof["seed"],
    )
    for r in rows:
        print(f"{r['instrument']:14s} {r['median_ms']:.3f} ms  x{r['ratio'] or 1:.2f}  ({r['method']})")
    out = Path(a.out) / "instrument_cost.json"
    info = meta(profile=Path(a.params).name)
    write_atomic(out, json.dumps(dict(meta=info, rows=rows), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
