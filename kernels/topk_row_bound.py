"""The lower bound on a row's k-th largest key, once per row, from its sub-chunk maxima: the second
of kernels.topk_fused's three launches (one small program per row), and the digit pick its select
shares.

    pick_digit(hist, total, k_rem, prefix, RADIX_BITS)   one radix pass's digit, in one reduction
    _kth_prefix(keys, k, PASSES)                         the k-th largest key's top 8*PASSES bits
    row_bound_kernel                                     bound[row] = _kth_prefix(maxima[row], k)

Every program of the next launch reads the bound as one scalar: computed there instead, every
program of a row (16 at the model's shape) would repeat the same histogram passes.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["pick_digit", "row_bound_kernel"]


@triton.jit
def pick_digit(hist, total, k_rem, prefix, RADIX_BITS: tl.constexpr):
    """The digit of the k_rem-th largest of `total` keys from their digit histogram: (prefix with it
    appended, k_rem within its bin, whether that bin is taken whole, the bin's count). One scan and
    one reduction: the chosen bin's digit, keys above it and count travel packed in one int64 sum
    (each block-wide reduction is a barrier round trip, the select's latency)."""
    bins = tl.arange(0, 1 << RADIX_BITS)
    above = total - tl.cumsum(hist, 0)  # keys whose digit is larger than the bin's
    # exactly one bin holds the k_rem-th largest (0 < k_rem <= total); counts fit 21 bits
    hit = (above < k_rem) & (above + hist >= k_rem)
    packed = (bins.to(tl.int64) << 42) | (above.to(tl.int64) << 21) | hist.to(tl.int64)
    s = tl.sum(tl.where(hit, packed, 0))
    d = (s >> 42).to(tl.uint32)
    k_rem -= ((s >> 21) & 0x1FFFFF).to(tl.int32)  # every key above the bin is taken
    count = (s & 0x1FFFFF).to(tl.int32)
    return (prefix << RADIX_BITS) | d, k_rem, count == k_rem, count


@triton.jit
def _kth_prefix(keys, k, PASSES: tl.constexpr):
    """A lower bound on the k-th largest of a block of uint32 keys: its top 8*PASSES bits, the rest
    0 (as kernels.topk_keys.kth_largest_prefix, with pick_digit). 0 when the block holds fewer
    than k keys. At least k keys reach it and it is <= the k-th largest, so every top-k entry does."""
    n = tl.sum((keys >= 0).to(tl.int32))  # the block's size, as a scalar tensor
    t = tl.zeros([], tl.uint32)
    k_rem = tl.minimum(n, k)
    total = n
    for p in tl.static_range(PASSES):
        SH = 24 - 8 * p  # constexpr: p is a static_range index
        digit = ((keys >> SH) & 255).to(tl.int32)
        if p == 0:
            hist = tl.histogram(digit, 256)
        else:  # the keys whose higher bytes are the k-th largest's
            hist = tl.histogram(digit, 256, mask=(keys >> (SH + 8)) == t)
        t, k_rem, _, total = pick_digit(hist, total, k_rem, t, 8)
    return tl.where(n >= k, t << (32 - 8 * PASSES), 0)


@triton.jit
def row_bound_kernel(
    max_ptr,
    bound_ptr,
    K,
    stride_m,
    NUM_MAX: tl.constexpr,  # sub-chunk maxima per row, a power of two
    PASSES: tl.constexpr,
    PDL: tl.constexpr,  # a programmatic dependent of the maxima kernel, and the next launch of this
):
    if PDL:
        gdc_wait()  # the maxima are written
        gdc_launch_dependents()  # the next kernel may start loading its logits
    row = tl.program_id(0).to(tl.int64)
    maxima = tl.load(max_ptr + row * stride_m + tl.arange(0, NUM_MAX)).to(tl.uint32, bitcast=True)
    tl.store(bound_ptr + row, _kth_prefix(maxima, K, PASSES).to(tl.int32, bitcast=True))
