"""Where the fp8 logits kernel's time goes, at the benchmark's shape (B 32, L 65536, D 128), by
timing variants that each leave one cost out, as graph replays (kernels.harness.median_us):

  heads 64 | 16      the dot and the epilogue (relu, weights, head sum) at a quarter of the work:
                     if 16 heads runs no faster, the kernel is waiting on memory, not on math
  pages shuffled | in order
                     the page table a permutation (the benchmark's) or 0, 1, 2, ...: address
                     translation and DRAM locality on scattered 8 KB pages
  the scales' load in the tile's iteration (scale_load "ptr") or a tile ahead ("prefetch")
  batch 32 | 64 | 128, after each L2 flush (kernels.harness.FLUSHES), beside a copy of the same
                     bytes: what each further 32 requests cost (the loop's rate) and what is fixed

  python scripts/gpu_fp8_probe.py            the table (stdout)
  python scripts/gpu_fp8_probe.py --once     one launch of each variant, for ncu to profile
"""

import sys

import torch

from kernels.harness import FLUSHES, copy_row, flushing, median_us
from kernels.logits import indexer_logits_fp8_
from kernels.logits_bench import bench_inputs, logit_bytes
from kernels.logits_configs import config_for
from nblib.core import tables

if not torch.cuda.is_available():
    sys.exit("gpu_fp8_probe.py: needs a CUDA GPU")

BS, CTX, DIM = 32, 65536, 128
ARCH = torch.cuda.get_device_capability()[0] * 10
BASE = config_for("fp8", ARCH)
CONFIGS = {  # the default (kernels.logits_configs) and one change each
    "default": BASE,
    "scales_in_iteration": BASE._replace(scale_load="ptr"),
    "stages4": BASE._replace(num_stages=4),
    "stages5": BASE._replace(num_stages=5),
    "tiles8": BASE._replace(tiles_per_prog=8),
}
EVERYWHERE = ("default", "scales_in_iteration")  # also at 16 heads and pages in order
once = "--once" in sys.argv
copy = None if once else copy_row()
if copy:
    print(f"copy: {copy['gbps']:.0f} GB/s")
print(tables.head(("variant", "heads", "pages", "us", "frac_copy_bw")))  # rows printed as they are timed
for heads in (64, 16):
    x = bench_inputs(BS, CTX, heads, DIM, "cuda")
    shuffled = x["page_table"]
    ordered = torch.arange(shuffled.numel(), device="cuda", dtype=torch.int32).view_as(shuffled)
    for pages, pt in (("shuffled", shuffled), ("in order", ordered)):
        for name, cfg in CONFIGS.items():
            if (heads != 64 or pages != "shuffled") and name not in EVERYWHERE:
                continue
            args = (x["q8"], x["w"], x["pages"], pt, x["seq_lens"], x["out"])

            def fn(args=args, cfg=cfg):
                indexer_logits_fp8_(*args, config=cfg)

            if once:
                fn()
                torch.cuda.synchronize()
                continue
            us = median_us(fn)
            frac = logit_bytes(BS, CTX, heads, DIM, True) / us * 1e-3 / copy["gbps"]
            print(tables.line((f"{name} {tuple(cfg)[:4]}", heads, pages, f"{us:.1f}", f"{frac:.3f}")))

if not once:  # the loop's rate and the fixed part: each 32 more requests, against a copy's
    print()
    print(tables.head(("batch", "flush", "us", "us per 32 more requests", "copy of the same bytes, us")))
    last = {}
    for bs in (32, 64, 128):
        x = bench_inputs(bs, CTX, 64, DIM, "cuda")
        nbytes = logit_bytes(bs, CTX, 64, DIM, True)
        args = (x["q8"], x["w"], x["pages"], x["page_table"], x["seq_lens"], x["out"])
        for flush in FLUSHES:
            us = median_us(lambda args=args: indexer_logits_fp8_(*args), flush=flush)
            with flushing(flush):
                copy_us = copy_row(nbytes // 2)["us"]  # the yardstick, reading half and writing half
            more = "" if flush not in last else f"{(us - last[flush][1]) / ((bs - last[flush][0]) / 32):.1f}"
            last[flush] = (bs, us)
            print(tables.line((bs, flush, f"{us:.1f}", more, f"{copy_us:.1f}")))
        del x
