"""Top-k entry indices by a radix select spread over several programs per row: kernels.topk's
contract exactly (int32 [bs, k], ascending, -1 for -inf, ties at the k-th value to the lowest
index), in three launches that each keep every SM busy or finish in a few block-wide steps.

    topk_indices_radix(logits, k, lengths=None, out=None, config=None)

  1. kernels.topk._row_maxima_kernel (grid rows x programs): the largest order key of each 16-entry
     sub-chunk, the one read of the row from memory;
  2. _candidates_kernel (grid rows x chunks of CHUNK entries): each program computes the row's
     lower bound on the k-th largest key from the sub-chunk maxima (the k-th largest maximum's
     top bits: every top-k entry reaches it, kernels.topk._kth_largest_prefix), then keeps the
     entries of its own chunk that reach it (about k * (1 + 1/50) in all on random rows), in index
     order, and their count: one list per chunk, so no program waits for another;
  3. _select_kernel (one program per row): the chunks' lists one after another are the row's
     candidates in index order; up to CAP of them sit in registers, where a radix select (8 bits
     a pass from the top, stopping once the chosen bin is taken whole) finds the k-th largest key,
     and one block-wide prefix sum writes the selected indices in index order. More than CAP
     candidates (ties, sorted rows): the same select, reading the lists once per pass (exact,
     slower).

Why three launches and not one: a row's programs need each other's results twice (the bound, then
the candidate count), and a grid-wide barrier inside one kernel (FlashInfer's RadixTopKMultiCTA,
include/flashinfer/topk.cuh, syncs a row's CTAs through counters in global memory) needs its CTAs
co-resident and its counters reset between CUDA-graph replays: kernel boundaries give the same
order for free, and programmatic dependent launch (gdc_wait) hides most of their cost. The
high-bits-first digits follow the indexer top-k kernels of TensorRT-LLM (indexerTopK.cu: 11, 11
and 10 bits) and SGLang (an 8-bit coarse histogram, then candidates refined in shared memory);
here the coarse step is the sub-chunk maxima bound, which leaves so few candidates that the
refinement fits one program's registers.

Layout: reference (kernels.topk.ref_topk_indices), kernel, launcher, check (kernels.topk_check
with kernel="radix"), benchmark (kernels.topk.benchmark times it beside the other kernels).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels import args as A
from kernels import topk_keys as T
from kernels.launch import Case, Launch
from kernels.topk_keys import NEG_INF_KEY, _kth_largest, _kth_largest_prefix, _order_key

# ---------------------------------------------------------------------------
# 1. Reference: kernels.topk.ref_topk_indices (the contract, ties to the lowest index)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# 2. Triton kernels
# ---------------------------------------------------------------------------


@triton.jit
def _row_bound(max_row, K, NUM_MAX: tl.constexpr, BOUND_BITS: tl.constexpr, BOUND_PASSES: tl.constexpr):
    """The row's lower bound on its k-th largest key, from its sub-chunk maxima."""
    maxima = tl.load(max_row + tl.arange(0, NUM_MAX)).to(tl.uint32, bitcast=True)
    if BOUND_PASSES > 0:
        return _kth_largest_prefix(maxima, K, BOUND_PASSES)
    return _kth_largest(maxima, K, BOUND_BITS)


@triton.jit
def _chunk_candidates(
    x_row,
    max_row,
    ci_row,
    ck_row,
    cnt_row,
    n,
    p,
    K,
    NUM_MAX: tl.constexpr,
    CHUNK: tl.constexpr,
    BOUND_BITS: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    PDL: tl.constexpr,
):
    """Chunk p of a row of n entries: its entries whose key reaches the row's bound (and is not
    -inf), in index order, at ci_row/ck_row[p * CHUNK:], and how many at cnt_row[p]."""
    t = p * CHUNK + tl.arange(0, CHUNK)
    ok = t < n
    # the logits were written before the maxima kernel started: load them before the wait
    x = tl.load(x_row + t, mask=ok, other=0.0)
    if PDL:
        gdc_wait()  # the maxima kernel's writes are visible after this
    lower = _row_bound(max_row, K, NUM_MAX, BOUND_BITS, BOUND_PASSES)
    _store_candidates(x, t, ok, lower, ci_row, ck_row, cnt_row, p, CHUNK)


@triton.jit
def _store_candidates(x, t, ok, lower, ci_row, ck_row, cnt_row, p, CHUNK: tl.constexpr):
    """Chunk p's entries x (at indices t, valid where ok) whose key reaches `lower` and is not
    -inf, in index order, at ci_row/ck_row[p * CHUNK:], and how many at cnt_row[p] (kernels.topk_radix
    and kernels.topk_fused filter alike)."""
    key = _order_key(x)
    cand = ok & (key >= lower) & (key > NEG_INF_KEY)  # -inf entries come out as -1 anyway
    dst = p * CHUNK + tl.cumsum(cand.to(tl.int32), 0) - 1
    tl.store(ci_row + dst, t, mask=cand)
    tl.store(ck_row + dst, key.to(tl.int32, bitcast=True), mask=cand)
    tl.store(cnt_row + p, tl.sum(cand.to(tl.int32)))


@triton.jit
def _candidates_kernel(
    x_ptr,
    len_ptr,
    max_ptr,
    cidx_ptr,
    ckey_ptr,
    cnt_ptr,
    width,
    K,
    stride_x,
    stride_m,
    stride_c,
    stride_n,
    HAS_LEN: tl.constexpr,
    NUM_MAX: tl.constexpr,  # sub-chunk maxima per row, a power of two
    CHUNK: tl.constexpr,  # entries per program
    BOUND_BITS: tl.constexpr,
    BOUND_PASSES: tl.constexpr,  # 0: the exact bound, BOUND_BITS a step; n: n histogram passes
    PDL: tl.constexpr,
):
    """Chunk p of a row: _chunk_candidates, the row's candidate list p and its count."""
    if PDL:
        gdc_launch_dependents()  # the select kernel may launch now; it waits for this grid
    row = tl.program_id(0).to(tl.int64)
    n = width
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), width)
    _chunk_candidates(
        x_ptr + row * stride_x,
        max_ptr + row * stride_m,
        cidx_ptr + row * stride_c,
        ckey_ptr + row * stride_c,
        cnt_ptr + row * stride_n,
        n,
        tl.program_id(1),
        K,
        NUM_MAX,
        CHUNK,
        BOUND_BITS,
        BOUND_PASSES,
        PDL,
    )


@triton.jit
def _gather(cnt_row, ci_row, ck_row, start, CAP: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr):
    """Candidates [start, start + CAP) of the row (its chunks' lists one after another, so in
    index order): (key, index, valid)."""
    s = start + tl.arange(0, CAP)
    src = tl.zeros([CAP], tl.int32)
    ok = s < 0  # all false; a block comparison (Triton 3.9's interpreter keeps scalar bools int32)
    c = tl.zeros([], tl.int32)
    for q in tl.static_range(NUM_CHUNKS):
        cq = tl.load(cnt_row + q)
        inq = (s >= c) & (s < c + cq)
        src = tl.where(inq, s - c + q * CHUNK, src)
        ok = ok | inq
        c += cq
    key = tl.load(ck_row + src, mask=ok, other=0).to(tl.uint32, bitcast=True)
    idx = tl.load(ci_row + src, mask=ok, other=0)
    return key, idx, ok


@triton.jit
def _digit_hist(key, ok, prefix, P: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Histogram of pass P's digit over the keys whose higher digits equal prefix."""
    SH: tl.constexpr = 32 - RADIX_BITS * (P + 1)
    if P > 0:
        ok = ok & ((key >> (SH + RADIX_BITS)) == prefix)
    digit = ((key >> SH) & ((1 << RADIX_BITS) - 1)).to(tl.int32)
    return tl.histogram(digit, 1 << RADIX_BITS, mask=ok)


@triton.jit
def _pick(hist, k_rem, prefix, RADIX_BITS: tl.constexpr):
    """The digit of the k_rem-th largest key from its histogram: (prefix with it appended, k_rem
    within its bin, whether that bin is taken whole)."""
    bins = tl.arange(0, 1 << RADIX_BITS)
    ge = tl.sum(hist) - tl.cumsum(hist, 0) + hist  # keys whose digit >= d
    d = tl.maximum(tl.sum((ge >= k_rem).to(tl.int32)) - 1, 0)
    k_rem -= tl.sum(tl.where(bins == d, ge - hist, 0))  # every key above bin d is taken
    whole = tl.sum(tl.where(bins == d, hist, 0)) == k_rem
    return (prefix << RADIX_BITS) | d.to(tl.uint32), k_rem, whole


@triton.jit
def _chosen(key, ok, c, K, prefix, shift, k_rem, ties):
    """Which keys of a block the select chose, given `ties` keys equal to the threshold in
    earlier blocks (ties go to the lowest index): (selected, ties so far)."""
    hi = key >> tl.minimum(shift, 31).to(tl.uint32)  # shift 32 only when every candidate is taken
    tie = ok & (hi == prefix)
    rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
    take_all = (rank * 0 + c) <= K  # a block, not a scalar bool (see _gather)
    sel = ok & ((hi > prefix) | (tie & (rank < k_rem)) | take_all)
    return sel, ties + tl.sum(tie.to(tl.int32))


@triton.jit
def _select_in_registers(
    cnt_row,
    ci_row,
    ck_row,
    o_row,
    c,
    K,
    CAP: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """c <= CAP candidates: loaded once, every pass on registers; returns how many were written."""
    key, idx, ok = _gather(cnt_row, ci_row, ck_row, 0, CAP, NUM_CHUNKS, CHUNK)
    prefix = tl.zeros([], tl.uint32)
    shift = tl.full([], 32, tl.int32)
    k_rem = K + tl.zeros([], tl.int32)
    done = c <= K
    for p in tl.static_range(32 // RADIX_BITS):
        if not done:
            prefix, k_rem, done = _pick(
                _digit_hist(key, ok, prefix, p, RADIX_BITS), k_rem, prefix, RADIX_BITS
            )
            shift = tl.full([], 32 - RADIX_BITS * (p + 1), tl.int32)
    sel, _ = _chosen(key, ok, c, K, prefix, shift, k_rem, tl.zeros([], tl.int32))
    tl.store(o_row + tl.cumsum(sel.to(tl.int32), 0) - 1, idx, mask=sel)
    return tl.sum(sel.to(tl.int32))


@triton.jit
def _select_in_blocks(
    cnt_row,
    ci_row,
    ck_row,
    o_row,
    c,
    K,
    CAP: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """More than CAP candidates: the same select, gathering CAP at a time on every pass."""
    prefix = tl.zeros([], tl.uint32)
    shift = tl.full([], 32, tl.int32)
    k_rem = K + tl.zeros([], tl.int32)
    done = c <= K
    for p in tl.static_range(32 // RADIX_BITS):
        if not done:
            hist = tl.zeros([1 << RADIX_BITS], tl.int32)
            for start in range(0, c, CAP):
                key, _, ok = _gather(cnt_row, ci_row, ck_row, start, CAP, NUM_CHUNKS, CHUNK)
                hist += _digit_hist(key, ok, prefix, p, RADIX_BITS)
            prefix, k_rem, done = _pick(hist, k_rem, prefix, RADIX_BITS)
            shift = tl.full([], 32 - RADIX_BITS * (p + 1), tl.int32)
    taken = tl.zeros([], tl.int32)
    ties = tl.zeros([], tl.int32)
    for start in range(0, c, CAP):
        key, idx, ok = _gather(cnt_row, ci_row, ck_row, start, CAP, NUM_CHUNKS, CHUNK)
        sel, ties = _chosen(key, ok, c, K, prefix, shift, k_rem, ties)
        tl.store(o_row + taken + tl.cumsum(sel.to(tl.int32), 0) - 1, idx, mask=sel)
        taken += tl.sum(sel.to(tl.int32))
    return taken


@triton.jit
def _select_row(
    ci_row,
    ck_row,
    cnt_row,
    o_row,
    K,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    CAP: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """A row's top K from its candidate lists: the selected indices in index order, then -1s."""
    c = _candidate_count(cnt_row, NUM_CHUNKS)
    if c <= CAP:
        taken = _select_in_registers(cnt_row, ci_row, ck_row, o_row, c, K, CAP, NUM_CHUNKS, CHUNK, RADIX_BITS)
    else:
        taken = _select_in_blocks(cnt_row, ci_row, ck_row, o_row, c, K, CAP, NUM_CHUNKS, CHUNK, RADIX_BITS)
    _fill_unselected(o_row, taken, K, CAP)


@triton.jit
def _candidate_count(cnt_row, NUM_CHUNKS: tl.constexpr):
    """The row's candidates: the sum of its chunks' counts."""
    c = tl.zeros([], tl.int32)
    for q in tl.static_range(NUM_CHUNKS):
        c += tl.load(cnt_row + q)
    return c


@triton.jit
def _fill_unselected(o_row, taken, K, CAP: tl.constexpr):
    """-1 after the `taken` selected indices: -inf entries, or a row shorter than k."""
    for start in range(0, K, CAP):
        offs = start + tl.arange(0, CAP)
        tl.store(o_row + offs, tl.full([CAP], -1, tl.int32), mask=(offs >= taken) & (offs < K))


@triton.jit
def _select_kernel(
    cidx_ptr,
    ckey_ptr,
    cnt_ptr,
    out_ptr,
    K,
    stride_c,
    stride_n,
    stride_o,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    CAP: tl.constexpr,  # candidates held in registers
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()  # the candidates kernel (and so the maxima kernel) has finished
    row = tl.program_id(0).to(tl.int64)
    _select_row(
        cidx_ptr + row * stride_c,
        ckey_ptr + row * stride_c,
        cnt_ptr + row * stride_n,
        out_ptr + row * stride_o,
        K,
        NUM_CHUNKS,
        CHUNK,
        CAP,
        RADIX_BITS,
    )


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

# chunk 4096 over 8 warps: 16 programs a row at the model's shape (512 for 32 rows, about 4 an SM
# of an H200), 128 registers a thread, 2 CTAs an SM (sm_90a). cap 2048: random rows leave about
# 540 candidates for k 512; over 16 warps (93 registers), as over 8 (128) ptxas puts 24 bytes on
# the stack. Timed by python -m kernels --bench / --sweep; every config here must compile without
# spills (tests/test_kernel_compile.py).
# chunk_warps 16: at 8 the candidates kernel spilled on sm_80, sm_89 and sm_120 (Triton 3.6)
RADIX_CONFIG = dict(
    chunk=4096,
    chunk_warps=16,
    cap=2048,
    num_warps=16,
    radix_bits=8,
    bound_bits=2,
    bound_passes=2,
    maxima=4096,
    maxima_warps=4,
    pdl=1,
)


def _config(config):
    cfg = T._filter_select_config(RADIX_CONFIG, config, passes=(0, 1, 2, 3, 4))
    A.need(32 % cfg["bound_bits"] == 0, f"bound_bits must divide 32, got {cfg['bound_bits']}")
    return cfg


def plan_topk_radix(logits, k, lengths=None, out=None, config=None, pdl=None):
    """The three launches (maxima, candidates, select). Allocates on the current stream (inside a
    capture: from the graph's pool): out when None, the maxima int32 [bs, NUM_MAX], the candidate
    lists int32 [bs, chunks * CHUNK] twice and their counts int32 [bs, chunks]. pdl: launch the
    second and third as programmatic dependents (None: on a CUDA GPU of sm_90 or later)."""
    T._check_triton_args(logits, k, lengths, out)
    cfg = _config(config)
    bs, width = logits.shape
    dev = logits.device
    if out is None:
        out = torch.empty(bs, k, dtype=torch.int32, device=dev)
    sub, num_max = T._sub_chunks(width, k, cfg["maxima"])
    chunk = min(cfg["chunk"], max(16, triton.next_power_of_2(width)))
    chunks = triton.cdiv(width, chunk)
    per_prog = max(1, min(num_max, 4096 // sub))  # 4096 entries per maxima program
    maxima = torch.empty(bs, num_max, dtype=torch.int32, device=dev)
    cidx = torch.empty(bs, chunks * chunk, dtype=torch.int32, device=dev)
    ckey = torch.empty(bs, chunks * chunk, dtype=torch.int32, device=dev)
    counts = torch.empty(bs, chunks, dtype=torch.int32, device=dev)
    if pdl is None:
        pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    pdl = bool(pdl and cfg["pdl"])
    has_len = lengths is not None
    lens = lengths if has_len else logits  # unused without HAS_LEN
    common = dict(x_ptr=logits, len_ptr=lens, max_ptr=maxima, width=width, stride_x=logits.stride(0))
    common.update(stride_m=maxima.stride(0), HAS_LEN=has_len, PDL=pdl)
    maxima_args = dict(common, SUB=sub, SUBS=per_prog, sync_ptr=maxima, SYNC_WORDS=0)
    cand_args = dict(common, cidx_ptr=cidx, ckey_ptr=ckey, cnt_ptr=counts, K=k, NUM_MAX=num_max, CHUNK=chunk)
    cand_args.update(stride_c=cidx.stride(0), stride_n=counts.stride(0))
    cand_args.update(BOUND_BITS=cfg["bound_bits"], BOUND_PASSES=cfg["bound_passes"])
    select_args = dict(cidx_ptr=cidx, ckey_ptr=ckey, cnt_ptr=counts, out_ptr=out, K=k, PDL=pdl)
    select_args.update(stride_c=cidx.stride(0), stride_n=counts.stride(0), stride_o=out.stride(0))
    select_args.update(NUM_CHUNKS=chunks, CHUNK=chunk, CAP=cfg["cap"], RADIX_BITS=cfg["radix_bits"])
    dependent = dict(num_stages=1, launch_pdl=pdl)
    return (
        Launch(
            T._row_maxima_kernel, (bs, num_max // per_prog), maxima_args, dict(num_warps=cfg["maxima_warps"])
        ),
        Launch(_candidates_kernel, (bs, chunks), cand_args, dict(dependent, num_warps=cfg["chunk_warps"])),
        Launch(_select_kernel, (bs,), select_args, dict(dependent, num_warps=cfg["num_warps"])),
    )


def topk_indices_radix(logits, k, lengths=None, out=None, *, config=None):
    """kernels.topk's contract by these kernels (float32 logits on CUDA; out int32 [bs, k] is
    filled and returned, or allocated when None). No host sync: safe under CUDA graph capture."""
    return T._run_launches(plan_topk_radix(logits, k, lengths, out, config), logits)


def compile_cases(arch):
    """The launches for kernels.compile_check (through kernels.topk.compile_cases): the model's
    shape with and without lengths, as a GPU of sm_90 or later runs them."""
    x, lens = torch.empty(32, 65536), torch.zeros(32, dtype=torch.int32)
    cases = []
    for tag, lengths in (("", None), ("_lengths", lens)):
        _, cand, select = plan_topk_radix(x, 512, lengths, pdl=arch >= 90)
        cases.append(Case(f"topk_radix_candidates{tag}", cand, tensor_core=False, tma=False, pdl=arch >= 90))
        cases.append(Case(f"topk_radix_select{tag}", select, tensor_core=False, tma=False, pdl=arch >= 90))
    return cases


# ---------------------------------------------------------------------------
# 4. check(): kernels.topk_check.check(kernel="radix") (the default kernel)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# 5. benchmark()
# ---------------------------------------------------------------------------
