"""Sparse-attention indexer logits (decode) over a paged index-K cache.

A miniature of the DeepSeek-V4 / SGLang "indexer": for every request b and
cached entry t it scores

    logits[b, t] = sum_h w[b, h] * relu(q[b, h] . k_b[t])        (bf16 cache)
    logits[b, t] = sum_h w[b, h] * relu(q[b, h] . k_b[t] * s_b[t]) (fp8 cache)

where k_b[t] is entry t % 64 of page page_table[b, t // 64] (kernels.paged), and
logits[b, t] = -inf for t >= seq_lens[b]. A top-k over the logits (kernels.topk)
then picks the entries the sparse attention reads.

Layout of this file, top to bottom:
  1. torch references
  2. Triton kernel
  3. launchers (no allocation: they run inside CUDA graph capture)

Its check is in kernels.logits_check, its benchmark and launch-config sweep in kernels.logits_bench,
its configs in kernels.logits_configs, its argument checks in kernels.logits_args, the custom ops
the model calls (csi::indexer_logits_*) in kernels.ops.

Run `python -m kernels --check` or `--bench [--out DIR]` on a GPU.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import args as A
from kernels.e4m3 import e4m3_to
from kernels.launch import Launch, Target, num_sms, run, target_running
from kernels.logits_args import check_bf16_args, check_fp8_args
from kernels.logits_configs import K_LOADS, LogitsConfig, launch_config
from kernels.paged import PAGE, fp8_views, live_len, pad_logits

__all__ = [
    "indexer_logits_bf16_",
    "indexer_logits_fp8_",
    "plan",
    "plan_bf16",
    "plan_fp8",
    "ref_logits_bf16",
    "ref_logits_fp8",
]

# ---------------------------------------------------------------------------
# 1. Torch references
# ---------------------------------------------------------------------------


def _live_page_ids(page_table, seq_lens, max_len):
    """Page ids of the first max_len // PAGE pages; ids past seq_len (maybe garbage) -> 0."""
    n_pages = max_len // PAGE
    pages = torch.arange(n_pages, device=page_table.device)
    live = pages[None, :] * PAGE < seq_lens[:, None]
    return torch.where(live, page_table[:, :n_pages].long(), 0)


def _gather_pages(cache, page_table, seq_lens, max_len):
    """The first max_len // PAGE pages of each request, [bs, n_pages, *one page]. index_select copies
    the same bytes as cache[ids] at about half the CPU's time (one row copy a page)."""
    ids = _live_page_ids(page_table, seq_lens, max_len)
    return cache.index_select(0, ids.view(-1)).view(*ids.shape, *cache.shape[1:])


def _mask_(logits, seq_lens):
    t = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill_(t[None, :] >= seq_lens[:, None], float("-inf"))


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)  # float32, or float64 for the check


def _ref_head_sum(q, k, w):
    """sum_h w[b, h] * relu(q[b, h] . k[b, t]) -> [bs, T] in the accumulation dtype (q, k: one dtype).

    The scores as q @ k^T ([bs, H, T]), which the CPU computes faster than k @ q^T and bit for bit
    equal (tests/test_logits_reference.py); the head sum from a contiguous [bs, T, H] copy, because
    torch's bmm over a transposed operand rounds differently at bs 1 and H >= 8."""
    scores = torch.bmm(q, k.transpose(1, 2))  # [bs, H, T], fp32 accumulate
    acc = _acc_dtype(scores.dtype)
    scores = scores.transpose(1, 2).to(acc, memory_format=torch.contiguous_format).relu_()
    return torch.bmm(scores, w.to(acc).unsqueeze(-1)).squeeze(-1)


def ref_logits_bf16(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """Torch reference: gather pages, one bmm, relu, weighted head sum -> [bs, max_len].

    Works for any float dtype of q/kcache (bf16 in production, float64 in check()).
    """
    bs, _, d = q.shape
    n = live_len(seq_lens, max_len)
    k = _gather_pages(kcache, page_table, seq_lens, n).view(bs, n, d)
    logits = _ref_head_sum(q.to(k.dtype), k, w)
    return pad_logits(_mask_(logits, seq_lens), max_len)


def ref_logits_fp8(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Torch reference for the fp8 cache: gather pages, upcast e4m3 (exact in bf16), bmm.

    relu(qk * s) == relu(qk) * s because s > 0, so the scale is applied after the head sum.
    """
    bs, _, d = q.shape
    n = live_len(seq_lens, max_len)
    g = _gather_pages(pages, page_table, seq_lens, n)  # [bs, n_pages, bytes]
    k = e4m3_to(g[..., : PAGE * d], compute_dtype).view(bs, n, d)
    scale = g[..., PAGE * d :].view(torch.float32).reshape(bs, n)
    logits = _ref_head_sum(q.to(compute_dtype), k, w)
    return pad_logits(_mask_(logits * scale.to(logits.dtype), seq_lens), max_len)


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _page_scales(scale_ptr, page, offs_p, ok, D: tl.constexpr, PAGE_STRIDE: tl.constexpr):
    """The PAGE float32 scales of fp8 page `page` (0 where not ok): they follow its PAGE*D values."""
    row = scale_ptr + page * (PAGE_STRIDE // 4) + (64 * D // 4)
    # ok as a bound rather than a scalar bool broadcast over the block: Triton 3.9's interpreter
    # splats a scalar int1 into int32 data, which tl.load refuses as a mask
    return tl.load(row + offs_p, mask=offs_p < tl.where(ok, 64, 0), other=0.0)


@triton.jit
def _head_sum(k, q_t, w, FP32_IEEE: tl.constexpr):
    """sum_h w[h] * relu(k . q[h]) for each row of the K tile: tokens as M, heads as N, so the head
    sum stays inside a warp (no shared-memory reduction)."""
    if FP32_IEEE:
        s = tl.dot(k, q_t, input_precision="ieee")
    else:
        s = tl.dot(k, q_t)  # [rows, BLOCK_H], fp32 accumulate
    return tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)


@triton.jit
def _work_item(
    b,
    chunk,
    q_ptr,
    w_ptr,
    k_ptr,
    k_desc,
    scale_ptr,
    pt_ptr,
    seq_lens_ptr,
    out_ptr,
    H,
    max_len,
    n_chunks,
    tiles_per_prog,
    stride_qb,
    stride_qh,
    stride_wb,
    stride_ptb,
    stride_ob,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IS_FP8: tl.constexpr,
    FP32_IEEE: tl.constexpr,
    K_LOAD: tl.constexpr,
    SCALE_PREFETCH: tl.constexpr,
):
    """One work item: request b (int64), tiles_per_prog tiles of its context from chunk's."""
    PAGE_: tl.constexpr = 64
    # k_ptr is the fp8 byte view or the bf16 cache; one page is PAGE_STRIDE elements, PAGE_ROWS
    # rows of the descriptor's [rows, D] view (fp8: 64 value rows, then 256 / D rows of scales)
    PAGE_STRIDE: tl.constexpr = PAGE_ * D + PAGE_ * 4 if IS_FP8 else PAGE_ * D
    PAGE_ROWS: tl.constexpr = PAGE_STRIDE // D
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, BLOCK_T)
    offs_p = tl.arange(0, PAGE_)
    h_ok = offs_h < H
    t_begin = chunk * (BLOCK_T * tiles_per_prog)
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), max_len)
    live_pages = (seq_len + PAGE_ - 1) // PAGE_
    # tiles holding at least one live entry; the rest are -inf without touching K
    n_live = tl.minimum((tl.maximum(seq_len - t_begin, 0) + BLOCK_T - 1) // BLOCK_T, tiles_per_prog)
    # q[b] once per work item: [BLOCK_H, D] -> the B operand [D, BLOCK_H]
    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :]
    q_t = tl.trans(tl.load(q_rows, mask=h_ok[:, None], other=0.0))
    w = tl.load(w_ptr + b * stride_wb + offs_h, mask=h_ok, other=0.0)
    pt_row = pt_ptr + b * stride_ptb
    # fp8 scales one tile ahead, their page ids two (SCALE_PREFETCH): the pipeliner leaves a load
    # that feeds no dot in the iteration that uses it, so its latency sat in every tile (ahead: 79.4
    # us against 80.5 in the sweep at 7f3c9a9). Only live tiles' page ids are followed.
    scale_next = tl.zeros([PAGE_], tl.float32)
    page_ahead = 0
    if SCALE_PREFETCH:
        page_next = tl.load(pt_row + t_begin // PAGE_, mask=n_live > 0, other=0).to(tl.int64)
        scale_next = _page_scales(scale_ptr, page_next, offs_p, n_live > 0, D, PAGE_STRIDE)
        page_ahead = tl.load(pt_row + t_begin // PAGE_ + 1, mask=n_live > 1, other=0).to(tl.int64)

    for i in range(0, n_live):
        t0 = t_begin + i * BLOCK_T
        t = t0 + offs_t
        scale = scale_next
        if SCALE_PREFETCH:  # tile i+1's scales (its page id came an iteration ago), tile i+2's page id
            scale_next = _page_scales(scale_ptr, page_ahead, offs_p, i + 1 < n_live, D, PAGE_STRIDE)
            page_ahead = tl.load(pt_row + t0 // PAGE_ + 2, mask=i + 2 < n_live, other=0).to(tl.int64)
        # [rows, D] tiles, D contiguous: the K-major A operand (what fp8 wgmma needs)
        if K_LOAD == 1:  # one TMA box, one page (BLOCK_T 64), live (i < n_live)
            # its id once, a scalar the pipeliner prefetches with the box: the fp8 scales'
            # address comes from it too, with no per-entry page-table load in the loop
            page = tl.load(pt_row + t0 // PAGE_).to(tl.int64)
            logit = _head_sum(k_desc.load([(page * PAGE_ROWS).to(tl.int32), 0]), q_t, w, FP32_IEEE)
            if IS_FP8:  # scales once per tile, after the head sum: relu(x * s) == relu(x) * s, s > 0
                if not SCALE_PREFETCH:
                    scale = _page_scales(scale_ptr, page, offs_p, True, D, PAGE_STRIDE)
                logit = logit * scale
        else:
            page_ok = t // PAGE_ < live_pages  # never follow page ids past seq_len
            page = tl.load(pt_row + t // PAGE_, mask=page_ok, other=0).to(tl.int64)
            if K_LOAD == 2:  # any rows: TMA gather (sm_100)
                k = k_desc.gather((page * PAGE_ROWS + t % PAGE_).to(tl.int32), 0)
            else:
                row = page * PAGE_STRIDE + (t % PAGE_) * D
                k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=page_ok[:, None], other=0.0)
            logit = _head_sum(k, q_t, w, FP32_IEEE)
            if IS_FP8:  # as float32, page p's scales start at p * PAGE_STRIDE/4 + PAGE*D/4
                scale_row = scale_ptr + page * (PAGE_STRIDE // 4) + (PAGE_ * D // 4)
                logit = logit * tl.load(scale_row + t % PAGE_, mask=page_ok, other=0.0)
        logit = tl.where(t < seq_len, logit, float("-inf"))
        tl.store(out_ptr + b * stride_ob + t, logit, mask=t < max_len)

    neg_inf = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for i in range(n_live, tiles_per_prog):
        t = t_begin + i * BLOCK_T + offs_t
        tl.store(out_ptr + b * stride_ob + t, neg_inf, mask=t < max_len)


@triton.jit
def _indexer_logits_kernel(
    q_ptr,
    w_ptr,
    k_ptr,
    k_desc,  # a [rows, D] TMA descriptor over the cache (k_load tma / gather), else None
    scale_ptr,
    pt_ptr,
    seq_lens_ptr,
    out_ptr,
    bs,
    H,
    max_len,
    n_chunks,
    tiles_per_prog,
    stride_qb,
    stride_qh,
    stride_wb,
    stride_ptb,
    stride_ob,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,  # entries per tile, a multiple of PAGE
    IS_FP8: tl.constexpr,
    FP32_IEEE: tl.constexpr,  # fp32 operands (test path): exact dot, not tf32
    K_LOAD: tl.constexpr,  # 0 pointers, 1 one TMA tile per page, 2 TMA gather of rows
    SCALE_PREFETCH: tl.constexpr,  # fp8 scales loaded one tile ahead (scale_load "prefetch")
    PERSISTENT: tl.constexpr,  # walk items pid, pid + programs, ...; else the item (pid0, pid1)
):
    # work item = (request b, chunk of tiles_per_prog tiles). Without PERSISTENT no loop around
    # the item, whose indices come from a 2-D grid: the loop and the 1-D work index cost registers
    # (fp8 on sm_90a: 96 -> 109, 5 -> 4 CTAs per SM)
    if PERSISTENT:
        for work in range(tl.program_id(0), bs * n_chunks, tl.num_programs(0)):
            _work_item(
                (work // n_chunks).to(tl.int64),
                work % n_chunks,
                q_ptr,
                w_ptr,
                k_ptr,
                k_desc,
                scale_ptr,
                pt_ptr,
                seq_lens_ptr,
                out_ptr,
                H,
                max_len,
                n_chunks,
                tiles_per_prog,
                stride_qb,
                stride_qh,
                stride_wb,
                stride_ptb,
                stride_ob,
                D,
                BLOCK_H,
                BLOCK_T,
                IS_FP8,
                FP32_IEEE,
                K_LOAD,
                SCALE_PREFETCH,
            )
    else:  # grid (bs, n_chunks)
        _work_item(
            tl.program_id(0).to(tl.int64),
            tl.program_id(1),
            q_ptr,
            w_ptr,
            k_ptr,
            k_desc,
            scale_ptr,
            pt_ptr,
            seq_lens_ptr,
            out_ptr,
            H,
            max_len,
            n_chunks,
            tiles_per_prog,
            stride_qb,
            stride_qh,
            stride_wb,
            stride_ptb,
            stride_ob,
            D,
            BLOCK_H,
            BLOCK_T,
            IS_FP8,
            FP32_IEEE,
            K_LOAD,
            SCALE_PREFETCH,
        )


# ---------------------------------------------------------------------------
# 3. Launchers (configs: kernels.logits_configs; the compile check's cases: kernels.logits_check)
# ---------------------------------------------------------------------------


def plan(
    q: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    scales: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    cfg: LogitsConfig,
    is_fp8: bool,
    target: Target,
    per_request: int = 0,
) -> Launch:
    """The launch for these (already checked) arguments and config on target (kernels.launch.Target;
    its dtype is not checked here: plan_bf16 / plan_fp8 do). k: the bf16 cache or the fp8
    pages' e4m3 view, either one [rows, D] matrix for a descriptor (no copy, no device memory:
    the descriptor is a host-side kernel argument). per_request > 0: exactly that many programs per
    request, each walking its share of the row (an engine that leaves SMs to the work it overlaps,
    as DeepGEMM's num_sms schedule does); 0: as many as fill the GPU."""
    bs, h, d = q.shape
    max_len = out.shape[1]
    A.need(cfg.k_load != "gather" or target.arch >= 100, "config k_load 'gather' needs sm_100 or later")
    A.need(cfg.k_load != "tma" or target.arch >= 90, "config k_load 'tma' needs sm_90 or later (TMA)")
    n_tiles = triton.cdiv(max_len, cfg.block_t)
    if per_request > 0:
        tiles = triton.cdiv(n_tiles, per_request)
    else:
        tiles = max(1, min(cfg.tiles_per_prog, n_tiles))
        while tiles > 1 and bs * triton.cdiv(n_tiles, tiles) < cfg.min_programs:
            tiles //= 2  # split by context: more work items in flight beat fewer q reloads
    n_chunks = triton.cdiv(n_tiles, tiles)
    desc = None
    if cfg.k_load != "ptr":
        rows = k.view(-1, d)
        box = [PAGE if cfg.k_load == "tma" else 1, d]
        desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), box)
    grid: tuple[int, ...] = (bs, n_chunks)
    if cfg.persistent:
        grid = (min(bs * n_chunks, cfg.persistent * num_sms(q.device)),)
    args = dict(
        q_ptr=q,
        w_ptr=w,
        k_ptr=k,
        k_desc=desc,
        scale_ptr=scales,
        pt_ptr=page_table,
        seq_lens_ptr=seq_lens,
        out_ptr=out,
        bs=bs,
        H=h,
        max_len=max_len,
        n_chunks=n_chunks,
        tiles_per_prog=tiles,
        stride_qb=q.stride(0),
        stride_qh=q.stride(1),
        stride_wb=w.stride(0),
        stride_ptb=page_table.stride(0),
        stride_ob=out.stride(0),
        D=d,
        BLOCK_H=max(16, triton.next_power_of_2(h)),  # tl.dot needs >= 16
        BLOCK_T=cfg.block_t,
        IS_FP8=is_fp8,
        FP32_IEEE=q.dtype == torch.float32,
        K_LOAD=K_LOADS.index(cfg.k_load),
        SCALE_PREFETCH=is_fp8 and cfg.scale_load == "prefetch",
        PERSISTENT=bool(cfg.persistent),
    )
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return Launch(_indexer_logits_kernel, grid, args, options)


def plan_bf16(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    config: LogitsConfig | dict | None = None,
    arch: int | None = None,
    per_request: int = 0,
) -> Launch:
    """The launch on arch (default: q's device); a one-line ValueError for a GPU without bf16."""
    check_bf16_args(q, w, kcache, page_table, seq_lens, out)
    target = target_running("bf16", q.device, arch)
    cfg = launch_config(config, "bf16", q.shape[1], q.shape[2], target)
    return plan(q, w, kcache, kcache, page_table, seq_lens, out, cfg, False, target, per_request)


def plan_fp8(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    config: LogitsConfig | dict | None = None,
    arch: int | None = None,
    per_request: int = 0,
) -> Launch:
    """The launch on arch (default: q's device); a one-line ValueError for a GPU without fp8
    (compute capability below 8.9), naming it and saying to use bf16."""
    check_fp8_args(q, w, pages, page_table, seq_lens, out)
    target = target_running("fp8", q.device, arch)
    cfg = launch_config(config, "fp8", q.shape[1], q.shape[2], target)
    values, scales = fp8_views(pages)
    return plan(q, w, values, scales, page_table, seq_lens, out, cfg, True, target, per_request)


def indexer_logits_bf16_(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    config: LogitsConfig | dict | None = None,
    per_request: int = 0,
) -> None:
    """Triton: out[bs, max_len] = logits over a bf16 cache. Allocates nothing.

    q/kcache may also be float16/float32 (same dtype): a test path, because the
    Triton interpreter mis-computes tl.dot on bf16 operands. config (a LogitsConfig or its dict)
    overrides the per-architecture table (kernels.logits_configs).
    """
    launch = plan_bf16(q, w, kcache, page_table, seq_lens, out, config, per_request=per_request)
    A.launchable(launch.kernel, q.device)
    if q.shape[0]:
        run(launch)


def indexer_logits_fp8_(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    config: LogitsConfig | dict | None = None,
    per_request: int = 0,
) -> None:
    """Triton: out[bs, max_len] = logits over an fp8 page cache (q is e4m3). Allocates nothing."""
    launch = plan_fp8(q, w, pages, page_table, seq_lens, out, config, per_request=per_request)
    A.launchable(launch.kernel, q.device)
    if q.shape[0]:
        run(launch)
