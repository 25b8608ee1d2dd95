"""The pieces the Triton top-k kernels share (kernels.topk's "bound" pair, kernels.topk_fused, and
kernels.differential's top-k comparison): the argument checks, the float -> uint32 order key, the
k-th-largest helpers over a block of keys, the radix select over a row (radix_threshold and
radix_selected), and the sub-chunk maxima kernel that reads each row once. A module of its own so
that kernels.topk (which dispatches to every kernel) and the kernels' modules import it without
importing each other.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kernels import args as A
from kernels.launch import Launch, run

__all__ = [
    "NEG_INF_KEY",
    "check_topk_args",
    "check_triton_args",
    "kth_largest",
    "kth_largest_prefix",
    "order_key",
    "radix_selected",
    "radix_threshold",
    "row_maxima_kernel",
    "run_launches",
    "sub_chunks",
]


def check_topk_args(logits: torch.Tensor, k: int) -> None:
    """logits a 2-D float tensor, k a positive int no larger than its rows."""
    A.tensor("logits", logits, (torch.float32, torch.float16, torch.bfloat16, torch.float64), ndim=2)
    A.need(isinstance(k, int) and k >= 1, f"k must be a positive int, got {k!r}")
    A.need(k <= logits.shape[1], f"k={k} is larger than the row ({logits.shape[1]} logits)")


NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # order_key(-inf): no other float maps to it


@triton.jit
def order_key(x):
    """float32 -> uint32, unsigned order == float order; NaN above +inf, -0.0 == +0.0."""
    bits = x.to(tl.uint32, bitcast=True)
    key = tl.where((bits & 0x80000000) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    key = tl.where(x == 0.0, 0x80000000, key)
    return tl.where(x != x, 0xFFFFFFFF, key)  # noqa: PLR0124 (x != x: NaN)


@triton.jit
def kth_largest(keys, k, BITS: tl.constexpr):
    """The k-th largest of a block of uint32 keys (0 if fewer than k are nonzero): the largest t
    with at least k keys >= t, BITS bits at a time from the top (2^BITS counts per step)."""
    t = tl.zeros([], tl.uint32)
    digits = tl.arange(0, 1 << BITS).to(tl.uint32)
    for step in tl.static_range(32 // BITS):
        SH = 32 - BITS * (step + 1)
        cand = t | (digits << SH)  # cand[0] == t: at least k keys reach it, by induction
        count = tl.sum((keys[:, None] >= cand[None, :]).to(tl.int32), axis=0)
        d = tl.maximum(tl.sum((count >= k).to(tl.int32)) - 1, 0)
        t = t | (d.to(tl.uint32) << SH)
    return t


@triton.jit
def kth_largest_prefix(keys, k, PASSES: tl.constexpr):
    """A lower bound on the k-th largest of a block of uint32 keys, in PASSES histogram passes:
    the k-th largest's top 8*PASSES bits, the rest 0. At least k keys reach it (the bin chosen
    at each pass holds the k-th largest), and it is <= the k-th largest, so every top-k entry
    reaches it: a looser bound than kth_largest's exact one, from 2 block reductions a pass
    instead of 32 // BITS dependent steps."""
    bins = tl.arange(0, 256)
    t = tl.zeros([], tl.uint32)
    k_rem = k + tl.zeros([], tl.int32)
    for p in tl.static_range(PASSES):
        SH = 24 - 8 * p  # constexpr: p is a static_range index
        ok = keys >= 0  # every key at the first pass, then those matching the prefix so far
        if p > 0:
            ok = (keys >> (SH + 8)) == (t >> (SH + 8))
        hist = tl.histogram(((keys >> SH) & 255).to(tl.int32), 256, mask=ok)
        ge = tl.sum(hist) - tl.cumsum(hist, 0) + hist  # keys whose digit >= d
        d = tl.maximum(tl.sum((ge >= k_rem).to(tl.int32)) - 1, 0)
        k_rem -= tl.sum(tl.where(bins == d, ge - hist, 0))
        t = t | (d.to(tl.uint32) << SH)
    return t


@triton.jit
def radix_threshold(row, n, K, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, KEYS: tl.constexpr):
    """Radix select of the K-th largest key among the n entries row[0:n] (float logits, or with
    KEYS their order keys as int32), RADIX_BITS per pass from the top. A 2^RADIX_BITS-bin
    histogram of the next digit among keys that match the digits found so far gives the next
    digit; stop once every key left in the chosen bin is taken. Returns (prefix, shift, k_rem,
    take_all): entry t is selected if key >> shift > prefix, or == prefix and among the first
    k_rem such."""
    NUM_BINS: tl.constexpr = 1 << RADIX_BITS
    bins = tl.arange(0, NUM_BINS)
    take_all = n <= K
    prefix = tl.zeros([], tl.uint32)
    shift = tl.full([], 32, tl.int32)
    k_rem = K + tl.zeros([], tl.int32)
    done = take_all
    for p in tl.static_range(32 // RADIX_BITS):
        if not done:
            SH: tl.constexpr = 32 - RADIX_BITS * (p + 1)
            hist = tl.zeros([NUM_BINS], tl.int32)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ok = offs < n
                if KEYS:
                    key = tl.load(row + offs, mask=ok, other=0).to(tl.uint32, bitcast=True)
                else:
                    key = order_key(tl.load(row + offs, mask=ok, other=0.0))
                if p > 0:
                    ok = ok & ((key >> (SH + RADIX_BITS)) == prefix)
                hist += tl.histogram(((key >> SH) & (NUM_BINS - 1)).to(tl.int32), NUM_BINS, mask=ok)
            # ge[d]: keys whose digit >= d; the k-th largest has the largest d with ge[d] >= k_rem
            ge = tl.sum(hist) - tl.cumsum(hist, 0) + hist
            d = tl.sum((ge >= k_rem).to(tl.int32)) - 1
            k_rem -= tl.sum(tl.where(bins == d, ge - hist, 0))  # every key above bin d is taken
            prefix = (prefix << RADIX_BITS) | d.to(tl.uint32)
            shift = tl.full([], SH, tl.int32)
            done = tl.sum(tl.where(bins == d, hist, 0)) == k_rem  # the whole bin is taken
    return prefix, shift, k_rem, take_all


@triton.jit
def radix_selected(key, ok, prefix, shift, k_rem, take_all, ties):
    """Which keys of a block radix_threshold's answer selects, given `ties` selected-bin keys in earlier
    blocks (ties go to the lowest index); returns (selected, ties so far)."""
    hi = key >> tl.minimum(shift, 31).to(tl.uint32)  # shift 32 only with take_all: unused
    tie = ok & (hi == prefix)
    rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
    # take_all as a block comparison: Triton 3.9's interpreter keeps a scalar bool's data int32,
    # and a block or-ed with it is not a valid mask
    every = (rank * 0 + take_all.to(tl.int32)) != 0
    sel = ok & ((hi > prefix) | (tie & (rank < k_rem)) | every)
    return sel, ties + tl.sum(tie.to(tl.int32))


@triton.jit
def row_maxima_kernel(
    x_ptr,
    len_ptr,
    max_ptr,
    sync_ptr,
    width,
    stride_x,
    stride_m,
    HAS_LEN: tl.constexpr,
    SUB: tl.constexpr,
    SUBS: tl.constexpr,  # sub-chunks per program
    PDL: tl.constexpr,  # let the select kernel launch now: it waits for this grid in gdc_wait
    SYNC_WORDS: tl.constexpr,  # int32 words a row at sync_ptr to zero (0: none; else a power of two)
):
    """maxima[row, j] = largest order key among entries [j*SUB, (j+1)*SUB) of the row (0 where
    none is valid): the one pass over the whole row, spread over many programs. With SYNC_WORDS,
    sync[row, :] = 0 too: kernels.topk_fused's arrival counters, zeroed here every call, need
    no memset and hold no state between calls or CUDA-graph replays."""
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    if SYNC_WORDS > 0:  # one program of the row
        w = tl.arange(0, SYNC_WORDS)
        # the program as a bound rather than a scalar bool broadcast over the block: Triton 3.9's
        # interpreter splats a scalar int1 into int32 data, which tl.store refuses as a mask
        tl.store(
            sync_ptr + row * SYNC_WORDS + w,
            tl.zeros([SYNC_WORDS], tl.int32),
            mask=w < tl.where(tl.program_id(1) == 0, SYNC_WORDS, 0),
        )
    n = width
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), width)
    sub = tl.program_id(1) * SUBS + tl.arange(0, SUBS)
    t = sub[:, None] * SUB + tl.arange(0, SUB)[None, :]
    ok = t < n
    key = tl.where(ok, order_key(tl.load(x_ptr + row * stride_x + t, mask=ok, other=0.0)), 0)
    m = tl.max(key, axis=1)
    tl.store(max_ptr + row * stride_m + sub, m.to(tl.int32, bitcast=True))


def check_triton_args(
    logits: torch.Tensor, k: int, lengths: torch.Tensor | None, out: torch.Tensor | None
) -> None:
    """What every Triton top-k kernel takes: float32 logits contiguous in the last dim, int32
    lengths [bs] and out int32 [bs, k] (each optional) on the logits' device."""
    A.tensor("logits", logits, torch.float32, ndim=2, last_contiguous=True)
    check_topk_args(logits, k)
    A.need(logits.shape[1] < 2**31, f"rows of {logits.shape[1]} logits do not fit int32 indices")
    bs = logits.shape[0]
    if lengths is not None:
        A.tensor("lengths", lengths, torch.int32, shape=(bs,), contiguous=True)
        A.same_device(logits=logits, lengths=lengths)
    if out is not None:
        A.tensor("out", out, torch.int32, shape=(bs, k), last_contiguous=True)
        A.same_device(logits=logits, out=out)


def run_launches(launches: tuple[Launch, ...], logits: torch.Tensor) -> torch.Tensor:
    """Each launch checked for the device, then run in order (nothing for 0 rows); the last one's
    out, the top-k indices."""
    for launch in launches:
        A.launchable(launch.kernel, logits.device)
    if logits.shape[0]:
        for launch in launches:
            run(launch)
    return launches[-1].args["out_ptr"]


def sub_chunks(width: int, k: int, target: int) -> tuple[int, int]:
    """(SUB, NUM_MAX): sub-chunk length (>= 16) and the power-of-two count of sub-chunk maxima,
    about `target` of them and at least 2k where the row allows (the k-th largest must exist)."""
    target = max(target, triton.next_power_of_2(2 * k))
    sub = max(16, triton.next_power_of_2(triton.cdiv(width, target)))
    return sub, triton.next_power_of_2(triton.cdiv(width, sub))
