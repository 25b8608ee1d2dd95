"""The rows a replay corrupted: per row of a decode step, 1 where the replay's top-k set differs
from its eager reference's, or its output differs by more than tol times the reference's largest
|x| (at least 1). The verdict behind every corrupted-session count (nblib.engine.workload.bad_rows).

torch spends about 15 launches on it (compare, any, three casts, abs, two amax, clamp, mul, gt,
or, cast), each a few microseconds of host; a decode step is checked once, and notebook 00 alone
checks some 30,000 steps. One launch does the same.

NaN follows torch's amax: a NaN anywhere in the row's difference or in its reference makes that
row's maximum NaN, and NaN > x is false, so the output test does not flag such a row (the top-k
test still can). The kernel keeps exactly these semantics, so its verdicts are torch's.

Layout: reference, kernel, launcher, check, benchmark.
"""

import torch
import triton
import triton.language as tl

from kernels import args as A
from kernels.harness import median_us
from kernels.launch import Case, Launch, run

__all__ = [
    "BAD_ROWS_CONFIG",
    "bad_rows",
    "bad_rows_",
    "benchmark",
    "check",
    "compile_cases",
    "plan_bad_rows",
    "ref_bad_rows",
]

# ---------------------------------------------------------------------------
# 1. Torch reference
# ---------------------------------------------------------------------------


def ref_bad_rows(
    out: torch.Tensor, ref_out: torch.Tensor, topk: torch.Tensor, ref_topk: torch.Tensor, tol: float
) -> torch.Tensor:
    """uint8 [bs]: 1 where the row's top-k or output diverged from the reference."""
    bad = (topk != ref_topk).any(1)
    scale = ref_out.float().abs().amax(1).clamp(min=1.0)
    bad |= (out.float() - ref_out.float()).abs().amax(1) > tol * scale
    return bad.to(torch.uint8)


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _bad_rows_kernel(
    out_ptr, ref_ptr, topk_ptr, ref_topk_ptr, flags_ptr, n_out, n_k,
    s_out, s_ref, s_topk, s_ref_topk, tol,
    BLOCK_OUT: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program per row: the top-k entries that differ, then the largest |out - ref| and |ref|
    with NaNs counted apart (torch's amax would return NaN for the row)."""
    row = tl.program_id(0).to(tl.int64)
    differ = tl.zeros([BLOCK_K], tl.int32)
    for start in range(0, n_k, BLOCK_K):
        offs = start + tl.arange(0, BLOCK_K)
        ok = offs < n_k
        a = tl.load(topk_ptr + row * s_topk + offs, mask=ok, other=0)
        b = tl.load(ref_topk_ptr + row * s_ref_topk + offs, mask=ok, other=0)
        differ += (a != b).to(tl.int32)
    max_d = tl.zeros([BLOCK_OUT], tl.float32)
    max_r = tl.zeros([BLOCK_OUT], tl.float32)
    nans = tl.zeros([BLOCK_OUT], tl.int32)
    for start in range(0, n_out, BLOCK_OUT):
        offs = start + tl.arange(0, BLOCK_OUT)
        ok = offs < n_out
        o = tl.load(out_ptr + row * s_out + offs, mask=ok, other=0.0).to(tl.float32)
        r = tl.load(ref_ptr + row * s_ref + offs, mask=ok, other=0.0).to(tl.float32)
        d = tl.abs(o - r)
        a = tl.abs(r)
        nan = (d != d) | (a != a)  # noqa: PLR0124  (NaN is the one value unequal to itself)
        nans += nan.to(tl.int32)
        max_d = tl.maximum(max_d, tl.where(nan, 0.0, d))
        max_r = tl.maximum(max_r, tl.where(nan, 0.0, a))
    scale = tl.maximum(tl.max(max_r, 0), 1.0)
    out_bad = (tl.max(max_d, 0) > tol * scale) & (tl.sum(nans, 0) == 0)
    bad = (tl.sum(differ, 0) > 0) | out_bad
    tl.store(flags_ptr + row, bad.to(tl.uint8))


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

BAD_ROWS_CONFIG = dict(block_out=1024, block_k=512, num_warps=4)  # a [bs, 4096] bf16 row: 4 steps


def _rows(name, t, dtypes):
    A.tensor(name, t, dtypes, ndim=2)
    A.need(t.stride(1) == 1, f"{name} must have contiguous rows (stride 1 along dim 1), got {t.stride()}")


def plan_bad_rows(
    out: torch.Tensor,
    ref_out: torch.Tensor,
    topk: torch.Tensor,
    ref_topk: torch.Tensor,
    flags: torch.Tensor,
    tol: float,
    config: dict | None = None,
) -> Launch:
    floats, ints = (torch.bfloat16, torch.float16, torch.float32), (torch.int32, torch.int64)
    for name, t, dtypes in (("out", out, floats), ("ref_out", ref_out, floats)):
        _rows(name, t, dtypes)
    for name, t in (("topk", topk), ("ref_topk", ref_topk)):
        _rows(name, t, ints)
    A.need(out.shape == ref_out.shape, f"out {tuple(out.shape)} and ref_out {tuple(ref_out.shape)} differ")
    A.need(
        topk.shape == ref_topk.shape,
        f"topk {tuple(topk.shape)} and ref_topk {tuple(ref_topk.shape)} differ",
    )
    A.need(out.shape[0] == topk.shape[0], f"out has {out.shape[0]} rows, topk {topk.shape[0]}")
    A.tensor("flags", flags, torch.uint8, shape=(out.shape[0],), contiguous=True)
    A.same_device(out=out, ref_out=ref_out, topk=topk, ref_topk=ref_topk, flags=flags)
    cfg = dict(BAD_ROWS_CONFIG, **(config or {}))
    args = dict(
        out_ptr=out, ref_ptr=ref_out, topk_ptr=topk, ref_topk_ptr=ref_topk, flags_ptr=flags,
        n_out=out.shape[1], n_k=topk.shape[1],
        s_out=out.stride(0), s_ref=ref_out.stride(0), s_topk=topk.stride(0), s_ref_topk=ref_topk.stride(0),
        tol=float(tol), BLOCK_OUT=cfg["block_out"], BLOCK_K=cfg["block_k"],
    )  # fmt: skip
    return Launch(_bad_rows_kernel, (out.shape[0],), args, dict(num_warps=cfg["num_warps"]))


def bad_rows_(
    out: torch.Tensor,
    ref_out: torch.Tensor,
    topk: torch.Tensor,
    ref_topk: torch.Tensor,
    flags: torch.Tensor,
    tol: float,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """Triton: flags[b] = 1 where row b diverged (ref_bad_rows' definition). Allocates nothing."""
    launch = plan_bad_rows(out, ref_out, topk, ref_topk, flags, tol, config)
    A.launchable(launch.kernel, out.device)
    if out.shape[0]:
        run(launch)
    return flags


def bad_rows(
    out: torch.Tensor, ref_out: torch.Tensor, topk: torch.Tensor, ref_topk: torch.Tensor, tol: float
) -> torch.Tensor:
    """The rows that diverged: the kernel on CUDA, the reference elsewhere."""
    if out.device.type == "cuda":
        flags = torch.empty(out.shape[0], dtype=torch.uint8, device=out.device)
        return bad_rows_(out, ref_out, topk, ref_topk, flags, tol)
    return ref_bad_rows(out, ref_out, topk, ref_topk, tol)


def compile_cases(arch: int) -> list[Case]:
    out, topk = torch.zeros(40, 4096, dtype=torch.bfloat16), torch.zeros(40, 512, dtype=torch.int32)
    flags = torch.empty(40, dtype=torch.uint8)
    launch = plan_bad_rows(out, out, topk, topk, flags, 1e-2)
    return [Case("bad_rows", launch, tensor_core=False, tma=False)]


# ---------------------------------------------------------------------------
# 4. check()
# ---------------------------------------------------------------------------


def check(device: str = "cuda", bs: int = 40, width: int = 4096, k: int = 512, seed: int = 0) -> dict:
    """Kernel vs reference on a step where some rows differ in one top-k entry, some in one output
    value above the tolerance, one just below it, and rows with NaN and inf in the output or the
    reference (where torch's amax decides the verdict)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ref = (torch.randn(bs, width, generator=g) * 3).bfloat16()
    ref_topk = torch.randint(0, 1 << 16, (bs, k), generator=g, dtype=torch.int32)
    out, topk = ref.clone(), ref_topk.clone()
    topk[1, k - 1] += 1
    scale = ref.float().abs().amax(1).clamp(min=1.0)
    out[2, 7] = ref[2, 7].float() + 0.5 * scale[2]  # above a tolerance of 0.01
    out[3, 9] = ref[3, 9].float() + 0.004 * scale[3]  # below it
    out[4, 0], ref[5, 1], out[6, 2], ref[7, 3] = float("nan"), float("nan"), float("inf"), float("inf")
    out[8, 0], ref[8, 0] = float("inf"), float("inf")  # inf - inf: NaN
    # a NaN beside a difference above the tolerance: torch's amax is NaN, so the row is not flagged
    out[9, 0], out[9, 1] = float("nan"), ref[9, 1].float() + 0.5 * scale[9]
    out, ref, topk, ref_topk = (t.to(device) for t in (out, ref, topk, ref_topk))
    flags = torch.empty(bs, dtype=torch.uint8, device=device)
    got = bad_rows_(out, ref, topk, ref_topk, flags, 1e-2)
    want = ref_bad_rows(out, ref, topk, ref_topk, 1e-2)
    if not torch.equal(got, want):
        raise AssertionError(f"rows differ: kernel {got.tolist()} vs reference {want.tolist()}")
    if got[:4].tolist() != [0, 1, 1, 0] or got[9] != 0:
        raise AssertionError(
            f"the planted rows 0-3 and 9 read {got[[0, 1, 2, 3, 9]].tolist()}, not [0, 1, 1, 0, 0]"
        )
    return dict(rows=bs, flagged=int(got.sum()))


# ---------------------------------------------------------------------------
# 5. benchmark()
# ---------------------------------------------------------------------------


def benchmark(bs: int = 40, width: int = 4096, k: int = 512, device: str = "cuda") -> list[dict]:
    """Rows for the bench table: a gpu-profile step (bucket 40), the kernel against torch."""
    ref = torch.randn(bs, width, device=device).bfloat16()
    topk = torch.randint(0, 1 << 16, (bs, k), device=device, dtype=torch.int32)
    out, flags = ref.clone(), torch.empty(bs, dtype=torch.uint8, device=device)
    nbytes = 2 * (ref.numel() * ref.element_size() + topk.numel() * topk.element_size())
    rows: list[dict] = []
    for name, fn in (
        ("triton_bad_rows", lambda: bad_rows_(out, ref, topk, topk, flags, 1e-2)),
        ("torch_bad_rows", lambda: ref_bad_rows(out, ref, topk, topk, 1e-2)),
    ):
        us = median_us(fn)
        rows.append(dict(name=name, us=us, bytes=nbytes, gbps=nbytes / us * 1e-3))
    rows[0]["speedup_vs_torch"] = rows[1]["us"] / rows[0]["us"]
    return rows
