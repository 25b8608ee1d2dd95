"""Top-k entry indices with the select fused into the candidates' launch: kernels.topk's contract
exactly (int32 [bs, k], ascending, -1 for -inf, ties at the k-th value to the lowest index).

    topk_indices_fused(logits, k, lengths=None, out=None, config=None)

  1. kernels.topk_keys.row_maxima_kernel (grid rows x programs): the largest order key of each
     sub-chunk, the one read of the row from memory; it also zeroes the row's arrival counter;
  2. kernels.topk_row_bound.row_bound_kernel (one program per row): the row's lower bound on its
     k-th largest key, the k-th largest sub-chunk maximum's top bits, once per row (in every
     program of 3 instead, it costs as many redundant histogram passes as a row has programs);
  3. _fused_kernel (grid rows x chunks of CHUNK entries): each program keeps the entries of its
     chunk that reach the bound (about 700 in all for k 512 on random rows, 1024 maxima), in index
     order, publishes its list and count, and adds one to the row's counter; the program that
     arrives last, whose lists are then all written, selects the row's top k from them and writes
     the output: a radix select in registers over the bits below the candidates' common prefix.

The counter needs neither co-resident programs (no program waits for another: the last to arrive
does the work, the others exit) nor a reset between CUDA-graph replays (the maxima kernel, which
every call runs first, zeroes it). Ordering: every thread's stores, a block barrier, then the
counter's acq_rel atomic: the last program's acquire sees every list (CUDA's threadfence
reduction). The select runs in the filter's launch so that it starts as soon as the row's last
list is out, with no launch between.

The candidate lists: program p of a row writes its candidates (index and key) at [p * CHUNK:] of
the row's lists and their count at counts[row, p]; the chunks' lists one after another are the
row's candidates in index order. Up to CAP of them are selected in registers; more (ties, sorted
rows) take the select that reads the lists once per pass (exact, slower).

Why the select is short: every candidate lies between the bound and the row's largest key, so the
bits above the highest bit where those two differ are common to all; the radix passes (4 bits, a
histogram, one scan and one reduction each) start below them. On random rows the bound and the
largest key share their sign and exponent byte, so the passes start two digits lower. The steps
are latency-bound (one program per row is a few warps on one SM: ncu counted about 0.3 issued
instructions a cycle per scheduler in the bound pair's select), so what counts is the number of
dependent block-wide reductions, not the bytes.

Layout: reference (kernels.topk.ref_topk_indices), kernel, launcher, check (kernels.topk_check
with kernel="fused"), benchmark (kernels.topk.benchmark times it beside the other kernels).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels import args as A
from kernels import topk_keys as T
from kernels.launch import Case, Launch
from kernels.topk_keys import NEG_INF_KEY, order_key
from kernels.topk_row_bound import pick_digit, row_bound_kernel

__all__ = ["FUSED_CONFIG", "compile_cases", "plan_topk_fused", "topk_indices_fused"]

# ---------------------------------------------------------------------------
# 1. Reference: kernels.topk.ref_topk_indices (the contract, ties to the lowest index)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _store_candidates(x, t, ok, lower, ci_row, ck_row, cnt_row, p, CHUNK: tl.constexpr):
    """Chunk p's entries x (at indices t, valid where ok) whose key reaches `lower` and is not
    -inf, in index order, at ci_row/ck_row[p * CHUNK:], and how many at cnt_row[p]."""
    key = order_key(x)
    cand = ok & (key >= lower) & (key > NEG_INF_KEY)  # -inf entries come out as -1 anyway
    dst = p * CHUNK + tl.cumsum(cand.to(tl.int32), 0) - 1
    tl.store(ci_row + dst, t, mask=cand)
    tl.store(ck_row + dst, key.to(tl.int32, bitcast=True), mask=cand)
    tl.store(cnt_row + p, tl.sum(cand.to(tl.int32)))


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
def _candidate_count(cnt_row, NUM_CHUNKS: tl.constexpr):
    """The row's candidates: the sum of its chunks' counts."""
    c = tl.zeros([], tl.int32)
    for q in tl.static_range(NUM_CHUNKS):
        c += tl.load(cnt_row + q)
    return c


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
def _fill_unselected(o_row, taken, K, CAP: tl.constexpr):
    """-1 after the `taken` selected indices: -inf entries, or a row shorter than k."""
    for start in range(0, K, CAP):
        offs = start + tl.arange(0, CAP)
        tl.store(o_row + offs, tl.full([CAP], -1, tl.int32), mask=(offs >= taken) & (offs < K))


@triton.jit
def _bit_length(v):
    """Bits of a uint32 scalar up to its highest set one (0 for 0)."""
    n = tl.zeros([], tl.int32)
    for b in tl.static_range(32):
        n += ((v >> b) != 0).to(tl.int32)
    return n


@triton.jit
def _select_below_prefix(
    cnt_row,
    ci_row,
    ck_row,
    o_row,
    c,
    K,
    lower,
    CAP: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """c <= CAP candidates, all >= lower: loaded once, the radix passes on registers over the bits
    below their common prefix; writes the selected indices in index order, returns how many."""
    key, idx, ok = _gather(cnt_row, ci_row, ck_row, 0, CAP, NUM_CHUNKS, CHUNK)
    top = tl.max(tl.where(ok, key, 0))
    # the varying bits, rounded up to whole digits; the bits above them are every key's
    vary = (_bit_length(top ^ lower) + RADIX_BITS - 1) // RADIX_BITS * RADIX_BITS
    prefix = tl.where(vary >= 32, 0, top >> tl.minimum(vary, 31).to(tl.uint32))
    shift = vary  # the state: key >> shift above prefix is taken, equal to it among the first k_rem
    k_rem = K + tl.zeros([], tl.int32)
    total = c
    done = c <= K
    for p in tl.static_range(32 // RADIX_BITS):
        sh = vary - RADIX_BITS * (p + 1)
        if (not done) and (sh >= 0):
            hi = tl.where(sh + RADIX_BITS >= 32, 0, key >> tl.minimum(sh + RADIX_BITS, 31).to(tl.uint32))
            digit = ((key >> sh.to(tl.uint32)) & ((1 << RADIX_BITS) - 1)).to(tl.int32)
            hist = tl.histogram(digit, 1 << RADIX_BITS, mask=ok & (hi == prefix))
            prefix, k_rem, done, total = pick_digit(hist, total, k_rem, prefix, RADIX_BITS)
            shift = sh
    sel, _ = _chosen(key, ok, c, K, prefix, shift, k_rem, tl.zeros([], tl.int32))
    tl.store(o_row + tl.cumsum(sel.to(tl.int32), 0) - 1, idx, mask=sel)
    return tl.sum(sel.to(tl.int32))


@triton.jit
def _select_last(
    ci_row,
    ck_row,
    cnt_row,
    o_row,
    K,
    lower,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    CAP: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The row's top K from its candidate lists: the selected indices in index order, then -1s."""
    c = _candidate_count(cnt_row, NUM_CHUNKS)
    if c <= CAP:
        taken = _select_below_prefix(
            cnt_row, ci_row, ck_row, o_row, c, K, lower, CAP, NUM_CHUNKS, CHUNK, RADIX_BITS
        )
    else:  # ties or sorted rows: the lists read once per pass (exact, slower)
        taken = _select_in_blocks(cnt_row, ci_row, ck_row, o_row, c, K, CAP, NUM_CHUNKS, CHUNK, RADIX_BITS)
    _fill_unselected(o_row, taken, K, CAP)


@triton.jit
def _filter_chunk(
    x_ptr, len_ptr, bound_ptr, cidx_ptr, ckey_ptr, cnt_ptr, arrived_ptr, row, width,
    stride_x, stride_c, stride_n, HAS_LEN: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """This program's chunk of the row: its candidate list and count published, then one arrival
    on the row's counter. Returns (the row's bound, the arrivals before this one)."""
    p = tl.program_id(1)
    n = width
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), width)
    t = p * CHUNK + tl.arange(0, CHUNK)
    ok = t < n
    # the logits were written before the maxima kernel started: load them before the wait
    x = tl.load(x_ptr + row * stride_x + t, mask=ok, other=0.0)
    if PDL:
        gdc_wait()  # the bound (and the maxima, and the zeroed counter) are written
    lower = tl.load(bound_ptr + row).to(tl.uint32, bitcast=True)
    cnt_row = cnt_ptr + row * stride_n
    _store_candidates(
        x, t, ok, lower, cidx_ptr + row * stride_c, ckey_ptr + row * stride_c, cnt_row, p, CHUNK
    )
    # every thread's list entries are stored before one thread's release publishes them
    tl.debug_barrier()
    return lower, tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _fused_kernel(
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
    CHUNK: tl.constexpr,  # entries per program
    NUM_CHUNKS: tl.constexpr,  # programs per row
    CAP: tl.constexpr,  # candidates the select holds in registers
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent of the kernel before
):
    row = tl.program_id(0).to(tl.int64)
    lower, arrived = _filter_chunk(
        x_ptr, len_ptr, bound_ptr, cidx_ptr, ckey_ptr, cnt_ptr, arrived_ptr, row, width,
        stride_x, stride_c, stride_n, HAS_LEN, CHUNK, PDL,
    )  # fmt: skip
    if arrived == NUM_CHUNKS - 1:  # every other chunk's list is out (their releases, our acquire)
        ci_row, ck_row = cidx_ptr + row * stride_c, ckey_ptr + row * stride_c
        o_row = out_ptr + row * stride_o
        _select_last(
            ci_row, ck_row, cnt_ptr + row * stride_n, o_row, K, lower, NUM_CHUNKS, CHUNK, CAP, RADIX_BITS
        )


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

# chunk: entries per program of 3 (a row's programs each filter one chunk, then the last
# selects), num_warps its warps: 4096 over 8 is 512 programs at the model's shape, two an SM;
# cap: candidates the select holds in registers; radix_bits: the select's digit (4: a 16-bin
# histogram a pass, far fewer instructions than 256 bins); maxima: sub-chunk maxima per row (1024:
# a quarter of the bound's histogram work of 4096, for about 700 candidates instead of 545 on
# random rows); bound_passes: 8-bit passes of the bound; bound_warps: the bound kernel's warps;
# maxnreg: a cap on the fused kernel's registers per thread (0: ptxas decides). No cap: more
# resident programs do not make the filter faster (capped at 80 it took 22.4 us against 22.5, at
# 64 it spilled and took 22.8; outputs/bench/h200-3cd84e1-topk-occupancy/README.md).
# Each value is the fastest measured on the H200 ([32, 65536], k 512): this config 21.7 us against
# radix_bits 8 22.6, maxima 2048 22.9 and 4096 24.3, one bound pass (cap 2048) 26.4, chunk 8192
# over 16 warps 26.0; the bound has a launch of its own because computed in every program of 3 it
# took 25.6 us, and from the row's first program while the others wait on its flag 23.9 against
# 21.9 (outputs/bench/h200-b6db959-topk/: variants.md, README.md; timed by python -m kernels
# --sweep and scripts/topk_variants.py at 92c5e18). Every config here must compile without spills
# (tests/test_kernel_compile.py).
FUSED_CONFIG = dict(
    chunk=4096,
    num_warps=8,
    cap=1024,
    radix_bits=4,
    maxima=1024,
    maxima_warps=4,
    bound_passes=2,
    bound_warps=8,
    pdl=1,
    maxnreg=0,
)


def _config(config: dict | None) -> dict:
    """FUSED_CONFIG updated by `config`, checked for what the kernels' code assumes."""
    cfg = dict(FUSED_CONFIG, **(config or {}))
    A.need(set(cfg) <= set(FUSED_CONFIG), f"unknown config keys {sorted(set(cfg) - set(FUSED_CONFIG))}")
    A.need(
        cfg["radix_bits"] in (1, 2, 4, 8),
        f"radix_bits must divide 32 and be 8 or less, got {cfg['radix_bits']}",
    )
    A.need(cfg["bound_passes"] in (1, 2, 3, 4), f"bound_passes must be 1 to 4, got {cfg['bound_passes']}")
    for key in ("chunk", "cap"):
        v = cfg[key]
        A.need(v >= 16 and v & (v - 1) == 0, f"{key} must be a power of two >= 16, got {v}")
    cap = cfg["maxnreg"]
    A.need(cap == 0 or 24 <= cap <= 255, f"maxnreg must be 0 (ptxas decides) or 24 to 255, got {cap}")
    return cfg


def plan_topk_fused(
    logits: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    pdl: bool | None = None,
) -> tuple[Launch, Launch, Launch]:
    """The three launches (maxima, row bound, fused). Allocates on the current stream (inside a
    capture: from the graph's pool): out when None, the maxima int32 [bs, NUM_MAX], the bounds
    int32 [bs], the candidate lists int32 [bs, chunks * CHUNK] twice, their counts int32
    [bs, chunks] and the arrival counters int32 [bs]. pdl: launch each after the first as a
    programmatic dependent (None: on a CUDA GPU of sm_90 or later)."""
    T.check_triton_args(logits, k, lengths, out)
    cfg = _config(config)
    bs, width = logits.shape
    dev = logits.device
    if out is None:
        out = torch.empty(bs, k, dtype=torch.int32, device=dev)
    sub, num_max = T.sub_chunks(width, k, cfg["maxima"])
    chunk = min(cfg["chunk"], max(16, triton.next_power_of_2(width)))
    chunks = triton.cdiv(width, chunk)
    per_prog = max(1, min(num_max, 4096 // sub))  # 4096 entries per maxima program
    i32: dict = dict(dtype=torch.int32, device=dev)
    maxima, bound, arrived = torch.empty(bs, num_max, **i32), torch.empty(bs, **i32), torch.empty(bs, **i32)
    cidx, ckey = torch.empty(bs, chunks * chunk, **i32), torch.empty(bs, chunks * chunk, **i32)
    counts = torch.empty(bs, chunks, **i32)
    if pdl is None:
        pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    pdl = bool(pdl and cfg["pdl"])
    has_len = lengths is not None
    lens = lengths if has_len else logits  # unused without HAS_LEN
    maxima_args = dict(x_ptr=logits, len_ptr=lens, max_ptr=maxima, sync_ptr=arrived, width=width)
    maxima_args.update(stride_x=logits.stride(0), stride_m=maxima.stride(0), HAS_LEN=has_len, SUB=sub)
    maxima_args.update(SUBS=per_prog, PDL=pdl, SYNC_WORDS=1)  # arrived[row] = 0
    bound_args = dict(max_ptr=maxima, bound_ptr=bound, K=k, stride_m=maxima.stride(0), NUM_MAX=num_max)
    bound_args.update(PASSES=cfg["bound_passes"], PDL=pdl)
    fused_args: dict = dict(
        x_ptr=logits, len_ptr=lens, bound_ptr=bound, cidx_ptr=cidx, ckey_ptr=ckey, cnt_ptr=counts
    )
    fused_args.update(arrived_ptr=arrived, out_ptr=out, width=width, K=k, stride_x=logits.stride(0))
    fused_args.update(stride_c=cidx.stride(0), stride_n=counts.stride(0), stride_o=out.stride(0))
    fused_args.update(HAS_LEN=has_len, CHUNK=chunk, NUM_CHUNKS=chunks, CAP=cfg["cap"])
    fused_args.update(RADIX_BITS=cfg["radix_bits"], PDL=pdl)
    dependent = dict(num_stages=1, launch_pdl=pdl)
    fused_opts = dict(dependent, num_warps=cfg["num_warps"])
    if cfg["maxnreg"]:
        fused_opts["maxnreg"] = cfg["maxnreg"]
    return (
        Launch(
            T.row_maxima_kernel, (bs, num_max // per_prog), maxima_args, dict(num_warps=cfg["maxima_warps"])
        ),
        Launch(row_bound_kernel, (bs,), bound_args, dict(dependent, num_warps=cfg["bound_warps"])),
        Launch(_fused_kernel, (bs, chunks), fused_args, fused_opts),
    )


def topk_indices_fused(
    logits: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """kernels.topk's contract by these kernels (float32 logits on CUDA; out int32 [bs, k] is
    filled and returned, or allocated when None). No host sync: safe under CUDA graph capture."""
    return T.run_launches(plan_topk_fused(logits, k, lengths, out, config), logits)


def compile_cases(arch: int) -> list[Case]:
    """The launches for kernels.compile_check (through kernels.topk.compile_cases): the model's
    shape with and without lengths, as a GPU of sm_90 or later runs them."""
    x, lens = torch.empty(32, 65536), torch.zeros(32, dtype=torch.int32)
    pdl = arch >= 90
    cases = []
    for tag, lengths in (("", None), ("_lengths", lens)):
        maxima, bound, fused = plan_topk_fused(x, 512, lengths, pdl=pdl)
        cases.append(Case(f"topk_fused_maxima{tag}", maxima, tensor_core=False, tma=False, pdl=pdl))
        cases.append(Case(f"topk_fused_bound{tag}", bound, tensor_core=False, tma=False, pdl=pdl))
        cases.append(Case(f"topk_fused{tag}", fused, tensor_core=False, tma=False, pdl=pdl))
    return cases


# ---------------------------------------------------------------------------
# 4. check(): kernels.topk_check.check(kernel="fused")
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# 5. benchmark(): kernels.topk.benchmark
# ---------------------------------------------------------------------------
