"""The fp8 logits kernel's waves at the benchmark's shape (B 32, L 65536, D 128): the same
config with the work split into a different number of programs, as graph replays after a clean
L2 flush (kernels.harness.median_us). per_request P gives each request P programs, each walking
its share of the row (kernels.logits.plan), so the grid holds 32 * P programs; the default
(per_request 0) splits each row into 1024 / tiles_per_prog chunks. With the compiled kernel's
CTAs per SM (the compile table, outputs/bench/compile_sm90.md: 8 for the default on sm_90a), the
number of waves is the programs over 8 x the SMs: does the fixed part of the kernel's time
(about 4.6 us beside its rate) come from the last wave's tail?

    python scripts/gpu_fp8_waves.py        the table (stdout)
"""

import sys

import torch

from kernels.harness import copy_row, median_us, project_commit
from kernels.logits import indexer_logits_fp8_
from kernels.logits_bench import bench_inputs, logit_bytes
from kernels.logits_configs import config_for
from nblib.core import tables

if not torch.cuda.is_available():
    sys.exit("gpu_fp8_waves.py: needs a CUDA GPU")

BS, CTX, HEADS, DIM, CTAS_PER_SM = 32, 65536, 64, 128, 8
ARCH = torch.cuda.get_device_capability()[0] * 10
BASE = config_for("fp8", ARCH)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
TILES = CTX // BASE.block_t
copy = copy_row()
print(f"commit {project_commit()}, {torch.cuda.get_device_name()}, python scripts/gpu_fp8_waves.py")
print(f"copy: {copy['gbps']:.0f} GB/s; {SMS} SMs, {CTAS_PER_SM} CTAs an SM: {SMS * CTAS_PER_SM} at once")
print(tables.head(("split", "programs", "tiles a program", "waves", "us", "frac_copy_bw")))
x = bench_inputs(BS, CTX, HEADS, DIM, "cuda")
args = (x["q8"], x["w"], x["pages"], x["page_table"], x["seq_lens"], x["out"])
want = None
for per_request in (0, 8, 16, 24, 31, 32, 33, 48, 64, 96):
    tiles = -(-TILES // per_request) if per_request else BASE.tiles_per_prog
    programs = BS * -(-TILES // tiles)

    def fn(per_request=per_request):
        indexer_logits_fp8_(*args, per_request=per_request)

    fn()
    got = x["out"].clone()
    want = got if want is None else want
    assert torch.equal(got, want), f"per_request {per_request}: other logits than the default's"
    us = median_us(fn)
    frac = logit_bytes(BS, CTX, HEADS, DIM, True) / us * 1e-3 / copy["gbps"]
    name = f"per_request {per_request}" if per_request else "default"
    waves = programs / (SMS * CTAS_PER_SM)
    print(tables.line((name, programs, tiles, f"{waves:.2f}", f"{us:.1f}", f"{frac:.3f}")))
