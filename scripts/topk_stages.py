"""Where the fused top-k's time goes, stage by stage, on a CUDA GPU: its launches timed cumulatively
(the sub-chunk maxima alone, then with the row bound, then with the filter, then whole), and two
cut-down copies of its last launch that time the filter without the select and the select's
gather without its radix passes. The cut-down copies write wrong outputs on purpose: they are
timed, never checked; the whole kernel is checked against the reference first.

    python3 scripts/topk_stages.py --out DIR [--config JSON] [--name stages] [--shape 32 65536 512]

Writes DIR/<name>.{json,md} (kernels.harness.write_table). Every figure is a CUDA-graph replay
after a clean L2 flush (kernels.harness.median_us); differences between rows are each stage's
cost as the graph sees it, launch gaps and programmatic-dependent overlap included.
"""

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import topk, topk_fused  # noqa: E402
from kernels.harness import median_us, meta, write_table  # noqa: E402
from kernels.launch import Launch, run  # noqa: E402
from kernels.topk_fused import _filter_chunk  # noqa: E402
from kernels.topk_radix import _gather  # noqa: E402

COLS = ["stage", "us", "added_us", "note"]


@triton.jit
def _cut_kernel(
    x_ptr,
    len_ptr,
    bound_ptr,
    cidx_ptr,
    ckey_ptr,
    cnt_ptr,
    arrived_ptr,
    out_ptr,
    width,
    K,
    stride_x,
    stride_c,
    stride_n,
    stride_o,
    HAS_LEN: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CAP: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr,
    GATHER: tl.constexpr,  # 0: the filter alone; 1: the last arriver gathers and stores, no passes
):
    """kernels.topk_fused._fused_kernel's filter, then (GATHER) the select's loads and stores only."""
    row = tl.program_id(0).to(tl.int64)
    lower, arrived = _filter_chunk(
        x_ptr, len_ptr, bound_ptr, cidx_ptr, ckey_ptr, cnt_ptr, arrived_ptr, row, width,
        stride_x, stride_c, stride_n, HAS_LEN, CHUNK, PDL,
    )  # fmt: skip
    if GATHER and arrived == NUM_CHUNKS - 1:
        ci_row, ck_row = cidx_ptr + row * stride_c, ckey_ptr + row * stride_c
        key, idx, got = _gather(cnt_ptr + row * stride_n, ci_row, ck_row, 0, CAP, NUM_CHUNKS, CHUNK)
        slot = tl.arange(0, CAP)
        tl.store(out_ptr + row * stride_o + slot, tl.where(key >= lower, idx, -1), mask=got & (slot < K))


def _cut(fused, gather):
    """The fused launch with its kernel swapped for _cut_kernel."""
    return Launch(_cut_kernel, fused.grid, dict(fused.args, GATHER=gather), fused.options)


def _fn(launches):
    return lambda: [run(launch) for launch in launches]


def stages(bs, width, k, config=None):
    """Rows of (stage, us, added_us, note), the whole kernel (with `config`) checked first."""
    x = torch.randn(bs, width, device="cuda")
    out = torch.empty(bs, k, dtype=torch.int32, device="cuda")
    maxima, bound, fused = topk_fused.plan_topk_fused(x, k, out=out, config=config)
    _fn([maxima, bound, fused])()
    if not torch.equal(out, topk.ref_topk_indices(x, k)):
        raise SystemExit("the fused top-k disagrees with the reference: nothing timed")
    plan = [
        ("maxima", [maxima], "the one read of every row from memory, sub-chunk maxima"),
        ("+ row bound", [maxima, bound], "one program per row over its maxima"),
        ("+ filter", [maxima, bound, _cut(fused, 0)], "each chunk's candidates, the row's counter"),
        ("+ select's loads", [maxima, bound, _cut(fused, 1)], "the last arriver's gather and store"),
        ("whole (fused)", [maxima, bound, fused], "the select's radix passes added"),
    ]
    rows, before = [], 0.0
    for name, launches, note in plan:
        us = median_us(_fn(launches))
        rows.append(dict(stage=name, us=us, added_us=us - before, note=note))
        before = us
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--name", default="stages", help="the table's file name in --out")
    p.add_argument("--config", default="{}", help="the fused kernel's config, as JSON")
    p.add_argument("--shape", type=int, nargs=3, default=(32, 65536, 512), metavar=("BS", "WIDTH", "K"))
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("topk_stages needs a CUDA GPU: run it on one (the stages are GPU timings)")
    bs, width, k = a.shape
    config = json.loads(a.config)
    rows = stages(bs, width, k, config)
    info = meta(shape=dict(bs=bs, width=width, k=k), flush="clean", config=config)
    print(write_table(a.out, a.name, info, rows, COLS))


if __name__ == "__main__":
    main()
