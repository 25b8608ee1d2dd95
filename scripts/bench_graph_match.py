"""Time the graph matcher (nblib.instruments.audit.graph_match.match) against its plain-Python reference
(tests/graph_match_reference.py) on a synthetic CUDA-sized capture (tests/graph_match_cases.py), check
that both give the same Match, and print both times and their ratio.

    python scripts/bench_graph_match.py [--ops 170] [--seed 4] [--repeat 3]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the checkout the script is run from
sys.path.insert(0, str(Path.cwd() / "tests"))

import graph_match_reference as reference  # noqa: E402
from graph_match_cases import CUDA_RUNS, random_case  # noqa: E402

from nblib.instruments.audit import graph_match  # noqa: E402


def best_of(fn, args, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=170)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=4)
    a = ap.parse_args()
    ops, raw = random_case(a.seed, m=a.ops, runs=CUDA_RUNS)
    old, want = best_of(reference.match, (ops, raw), a.repeat)
    new, got = best_of(graph_match.match, (ops, raw), a.repeat)
    print(f"{len(ops)} ops, {len(raw.nodes)} nodes, {len(raw.edges)} edges")
    print(f"reference {old:.3f} s, numpy {new:.4f} s, {old / new:.0f}x faster, same match: {got == want}")
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
