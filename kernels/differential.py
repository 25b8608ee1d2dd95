"""The graph-vs-eager differential in one kernel, for nblib.instruments.gediff: per row of two
logits tensors (the captured graph's and the eager recompute's),

  max_abs        largest |graph - eager| (equal entries count 0: -inf == -inf, NaN == NaN;
                 NaN against a number counts as inf)
  argmax_differs the rows' argmaxes differ (first occurrence; NaN ranks on top, as torch.argmax)
  topk_differs   the rows' top-k index sets differ (kernels.topk's contract: -inf entries are
                 not members; ties at the k-th value go to the lowest index)

in one pass over both rows when they agree, which is every row of a healthy replay: entries that
are equal in every position have equal top-k sets, so the selection (a radix select over the whole
row, kernels.topk_keys.radix_threshold) runs only for rows that differ somewhere.

Two launches: _diff_chunks_kernel reads both rows once, spread over rows x chunks programs (each
chunk's max_abs, count of differing entries and both argmaxes), and _diff_rows_kernel, one program
per row, combines its chunks and compares the top-k sets of the rows that differ. (One program per
row reading 512 KB in dependent steps was latency-bound: 32 rows used 32 of an H200's 132 SMs.)

Layout: reference, kernel, launcher, check, benchmark.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels import args as A
from kernels.harness import median_us
from kernels.launch import Case, Launch, run
from kernels.topk import order_keys, ref_topk_indices
from kernels.topk_keys import order_key, radix_selected, radix_threshold

__all__ = [
    "DIFF_CONFIG",
    "DiffRows",
    "benchmark",
    "cases",
    "check",
    "compile_cases",
    "differential",
    "plan_differential",
    "ref_differential",
]


class DiffRows(NamedTuple):
    """Per row: max_abs float32 [rows], argmax_differs bool [rows], topk_differs bool [rows]."""

    max_abs: torch.Tensor
    argmax_differs: torch.Tensor
    topk_differs: torch.Tensor


# ---------------------------------------------------------------------------
# 1. Torch reference
# ---------------------------------------------------------------------------


def _check_args(graph, eager, k):
    A.tensor("graph", graph, torch.float32, ndim=2, last_contiguous=True)
    A.tensor("eager", eager, torch.float32, shape=tuple(graph.shape), last_contiguous=True)
    A.need(isinstance(k, int) and k >= 1, f"k must be a positive int, got {k!r}")
    A.need(k <= graph.shape[1], f"k={k} is larger than the row ({graph.shape[1]} logits)")
    A.same_device(graph=graph, eager=eager)


def ref_differential(graph: torch.Tensor, eager: torch.Tensor, k: int) -> DiffRows:
    """DiffRows in torch, the definitions above spelled out."""
    _check_args(graph, eager, k)
    g, e = graph.float(), eager.float()
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    diff = (g - e).abs().nan_to_num(nan=float("inf"), posinf=float("inf"))
    max_abs = torch.where(same, 0.0, diff).amax(1)
    # argmax by order key: NaN on top, first occurrence (torch.argmax's rule, -0.0 == +0.0)
    argmax = order_keys(g).argmax(1) != order_keys(e).argmax(1)
    topk = (ref_topk_indices(g, k) != ref_topk_indices(e, k)).any(1)
    return DiffRows(max_abs, argmax, topk)


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _argmax_update(key, ok, offs, best_key, best_idx, width):
    """Running (largest key, its first index) after one more block."""
    key = tl.where(ok, key, 0)
    bk = tl.max(key)
    bi = tl.min(tl.where(key == bk, offs, width))
    better = bk > best_key  # strictly: an earlier block keeps a tie
    return tl.where(better, bk, best_key), tl.where(better, bi, best_idx)


@triton.jit
def _diff_chunks_kernel(
    g_ptr,
    e_ptr,
    part_ptr,
    width,
    stride_g,
    stride_e,
    stride_p,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,  # let the rows kernel launch now: it waits for this grid in gdc_wait
):
    """Chunk p of a row pair, the one pass over both: its max_abs (float bits), how many entries
    differ, and each row's largest key and its first index, at part[row, field, p]."""
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    offs = p * CHUNK + tl.arange(0, CHUNK)
    ok = offs < width
    g = tl.load(g_ptr + row * stride_g + offs, mask=ok, other=0.0)
    e = tl.load(e_ptr + row * stride_e + offs, mask=ok, other=0.0)
    gk, ek = order_key(g), order_key(e)
    same = gk == ek  # float equality, with NaN == NaN (-0.0 == +0.0 as in floats)
    d = tl.abs(g - e)
    d = tl.where(d != d, float("inf"), d)  # noqa: PLR0124 (NaN: a number against NaN)
    worst = tl.max(tl.where(same | ~ok, 0.0, d))
    differ = tl.sum((ok & ~same).to(tl.int32))
    none_key, none_idx = tl.zeros([], tl.uint32), tl.zeros([], tl.int32)
    g_key, g_idx = _argmax_update(gk, ok, offs, none_key, none_idx, width)
    e_key, e_idx = _argmax_update(ek, ok, offs, none_key, none_idx, width)
    out = part_ptr + row * stride_p + p
    tl.store(out, worst.to(tl.int32, bitcast=True))
    tl.store(out + NUM_CHUNKS, differ)
    tl.store(out + 2 * NUM_CHUNKS, g_key.to(tl.int32, bitcast=True))
    tl.store(out + 3 * NUM_CHUNKS, g_idx)
    tl.store(out + 4 * NUM_CHUNKS, e_key.to(tl.int32, bitcast=True))
    tl.store(out + 5 * NUM_CHUNKS, e_idx)


@triton.jit
def _topk_mismatch(g_row, e_row, width, K, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr):
    """How many entries are in one row's top-k set and not the other's (a radix select over each
    whole row, kernels.topk_keys.radix_threshold, then one pass over both)."""
    g_sel = radix_threshold(g_row, width, K, BLOCK, RADIX_BITS, False)
    e_sel = radix_threshold(e_row, width, K, BLOCK, RADIX_BITS, False)
    g_ties = tl.zeros([], tl.int32)
    e_ties = tl.zeros([], tl.int32)
    mismatch = tl.zeros([], tl.int32)
    for start in range(0, width, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < width
        g = tl.load(g_row + offs, mask=ok, other=0.0)
        e = tl.load(e_row + offs, mask=ok, other=0.0)
        in_g, g_ties = radix_selected(order_key(g), ok, g_sel[0], g_sel[1], g_sel[2], g_sel[3], g_ties)
        in_e, e_ties = radix_selected(order_key(e), ok, e_sel[0], e_sel[1], e_sel[2], e_sel[3], e_ties)
        in_g = in_g & (g != float("-inf"))  # -inf entries are not members (-1 in top-k)
        in_e = in_e & (e != float("-inf"))
        mismatch += tl.sum((in_g != in_e).to(tl.int32))
    return mismatch


@triton.jit
def _diff_rows_kernel(
    g_ptr,
    e_ptr,
    part_ptr,
    max_ptr,
    argmax_ptr,
    topk_ptr,
    width,
    K,
    stride_g,
    stride_e,
    stride_p,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per row: its chunks' figures combined; the top-k sets compared only when
    the rows differ somewhere."""
    if PDL:
        gdc_wait()  # the chunks kernel's writes are visible after this
    row = tl.program_id(0).to(tl.int64)
    part = part_ptr + row * stride_p
    j = tl.arange(0, CHUNKS_POW2)
    ok = j < NUM_CHUNKS
    worst = tl.max(tl.load(part + j, mask=ok, other=0).to(tl.float32, bitcast=True))
    differ = tl.sum(tl.load(part + NUM_CHUNKS + j, mask=ok, other=0))
    g_key = tl.load(part + 2 * NUM_CHUNKS + j, mask=ok, other=0).to(tl.uint32, bitcast=True)
    g_idx = tl.load(part + 3 * NUM_CHUNKS + j, mask=ok, other=0)
    e_key = tl.load(part + 4 * NUM_CHUNKS + j, mask=ok, other=0).to(tl.uint32, bitcast=True)
    e_idx = tl.load(part + 5 * NUM_CHUNKS + j, mask=ok, other=0)
    # every valid key is > 0, and every chunk holds a valid entry: the padding never wins
    g_first = tl.min(tl.where(g_key == tl.max(g_key), g_idx, width))
    e_first = tl.min(tl.where(e_key == tl.max(e_key), e_idx, width))
    tl.store(max_ptr + row, worst)
    tl.store(argmax_ptr + row, (g_first != e_first).to(tl.int8))
    mismatch = tl.zeros([], tl.int32)
    if differ > 0:  # only a row that differs can have another top-k set
        mismatch = _topk_mismatch(g_ptr + row * stride_g, e_ptr + row * stride_e, width, K, BLOCK, RADIX_BITS)
    tl.store(topk_ptr + row, (mismatch > 0).to(tl.int8))


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

# chunk 4096 over 8 warps: 16 programs a row of 65536 (the one pass spread over the GPU, where one
# program a row left it latency-bound); block 4096 for the rare top-k comparison (one program a
# row). Timed by python -m kernels --bench.
# block 2048 for the rows kernel: at 4096 ptxas spilled it on sm_120 (Triton 3.6) and sm_90a (Triton 3.9)
# with 8 warps, and on sm_80 (Triton 3.9) with 16 (tests/test_kernel_compile.py compiles every target)
DIFF_CONFIG = dict(chunk=4096, chunk_warps=8, block=2048, num_warps=8, radix_bits=8, pdl=1)


def _new_out(rows, dev):
    return DiffRows(
        torch.empty(rows, device=dev),
        torch.empty(rows, dtype=torch.bool, device=dev),
        torch.empty(rows, dtype=torch.bool, device=dev),
    )


def plan_differential(
    graph: torch.Tensor,
    eager: torch.Tensor,
    k: int,
    out: DiffRows | None = None,
    config: dict | None = None,
    pdl: bool | None = None,
) -> tuple[tuple[Launch, Launch], DiffRows]:
    """The two launches (chunks, then rows) and out (a DiffRows of max_abs float32, argmax/topk
    bool, [rows]; allocated on the current stream when None), with the chunks' figures in an int32
    [rows, 6, chunks] workspace. pdl: launch the rows kernel as a programmatic dependent of the
    chunks kernel (None: on a CUDA GPU of sm_90 or later)."""
    _check_args(graph, eager, k)
    rows, dev = graph.shape[0], graph.device
    out = _new_out(rows, dev) if out is None else out
    for name, t, dtype in zip(out._fields, out, (torch.float32, torch.bool, torch.bool)):
        A.tensor(f"out.{name}", t, dtype, shape=(rows,), contiguous=True)
        A.same_device(graph=graph, **{f"out.{name}": t})
    cfg = dict(DIFF_CONFIG, **(config or {}))
    A.need(set(cfg) <= set(DIFF_CONFIG), f"unknown config keys {sorted(set(cfg) - set(DIFF_CONFIG))}")
    chunk = cfg["chunk"]
    A.need(chunk >= 16 and chunk & (chunk - 1) == 0, f"chunk must be a power of two >= 16, got {chunk}")
    width = graph.shape[1]
    chunks = triton.cdiv(width, chunk)
    part = torch.empty(rows, 6, chunks, dtype=torch.int32, device=dev)
    if pdl is None:
        pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    pdl = bool(pdl and cfg["pdl"])
    common = dict(g_ptr=graph, e_ptr=eager, part_ptr=part, width=width, stride_g=graph.stride(0))
    common.update(stride_e=eager.stride(0), stride_p=part.stride(0), NUM_CHUNKS=chunks, PDL=pdl)
    rows_args = dict(common, max_ptr=out.max_abs, K=k, CHUNKS_POW2=triton.next_power_of_2(chunks))
    rows_args.update(
        argmax_ptr=out.argmax_differs.view(torch.int8), topk_ptr=out.topk_differs.view(torch.int8)
    )
    rows_args.update(BLOCK=cfg["block"], RADIX_BITS=cfg["radix_bits"])
    launches = (
        Launch(
            _diff_chunks_kernel, (rows, chunks), dict(common, CHUNK=chunk), dict(num_warps=cfg["chunk_warps"])
        ),
        Launch(_diff_rows_kernel, (rows,), rows_args, dict(num_warps=cfg["num_warps"], launch_pdl=pdl)),
    )
    return launches, out


def differential(
    graph: torch.Tensor,
    eager: torch.Tensor,
    k: int,
    out: DiffRows | None = None,
    *,
    config: dict | None = None,
) -> DiffRows:
    """DiffRows by the Triton kernels (float32 [rows, width] each, on CUDA). No host sync."""
    launches, out = plan_differential(graph, eager, k, out, config)
    for launch in launches:
        A.launchable(launch.kernel, graph.device)
    if graph.shape[0]:
        for launch in launches:
            run(launch)
    return out


def compile_cases(arch: int) -> list[Case]:
    """The model's shape, as a GPU of that arch runs it (from sm_90 the rows kernel is a
    programmatic dependent of the chunks kernel)."""
    g = torch.empty(64, 65536)
    chunks, rows = plan_differential(g, g, 512, pdl=arch >= 90)[0]
    return [
        Case("differential_chunks", chunks, tensor_core=False, tma=False, pdl=arch >= 90),
        Case("differential_rows", rows, tensor_core=False, tma=False, pdl=arch >= 90),
    ]


# ---------------------------------------------------------------------------
# 4. check()
# ---------------------------------------------------------------------------


def cases(
    device: str = "cuda", rows: int = 6, width: int = 10000, k: int = 64, seed: int = 0
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, graph, eager): agreeing rows, and rows that differ in each of the three ways (width
    10000: three blocks of 4096, the last one partial)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, width, generator=g)
    x[:, 7::31] = float("-inf")
    same = x.clone()
    jump = x.clone()  # one entry jumps to the top: all three differ, in row 0 only
    jump[0, 3] = 1e30
    tiny = x.clone()  # a rounding-size change far from the top: only max_abs
    low = int(x[1].nan_to_num(neginf=float("inf")).argmin())  # the smallest finite entry
    tiny[1, low] = x[1, low] - 1e-3
    nan = x.clone()
    nan[2, 11] = float("nan")  # NaN ranks on top: max_abs inf, argmax and top-k differ
    swap = x.clone()  # the k-th largest swapped for the (k+1)-th: top-k differs, argmax not
    order = x[3].argsort(descending=True)
    a, b = int(order[k - 1]), int(order[k])
    swap[3, a], swap[3, b] = x[3, b], x[3, a]
    ties = torch.randint(0, 3, (rows, width), generator=g).float()
    ties_moved = ties.clone()  # the same multiset, ties at the k-th value moved: top-k differs
    ties_moved[4] = ties[4].flip(0)
    top = x.clone()
    top[5, width - 7] = 100.0  # the row's maximum, in the last block
    first = top.clone()
    first[5, 100] = 100.0  # the same maximum again, earlier: eager's argmax is the first one
    to = lambda t: t.to(device)
    return [
        (name, to(x), to(other))
        for name, other in (
            ("agree", same),
            ("jump", jump),
            ("tiny", tiny),
            ("nan", nan),
            ("kth_swap", swap),
        )
    ] + [("ties", to(ties), to(ties_moved)), ("first_max", to(top), to(first))]


def check(device: str = "cuda", rows: int = 6, width: int = 10000, k: int = 64) -> dict:
    """The kernel equals ref_differential on every case, and each case shows what it should."""
    seen = {}
    for name, graph, eager in cases(device, rows, width, k):
        got, want = differential(graph, eager, k), ref_differential(graph, eager, k)
        for field, a, b in zip(DiffRows._fields, got, want):
            if not torch.equal(a, b):
                raise AssertionError(f"{name}: {field} {a.tolist()} != reference {b.tolist()}")
        seen[name] = [int(v.sum()) if v.dtype == torch.bool else float(v.max()) for v in got]
    return seen


# ---------------------------------------------------------------------------
# 5. benchmark()
# ---------------------------------------------------------------------------


def benchmark(rows: int = 32, width: int = 65536, k: int = 512, device: str = "cuda") -> list[dict]:
    """Rows for the bench table: the kernel on agreeing rows (the instrument's steady state), the
    torch reference (the path this kernel replaces on CUDA), and the kernel on rows that all differ
    (the rare case)."""
    g = torch.randn(rows, width, device=device)
    e = g.clone()
    e_diff = g.clone()
    e_diff[:, 0] = 1e30
    out = _new_out(rows, device)
    nbytes = 2 * g.numel() * 4
    table: list[dict] = []
    for name, fn in (
        ("triton_differential", lambda: differential(g, e, k, out)),
        ("torch_differential", lambda: ref_differential(g, e, k)),
        ("triton_differential_all_differ", lambda: differential(g, e_diff, k, out)),
    ):
        us = median_us(fn)
        table.append(dict(name=name, us=us, bytes=nbytes, gbps=nbytes / us * 1e-3))
    for r in (table[0], table[2]):
        r.update(speedup_vs_torch=table[1]["us"] / r["us"], vs="torch_differential")
    return table
