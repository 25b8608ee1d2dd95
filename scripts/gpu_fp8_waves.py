"""The fp8 logits kernel's waves at the benchmark's shape (B 32, L 65536, D 128): the same
config with the work split into a different number of programs, as graph replays after a clean
L2 flush (kernels.harness.median_us). per_request P gives each request P programs, each walking
its share of the row (kernels.logits.plan), so the grid holds 32 * P programs; the default
(per_request 0) splits each row into chunks of tiles_per_prog tiles. The programs and tiles come
from the kernel's own plan (kernels.logits.plan_fp8), the CTAs an SM holds from the compiled
kernel's registers and shared memory (kernels.compile_check.ctas_per_sm), and the waves are the
programs over that many times the SMs: does the fixed part of the kernel's time (about 4.6 us
beside its rate) come from the last wave's tail?

    python scripts/gpu_fp8_waves.py        the table (stdout)
"""

import math
import sys

import torch

from kernels.compile_check import ctas_per_sm
from kernels.harness import copy_row, median_us, project_commit
from kernels.launch import run, target_of
from kernels.logits import plan_fp8
from kernels.logits_bench import bench_inputs, logit_bytes
from nblib.core import tables

if not torch.cuda.is_available():
    sys.exit("gpu_fp8_waves.py: needs a CUDA GPU")

BS, CTX, HEADS, DIM = 32, 65536, 64, 128
target = target_of(torch.device("cuda"))
copy = copy_row()
print(f"commit {project_commit()}, {target.name}, python scripts/gpu_fp8_waves.py")
print(f"copy: {copy['gbps']:.0f} GB/s; {target.sms} SMs")
print(tables.head(("split", "programs", "tiles a program", "CTAs an SM", "waves", "us", "frac_copy_bw")))
x = bench_inputs(BS, CTX, HEADS, DIM, "cuda")
args = (x["q8"], x["w"], x["pages"], x["page_table"], x["seq_lens"], x["out"])
want = None
for per_request in (0, 8, 16, 24, 31, 32, 33, 48, 64, 96):
    launch = plan_fp8(*args, per_request=per_request)
    k = run(launch)  # compiles it; its registers and shared memory set the CTAs an SM holds
    got = x["out"].clone()
    want = got if want is None else want
    assert torch.equal(got, want), f"per_request {per_request}: other logits than the default's"
    ctas = ctas_per_sm(k.metadata.shared, k.n_regs, launch.options["num_warps"], target.arch)
    programs = math.prod(launch.grid)
    us = median_us(lambda launch=launch: run(launch))
    frac = logit_bytes(BS, CTX, HEADS, DIM, True) / us * 1e-3 / copy["gbps"]
    name = f"per_request {per_request}" if per_request else "default"
    waves = programs / (target.sms * ctas)
    row = (name, programs, launch.args["tiles_per_prog"], ctas, f"{waves:.2f}", f"{us:.1f}", f"{frac:.3f}")
    print(tables.line(row))
