"""python -m kernels --check | --bench | --sweep [--out DIR]: every kernel against its reference,
timed against torch and a device-to-device copy, and the logits kernel's launch-config sweep."""

import argparse

from kernels import logits, sweep
from kernels.harness import meta, write_table

BENCH_COLS = ["name", "us", "bytes", "gbps", "frac_copy_bw", "speedup_vs_torch"]
SWEEP_COLS = ["kind", "block_t", "tiles_per_prog", "num_warps", "num_stages", "us"]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernels", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare kernels with their references")
    p.add_argument("--bench", action="store_true", help="time kernels vs torch and a D2D copy")
    p.add_argument("--sweep", action="store_true", help="time the logits kernel's launch configs")
    p.add_argument("--out", default=None, help="folder for bench.{json,md} and sweep.{json,md}")
    a = p.parse_args(argv)
    if not (a.check or a.bench or a.sweep):
        p.error("nothing to do: pass --check, --bench and/or --sweep")
    if a.check:
        for c in logits.CHECK_CASES:
            print(c, logits.check(**c))
    if a.sweep:
        info = meta(shape=logits.BENCH_SHAPE)
        print(write_table(a.out, "sweep", info, sweep.sweep(), SWEEP_COLS))
    if a.bench:
        info = meta(shape=logits.BENCH_SHAPE, bf16_config=logits.BF16_CONFIG, fp8_config=logits.FP8_CONFIG)
        print(write_table(a.out, "bench", info, logits.benchmark(), BENCH_COLS))


if __name__ == "__main__":
    main()
