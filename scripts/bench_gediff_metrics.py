"""The differential's figures on the CPU (nblib.instruments.gediff.metrics) against the same figures
over every column of every row, on the sim profile's logits width (131072 columns, bs 40, live
entries in the first 1600): a clean step, and a step whose lost race filled 5 rows with garbage.

    python scripts/bench_gediff_metrics.py [--repeat 10]

Prints the median milliseconds of each; both give the same figures (tests/test_gediff.py)."""

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_gediff import _full_width_metrics  # noqa: E402

from nblib.instruments import gediff  # noqa: E402


def median_ms(fn, repeat):
    fn()  # warm: the first call pays for allocation and dispatch set-up
    return 1e3 * statistics.median(timeit.repeat(fn, number=1, repeat=repeat))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    eager = torch.full((40, 131072), float("-inf"))
    eager[:, :1600] = torch.randn(40, 1600, generator=gen)
    lost = eager.clone()
    lost[3:8] = torch.randn(5, 131072, generator=gen)
    for name, graph in (("clean", eager.clone()), ("5 garbage rows", lost)):
        assert gediff.metrics(graph, eager, 16) == _full_width_metrics(graph, eager, 16)
        rows = median_ms(lambda g=graph: gediff.metrics(g, eager, 16), a.repeat)
        whole = median_ms(lambda g=graph: _full_width_metrics(g, eager, 16), a.repeat)
        print(f"{name}: each row's live prefix {rows:.1f} ms, every column {whole:.1f} ms", end="")
        print(f" ({whole / rows:.1f}x)")


if __name__ == "__main__":
    main()
