"""The simulator's fp8 conversion (kernels.e4m3.e4m3_to: a table of the 65,536 byte pairs) against
its 256-entry byte table and torch's own (.view(float8_e4m3fn).to(bf16)), on the value bytes
ref_logits_fp8 gathers (bs requests of --pages pages), on one CPU thread as the simulator runs:

    python scripts/bench_fp8_reference.py [--bs 40 24 8 1] [--pages 25] [--rounds 15] [--threads 1]

The three run in turn, round after round in alternating order, so a machine whose load drifts
(another process, the allocator's page faults on large temporaries) weighs on each alike. Prints
each one's median milliseconds per batch size and the ratios; all three give the same bits for
every byte and every pair (tests/test_logits_reference.py)."""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import e4m3  # noqa: E402
from kernels.paged import PAGE, fp8_page_bytes  # noqa: E402


def byte_table(raw):
    return e4m3._e4m3_table(torch.bfloat16).index_select(0, raw.reshape(-1).int()).view(raw.shape)


WAYS = {
    "pair table": lambda raw: e4m3.e4m3_to(raw, torch.bfloat16),
    "byte table": byte_table,
    "torch": lambda raw: raw.view(torch.float8_e4m3fn).to(torch.bfloat16),
}


def medians_ms(raw, rounds):
    seconds = {name: [] for name in WAYS}
    for r in range(rounds):
        for name in WAYS if r % 2 else reversed(WAYS):
            t0 = time.perf_counter()
            WAYS[name](raw)
            seconds[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(s) for name, s in seconds.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, nargs="+", default=[40, 24, 8, 1])
    ap.add_argument("--pages", type=int, default=25, help="pages a request (25: the sim's 1600 entries)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads (the simulator runs one)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for bs in a.bs:
        g = torch.randint(0, 256, (bs, a.pages, fp8_page_bytes(128)), dtype=torch.uint8)
        raw = g[..., : PAGE * 128]  # the value bytes, strided past each page's scales
        WAYS["pair table"](raw)  # the pair table is built on first use
        ms = medians_ms(raw, a.rounds)
        pair = ms["pair table"]
        print(
            f"bs {bs}, {raw.numel()} values, {a.threads} thread(s): pair table {pair:.2f} ms, "
            f"byte table {ms['byte table']:.2f} ms ({ms['byte table'] / pair:.2f}x), "
            f"torch {ms['torch']:.2f} ms ({ms['torch'] / pair:.2f}x)"
        )


if __name__ == "__main__":
    main()
