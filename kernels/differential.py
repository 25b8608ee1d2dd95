"""The graph-vs-eager differential in one kernel, for nblib.instruments.gediff: per row of two
logits tensors (the captured graph's and the eager recompute's),

  max_abs        largest |graph - eager| (equal entries count 0: -inf == -inf, NaN == NaN;
                 NaN against a number counts as inf)
  argmax_differs the rows' argmaxes differ (first occurrence; NaN ranks on top, as torch.argmax)
  topk_differs   the rows' top-k index sets differ (kernels.topk's contract: -inf entries are
                 not members; ties at the k-th value go to the lowest index)

in one pass over both rows when they agree, which is every row of a healthy replay: entries that
are equal in every position have equal top-k sets, so the selection (kernels.topk's radix select,
over the whole row) runs only for rows that differ somewhere.

Layout: reference, kernel, launcher, check, benchmark.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import args as A
from kernels.harness import median_us
from kernels.launch import Case, Launch, run
from kernels.topk import _order_key, _selected, _threshold, order_keys, ref_topk_indices


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


def ref_differential(graph, eager, k):
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
def _differential_kernel(
    g_ptr,
    e_ptr,
    max_ptr,
    argmax_ptr,
    topk_ptr,
    width,
    K,
    stride_g,
    stride_e,
    BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    g_row = g_ptr + row * stride_g
    e_row = e_ptr + row * stride_e
    # the one pass: max_abs, both argmaxes, and whether the rows differ anywhere
    worst = tl.zeros([], tl.float32)
    differ = tl.zeros([], tl.int32)
    g_key, g_idx = tl.zeros([], tl.uint32), tl.zeros([], tl.int32)
    e_key, e_idx = tl.zeros([], tl.uint32), tl.zeros([], tl.int32)
    for start in range(0, width, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < width
        g = tl.load(g_row + offs, mask=ok, other=0.0)
        e = tl.load(e_row + offs, mask=ok, other=0.0)
        gk, ek = _order_key(g), _order_key(e)
        same = gk == ek  # float equality, with NaN == NaN (-0.0 == +0.0 as in floats)
        d = tl.abs(g - e)
        d = tl.where(d != d, float("inf"), d)  # noqa: PLR0124 (NaN: a number against NaN)
        worst = tl.maximum(worst, tl.max(tl.where(same | ~ok, 0.0, d)))
        differ += tl.sum((ok & ~same).to(tl.int32))
        g_key, g_idx = _argmax_update(gk, ok, offs, g_key, g_idx, width)
        e_key, e_idx = _argmax_update(ek, ok, offs, e_key, e_idx, width)
    tl.store(max_ptr + row, worst)
    tl.store(argmax_ptr + row, (g_idx != e_idx).to(tl.int8))

    mismatch = tl.zeros([], tl.int32)
    if differ > 0:  # only a row that differs can have another top-k set
        g_sel = _threshold(g_row, width, K, BLOCK, RADIX_BITS, False)
        e_sel = _threshold(e_row, width, K, BLOCK, RADIX_BITS, False)
        g_ties = tl.zeros([], tl.int32)
        e_ties = tl.zeros([], tl.int32)
        for start in range(0, width, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ok = offs < width
            g = tl.load(g_row + offs, mask=ok, other=0.0)
            e = tl.load(e_row + offs, mask=ok, other=0.0)
            in_g, g_ties = _selected(_order_key(g), ok, g_sel[0], g_sel[1], g_sel[2], g_sel[3], g_ties)
            in_e, e_ties = _selected(_order_key(e), ok, e_sel[0], e_sel[1], e_sel[2], e_sel[3], e_ties)
            in_g = in_g & (g != float("-inf"))  # -inf entries are not members (-1 in top-k)
            in_e = in_e & (e != float("-inf"))
            mismatch += tl.sum((in_g != in_e).to(tl.int32))
    tl.store(topk_ptr + row, (mismatch > 0).to(tl.int8))


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

# 4096 entries x 8 warps: 16 a thread. Untimed: python -m kernels --bench times it.
DIFF_CONFIG = dict(block=4096, num_warps=8, radix_bits=8)


def plan_differential(graph, eager, k, out=None, config=None):
    """The launch; out (a DiffRows of max_abs float32, argmax/topk bool, [rows]) is allocated on
    the current stream when None."""
    _check_args(graph, eager, k)
    rows, dev = graph.shape[0], graph.device
    if out is None:
        out = DiffRows(
            torch.empty(rows, device=dev),
            torch.empty(rows, dtype=torch.bool, device=dev),
            torch.empty(rows, dtype=torch.bool, device=dev),
        )
    for name, t, dtype in zip(out._fields, out, (torch.float32, torch.bool, torch.bool)):
        A.tensor(f"out.{name}", t, dtype, shape=(rows,), contiguous=True)
        A.same_device(graph=graph, **{f"out.{name}": t})
    cfg = dict(DIFF_CONFIG, **(config or {}))
    args = dict(
        g_ptr=graph,
        e_ptr=eager,
        max_ptr=out.max_abs,
        argmax_ptr=out.argmax_differs.view(torch.int8),
        topk_ptr=out.topk_differs.view(torch.int8),
        width=graph.shape[1],
        K=k,
        stride_g=graph.stride(0),
        stride_e=eager.stride(0),
        BLOCK=cfg["block"],
        RADIX_BITS=cfg["radix_bits"],
    )
    return Launch(_differential_kernel, (rows,), args, dict(num_warps=cfg["num_warps"])), out


def differential(graph, eager, k, out=None, *, config=None):
    """DiffRows by the Triton kernel (float32 [rows, width] each, on CUDA). No host sync."""
    launch, out = plan_differential(graph, eager, k, out, config)
    A.launchable(launch.kernel, graph.device)
    if graph.shape[0]:
        run(launch)
    return out


def compile_cases(arch):

    g = torch.empty(64, 65536)
    return [Case("differential", plan_differential(g, g, 512)[0], tensor_core=False, tma=False)]


# ---------------------------------------------------------------------------
# 4. check()
# ---------------------------------------------------------------------------


def cases(device="cuda", rows=6, width=10000, k=64, seed=0):
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


def check(device="cuda", rows=6, width=10000, k=64):
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


def benchmark(rows=32, width=65536, k=512, device="cuda"):
    """Rows for the bench table: the kernel on agreeing rows (the instrument's steady state), the
    torch reference (gediff today), and the kernel on rows that all differ (the rare case)."""
    g = torch.randn(rows, width, device=device)
    e = g.clone()
    e_diff = g.clone()
    e_diff[:, 0] = 1e30
    out = DiffRows(
        torch.empty(rows, device=device),
        torch.empty(rows, dtype=torch.bool, device=device),
        torch.empty(rows, dtype=torch.bool, device=device),
    )
    nbytes = 2 * g.numel() * 4
    table = []
    for name, fn in (
        ("triton_differential", lambda: differential(g, e, k, out)),
        ("torch_differential", lambda: ref_differential(g, e, k)),
        ("triton_differential_all_differ", lambda: differential(g, e_diff, k, out)),
    ):
        us = median_us(fn)
        table.append(dict(name=name, us=us, bytes=nbytes, gbps=nbytes / us * 1e-3))
    table[0]["speedup_vs_torch"] = table[1]["us"] / table[0]["us"]
    return table
