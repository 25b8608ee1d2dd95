"""Top-k entry indices of the indexer logits: which cached entries the sparse attention reads.

    topk_indices(logits, k)                       torch.topk, then the contract below
    topk_indices_triton(logits, k, lengths=None)  Triton: kernels.topk_fused (the default, TOPK_KERNEL)
                                                  or the "bound" pair below (kernel="bound")

The contract (both): int32 [bs, k], the indices of the k largest logits of each row, -1 where the
value is -inf, sorted ascending with the -1s last, so graph and eager results compare as sets.
With `lengths`, entries t >= lengths[b] count as -inf. NaN ranks above +inf (as in torch.topk),
and -0.0 equals +0.0.

Ties: torch.topk leaves unspecified which of several equal values at the k-th place it returns.
The Triton kernel takes the lowest indices among them, as does ref_topk_indices (a stable sort);
away from ties at the k-th value all three return the same set.

The "bound" pair (65536 fp32 logits are 256 KB a row; one program per row could not read that fast):
  1. kernels.topk_keys.row_maxima_kernel, over many programs: map each float to a uint32 key
     whose unsigned order is the float order, and keep the largest key of each sub-chunk (16
     entries at 65536);
  2. _topk_kernel, one program per row:
     a. lower bound: the k-th largest sub-chunk maximum (k distinct entries reach it): its top
        8n bits from n histogram passes (config bound_passes n, 2 by default), or (n = 0) exact,
        bound_bits a step;
     b. only sub-chunks whose maximum reaches it can hold a top-k entry: gather those (about 1/8
        of the row on random logits), and keep their entries that reach the bound, in index
        order (prefix sums): the candidates, typically ~k of them;
     c. radix select among the candidates (their keys stored beside them in b, so each pass
        reads them in order rather than gathering from the row), RADIX_BITS per pass from the
        top: a histogram of the keys that match the digits found so far gives the next digit of
        the k-th largest key; stop as soon as every key left in the chosen bin is taken;
     d. one pass over the candidates writes, in index order, every index above the threshold and
        the first ties: the output comes out sorted without a sort.
  -inf entries are never candidates (they come out as -1 anyway), so rows of -inf (a graph's
  padded rows) and rows shorter than k cost little. Worst case (all finite keys equal, or sorted
  rows) every entry is a candidate: slower, still exact.

Layout: reference, kernel, launcher, check (kernels.topk_check), benchmark. `python -m kernels
--check / --bench`.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels import args as A
from kernels import topk_fused
from kernels.harness import median_us
from kernels.launch import Case, Launch
from kernels.topk_keys import (
    NEG_INF_KEY,
    check_topk_args,
    check_triton_args,
    kth_largest,
    kth_largest_prefix,
    order_key,
    radix_selected,
    radix_threshold,
    row_maxima_kernel,
    run_launches,
    sub_chunks,
)

__all__ = [
    "KERNELS",
    "TOPK_CONFIG",
    "TOPK_KERNEL",
    "benchmark",
    "compile_cases",
    "mask_lengths",
    "order_keys",
    "plan_topk",
    "ref_topk_indices",
    "topk_indices",
    "topk_indices_triton",
]

# ---------------------------------------------------------------------------
# 1. Torch references
# ---------------------------------------------------------------------------


def mask_lengths(logits: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """logits with entries t >= lengths[b] set to -inf (logits itself when lengths is None)."""
    if lengths is None:
        return logits
    t = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill(t[None, :] >= lengths[:, None].long(), float("-inf"))


def _to_contract(vals, idx):
    """-1 where the value is -inf, ascending, -1s last."""
    big = torch.iinfo(torch.int32).max
    idx = torch.where(vals == float("-inf"), big, idx.to(torch.int32))
    idx = idx.sort(dim=-1).values
    return torch.where(idx == big, -1, idx)


def topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The contract above through torch.topk. No host sync: safe under CUDA graph capture."""
    check_topk_args(logits, k)
    logits = mask_lengths(logits, lengths)
    vals, idx = torch.topk(logits, k, dim=-1)
    return _to_contract(vals, idx)


def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys in [0, 2^32) whose order is the float order of float32 logits: NaN on top,
    -0.0 == +0.0. The same map as the kernels' order_key (kernels.topk_keys), in torch."""
    x = logits.float()
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits | 0x80000000)
    key = torch.where(x == 0, 0x80000000, key)
    return torch.where(torch.isnan(x), 0xFFFFFFFF, key)


def ref_topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's exact answer: the contract, ties at the k-th value broken by lowest index."""
    check_topk_args(logits, k)
    logits = mask_lengths(logits.float(), lengths)
    idx = torch.sort(order_keys(logits), dim=1, descending=True, stable=True).indices[:, :k]
    return _to_contract(logits.gather(1, idx), idx)


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _topk_kernel(
    x_ptr,
    len_ptr,
    max_ptr,
    sub_ptr,
    cand_ptr,
    ckey_ptr,
    out_ptr,
    width,
    K,
    stride_x,
    stride_m,
    stride_s,
    stride_c,
    stride_o,
    HAS_LEN: tl.constexpr,
    SUB: tl.constexpr,
    NUM_MAX: tl.constexpr,  # sub-chunks (maxima) per row, a power of two
    BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    BOUND_BITS: tl.constexpr,
    BOUND_PASSES: tl.constexpr,  # 0: the exact bound, BOUND_BITS a step; n: n histogram passes
    PDL: tl.constexpr,  # launched as a programmatic dependent of the maxima kernel
):
    if PDL:  # resident while the maxima kernel drains; its writes are visible after this
        gdc_wait()
    SUBS: tl.constexpr = BLOCK // SUB  # sub-chunks gathered per step
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    s_row = sub_ptr + row * stride_s
    c_row = cand_ptr + row * stride_c
    ck_row = ckey_ptr + row * stride_c  # the candidates' keys: later passes read them in order
    o_row = out_ptr + row * stride_o
    n = width
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), width)
    offs0 = tl.arange(0, BLOCK)

    # 2a. a lower bound on the k-th largest key: the k-th largest sub-chunk maximum (k distinct
    # entries reach it), or 0 (every entry) when fewer than k sub-chunks hold a valid entry
    m_offs = tl.arange(0, NUM_MAX)
    maxima = tl.load(max_ptr + row * stride_m + m_offs).to(tl.uint32, bitcast=True)
    if BOUND_PASSES > 0:
        lower = kth_largest_prefix(maxima, K, BOUND_PASSES)
    else:
        lower = kth_largest(maxima, K, BOUND_BITS)

    # 2b. the sub-chunks that reach it (no other holds a candidate), in index order. -inf entries
    # are never candidates: the contract reports them as -1 whichever are picked, and a row of
    # them (a graph's padded row, or one shorter than k) would otherwise make every entry a
    # candidate: the worst case, on the model's every padded step
    live = (maxima >= lower) & (maxima > NEG_INF_KEY)
    tl.store(s_row + tl.cumsum(live.to(tl.int32), 0) - 1, m_offs, mask=live)
    n_live = tl.sum(live.to(tl.int32))

    # 2c. candidates, in index order: their entries whose key reaches the bound
    c = tl.zeros([], tl.int32)
    for start in range(0, n_live, SUBS):
        j = start + tl.arange(0, SUBS)
        sub = tl.load(s_row + j, mask=j < n_live, other=NUM_MAX)  # NUM_MAX * SUB >= width: masked
        t = tl.reshape(sub[:, None] * SUB + tl.arange(0, SUB)[None, :], [BLOCK])
        ok = t < n
        key = order_key(tl.load(x_row + t, mask=ok, other=0.0))
        cand = ok & (key >= lower) & (key > NEG_INF_KEY)
        dst = c + tl.cumsum(cand.to(tl.int32), 0) - 1
        tl.store(c_row + dst, t, mask=cand)
        tl.store(ck_row + dst, key.to(tl.int32, bitcast=True), mask=cand)
        c += tl.sum(cand.to(tl.int32))

    # 2d. radix select among the candidates, then 3. write them in index order
    prefix, shift, k_rem, take_all = radix_threshold(ck_row, c, K, BLOCK, RADIX_BITS, True)
    taken = tl.zeros([], tl.int32)
    ties = tl.zeros([], tl.int32)
    for start in range(0, c, BLOCK):
        offs = start + offs0
        ok = offs < c
        idx = tl.load(c_row + offs, mask=ok, other=0)
        key = tl.load(ck_row + offs, mask=ok, other=0).to(tl.uint32, bitcast=True)
        sel, ties = radix_selected(key, ok, prefix, shift, k_rem, take_all, ties)
        sel = sel & (key != NEG_INF_KEY)  # -inf entries are reported as -1 (the padding)
        tl.store(o_row + taken + tl.cumsum(sel.to(tl.int32), 0) - 1, idx, mask=sel)
        taken += tl.sum(sel.to(tl.int32))
    for start in range(0, K, BLOCK):
        offs = start + offs0
        tl.store(o_row + offs, tl.full([BLOCK], -1, tl.int32), mask=(offs >= taken) & (offs < K))


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

# Why these values, from the graph-timed sweeps on the H200 ([32, 65536], k 512;
# outputs/bench/h200-*/sweep_topk.md, each at the commit its folder names): the histogram bound in
# 2 passes and 4-bit radix passes took 37.7 us against 44.5 for the exact bound and 8 bits (at
# c76d4cd; the sub-chunk maxima launch alone 5.1 us, the one-program-per-row select the rest);
# blocks of 1024 entries over 8 warps took 29.3 us against 41.8 for 4096 over 16 (at 7cc72f5: the
# select is latency-bound, and smaller blocks make cheaper block-wide scans); the select launched
# as a programmatic dependent of the maxima kernel (pdl 1) took 29.7 us against 30.0 without (at
# 07fb1c5, clean L2 flush). Why a radix select and not a sort: where at most 1024 candidates come
# out (random rows leave 536-573 at k 512), one descending tl.sort of (key << 32) | (2^32 - 1 -
# index) in a block (exact, ties included) took 28.1 us against 25.2 for the radix select, 49.9 us
# with a block of 2048 (do_bench_cudagraph): the bitonic sort's log^2 stages cost more than the
# radix passes. Every config here must compile without spills (tests/test_kernel_compile.py).
TOPK_CONFIG = dict(
    block=1024, num_warps=8, radix_bits=4, bound_bits=2, bound_passes=2, maxima=4096, maxima_warps=4, pdl=1
)


def plan_topk(
    logits: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    pdl: bool | None = None,
) -> tuple[Launch, Launch]:
    """The two launches (sub-chunk maxima, then select) for these arguments. Allocates on the
    current stream (inside a capture: from the graph's pool, as torch.topk's own temporaries):
    out when None, and workspaces, int32 [bs, NUM_MAX] twice and [bs, width] twice (the
    candidates and their keys). pdl: launch the select kernel as a programmatic dependent of the
    maxima kernel (None: where the device can, a CUDA GPU of sm_90 or later; config pdl 0 never)."""
    check_triton_args(logits, k, lengths, out)
    cfg = dict(TOPK_CONFIG, **(config or {}))
    A.need(32 % cfg["radix_bits"] == 0, f"radix_bits must divide 32, got {cfg['radix_bits']}")
    A.need(32 % cfg["bound_bits"] == 0, f"bound_bits must divide 32, got {cfg['bound_bits']}")
    A.need(cfg["bound_passes"] in (0, 1, 2, 3, 4), f"bound_passes must be 0 to 4, got {cfg['bound_passes']}")
    bs, width = logits.shape
    dev = logits.device
    if out is None:
        out = torch.empty(bs, k, dtype=torch.int32, device=dev)
    sub, num_max = sub_chunks(width, k, cfg["maxima"])
    block = max(cfg["block"], sub)
    per_prog = max(1, min(num_max, 4096 // sub))  # 4096 entries per maxima program
    maxima = torch.empty(bs, num_max, dtype=torch.int32, device=dev)
    subs = torch.empty(bs, num_max, dtype=torch.int32, device=dev)
    cand = torch.empty(bs, width, dtype=torch.int32, device=dev)
    ckey = torch.empty(bs, width, dtype=torch.int32, device=dev)
    lens = lengths if lengths is not None else logits  # unused without HAS_LEN
    common = dict(x_ptr=logits, len_ptr=lens, max_ptr=maxima, width=width, stride_x=logits.stride(0))
    has_len = lengths is not None
    # programmatic dependent launch (sm_90+, CUDA only): the select kernel's launch overlaps the
    # maxima kernel's tail instead of following its last CTA
    if pdl is None:
        pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    pdl = bool(pdl and cfg["pdl"])
    maxima_args = dict(
        common,
        stride_m=maxima.stride(0),
        HAS_LEN=has_len,
        SUB=sub,
        SUBS=per_prog,
        sync_ptr=maxima,
        SYNC_WORDS=0,
        PDL=pdl,
    )
    select_args = dict(
        common,
        sub_ptr=subs,
        cand_ptr=cand,
        ckey_ptr=ckey,
        out_ptr=out,
        K=k,
        stride_m=maxima.stride(0),
        stride_s=subs.stride(0),
        stride_c=cand.stride(0),
        stride_o=out.stride(0),
        HAS_LEN=has_len,
        SUB=sub,
        NUM_MAX=num_max,
        BLOCK=block,
        RADIX_BITS=cfg["radix_bits"],
        BOUND_BITS=cfg["bound_bits"],
        BOUND_PASSES=cfg["bound_passes"],
        PDL=pdl,
    )
    maxima_opts = dict(num_warps=cfg["maxima_warps"])
    return (
        Launch(row_maxima_kernel, (bs, num_max // per_prog), maxima_args, maxima_opts),
        Launch(
            _topk_kernel, (bs,), select_args, dict(num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)
        ),
    )


# Which kernels topk_indices_triton runs: "fused" (kernels.topk_fused: the bound once per row, then
# the filter over several programs per row and the select in the row's last one) or "bound" (the
# two kernels above: one select program per row). fused is the default because it is the faster:
# on an H200, [32, 65536] fp32, k 512 (outputs/bench/h200-b6db959-topk/bench.md), fused 21.8 us,
# bound 29.2. ncu there: the bound pair's select issues about 0.3 instructions a cycle per
# scheduler (latency-bound: a few warps of one program per row through dependent block-wide
# reductions).
TOPK_KERNEL = "fused"
KERNELS = ("bound", "fused")


def topk_indices_triton(
    logits: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: dict | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """The contract above, by a Triton kernel (ties: lowest index). float32 logits on CUDA;
    out (int32 [bs, k]) is filled and returned, or allocated when None. kernel: one of KERNELS
    (None: TOPK_KERNEL); config: that kernel's (kernels.topk_fused.FUSED_CONFIG or TOPK_CONFIG)."""
    kernel = kernel or TOPK_KERNEL
    A.need(kernel in KERNELS, f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "fused":
        return topk_fused.topk_indices_fused(logits, k, lengths, out, config=config)
    return run_launches(plan_topk(logits, k, lengths, out, config), logits)


def compile_cases(arch: int) -> list[Case]:
    """The launches for kernels.compile_check: the model's shape, with and without lengths, and
    the select kernel with the exact bound; then kernels.topk_fused's."""
    x, lens = torch.empty(32, 65536), torch.zeros(32, dtype=torch.int32)
    cases = []
    for tag, lengths in (("", None), ("_lengths", lens)):
        maxima, select = plan_topk(x, 512, lengths, pdl=arch >= 90)  # PDL: what sm_90 and later run
        cases.append(Case(f"topk_maxima{tag}", maxima, tensor_core=False, tma=False, pdl=arch >= 90))
        cases.append(Case(f"topk_select{tag}", select, tensor_core=False, tma=False, pdl=arch >= 90))
    # the exact bound the sweep times (the interpreter does not hold constexprs to the rules)
    _, select = plan_topk(x, 512, config=dict(bound_passes=0), pdl=arch >= 90)
    cases.append(Case("topk_select_exact_bound", select, tensor_core=False, tma=False, pdl=arch >= 90))
    return cases + topk_fused.compile_cases(arch)


# ---------------------------------------------------------------------------
# 4. check(): kernels.topk_check (the cases and the comparison with torch)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# 5. benchmark()
# ---------------------------------------------------------------------------


def benchmark(bs: int = 32, width: int = 65536, k: int = 512, device: str = "cuda") -> list[dict]:
    """Rows for the bench table: each of KERNELS and torch's top-k (the contract
    through torch.topk), on random rows, then on a graph's padded batch (the last quarter of the
    rows all -inf). Each kernel row names its torch row (vs), for the speedups."""
    x = torch.randn(bs, width, device=device)
    padded = x.clone()
    padded[bs - bs // 4 :] = float("-inf")
    out = torch.empty(bs, k, dtype=torch.int32, device=device)
    nbytes = x.numel() * 4 + out.numel() * 4
    rows: list[dict] = []
    for tag, data in (("", x), ("_padded", padded)):
        torch_us = median_us(lambda data=data: topk_indices(data, k))
        mine: list[dict] = []
        for kernel in KERNELS:
            us = median_us(
                lambda data=data, kernel=kernel: topk_indices_triton(data, k, out=out, kernel=kernel)
            )
            mine.append(dict(name=f"triton_topk_{kernel}{tag}", us=us, speedup_vs_torch=torch_us / us))
        rows += [*mine, dict(name=f"torch_topk{tag}", us=torch_us)]
        for r in mine:
            r["vs"] = f"torch_topk{tag}"
    for r in rows:
        r.update(bytes=nbytes, gbps=nbytes / r["us"] * 1e-3)
    return rows
