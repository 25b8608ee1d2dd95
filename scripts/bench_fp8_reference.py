"""The simulator's fp8 conversion (kernels.logits.e4m3_to, a 256-entry table) against torch's own
(.view(float8_e4m3fn).to(bf16)), on the value bytes ref_logits_fp8 gathers at the sim profile's
largest bucket:

    python scripts/bench_fp8_reference.py [--bs 40] [--pages 25] [--repeat 15]

Prints the median milliseconds of each and their ratio; the two give the same bits for every byte
(tests/test_logits_reference.py)."""

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import logits as lg  # noqa: E402
from kernels.paged import PAGE, fp8_page_bytes  # noqa: E402


def median_ms(fn, repeat):
    fn()  # warm: the first call pays for allocation and dispatch set-up
    return 1e3 * statistics.median(timeit.repeat(fn, number=1, repeat=repeat))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=40)
    ap.add_argument("--pages", type=int, default=25, help="pages a request (25: the sim's 1600 entries)")
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    dim = 128
    g = torch.randint(0, 256, (a.bs, a.pages, fp8_page_bytes(dim)), dtype=torch.uint8)
    raw = g[..., : PAGE * dim]  # the value bytes, strided past each page's scales
    table = median_ms(lambda: lg.e4m3_to(raw, torch.bfloat16), a.repeat)
    torch_ms = median_ms(lambda: raw.view(torch.float8_e4m3fn).to(torch.bfloat16), a.repeat)
    print(
        f"{raw.numel()} e4m3 values to bf16: the table {table:.2f} ms, torch's conversion {torch_ms:.2f} ms "
        f"({torch_ms / table:.2f}x)"
    )


if __name__ == "__main__":
    main()
