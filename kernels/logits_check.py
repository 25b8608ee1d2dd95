"""Checking the logits kernel (kernels.logits) against a float64 reference: random inputs whose
page ids past each request's length point outside the cache (a stray read faults), outputs
poisoned with NaN (an unwritten entry shows), and tolerances derived from the arithmetic.
Also the launches kernels.compile_check compiles for each target (compile_cases)."""

from collections.abc import Sequence

import torch
import triton

from kernels.launch import Case, arch_of, supports, target_for
from kernels.logits import (
    indexer_logits_bf16_,
    indexer_logits_fp8_,
    plan,
    plan_bf16,
    plan_fp8,
    ref_logits_bf16,
    ref_logits_fp8,
)
from kernels.logits_configs import BENCH_SHAPE, K_LOADS, LogitsConfig, as_config, config_for
from kernels.paged import FP8_MAX, PAGE, fp8_page_bytes, fp8_views, quantize_fp8_pages

__all__ = ["CHECK_CASES", "TOL", "TOL_TORCH_REF", "check", "compile_cases", "make_inputs"]

# ---------------------------------------------------------------------------
# check(): kernels vs a float64 reference
# ---------------------------------------------------------------------------

# Products of bf16 / e4m3 operands are exact in fp32, so the kernel differs from a
# float64 reference only by fp32 accumulation (~1e-6). fp8 wgmma accumulates with a
# reduced-precision adder on Hopper (~2^-13 relative), hence the looser fp8 bound.
TOL = {"bf16": 1e-3, "fp8": 2e-3}
# The torch references round scores to bf16 (~2^-9 each): reported, with a looser bound.
TOL_TORCH_REF = 1e-2


def make_inputs(
    bs: int,
    seq_lens: Sequence[int] | torch.Tensor,
    heads: int,
    dim: int,
    max_len: int,
    device: str | torch.device,
    seed: int = 0,
    garbage_pages: bool = True,
) -> dict:
    """Random inputs; page ids past each seq_len are out of range so a stray read faults."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int32)
    max_pages = max_len // PAGE + 1  # a spare column: max_len < max_pages * PAGE is legal
    live = min(triton.cdiv(int(seq_lens.max()), PAGE), max_pages)
    num_pages = bs * live + 3
    page_table = torch.randint(0, num_pages, (bs, max_pages), generator=g, dtype=torch.int32)
    page_table[:, :live] = torch.randperm(num_pages, generator=g)[: bs * live].view(bs, live).int()
    if garbage_pages:
        dead = torch.arange(max_pages)[None, :] * PAGE >= seq_lens[:, None]
        page_table[dead] = num_pages + 1_000_000
    q = torch.randn(bs, heads, dim, generator=g)
    w = torch.randn(bs, heads, generator=g)
    k = torch.randn(num_pages, PAGE, dim, generator=g)
    return dict(
        q=q.to(device),
        w=w.to(device),
        k=k.to(device),
        page_table=page_table.to(device),
        seq_lens=seq_lens.to(device),
        max_len=max_len,
    )


def _compare(out, ref, name):
    if torch.isnan(out).any():
        raise AssertionError(f"{name}: {int(torch.isnan(out).sum())} NaN in out (unwritten or bad math)")
    ninf_out, ninf_ref = torch.isneginf(out), torch.isneginf(ref)
    if not torch.equal(ninf_out, ninf_ref):
        raise AssertionError(f"{name}: -inf mask differs at {int((ninf_out != ninf_ref).sum())} positions")
    fin = ~ninf_ref
    o, r = out[fin].double(), ref[fin].double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# --check: random seq_lens (one of 7, max_len 2 pages wider than needed), page edges, smaller
# heads/dims, and max_len far past every seq_len
CHECK_CASES = [
    dict(bs=5),
    dict(bs=3, seq_lens=[1, 64, 65], heads=64),
    dict(bs=7, seq_lens=[4097, 33, 130, 1000, 64 * 40, 5, 2000], heads=32, dim=64),
    dict(bs=2, seq_lens=[200, 17], heads=8, dim=128, max_len=1024),
]


def check(
    device: str = "cuda",
    bs: int = 5,
    seq_lens: Sequence[int] | torch.Tensor | None = None,
    heads: int = 64,
    dim: int = 128,
    max_len: int | None = None,
    dtypes: tuple[str, ...] | list[str] | None = None,
    seed: int = 0,
    tol: dict[str, float] | None = None,
    fp32_operands: bool = False,
    config: LogitsConfig | dict | None = None,
) -> dict:
    """Run the kernels on random inputs, compare to a float64 reference; return errors.

    fp32_operands: feed the "bf16" kernel fp32 copies (the CPU-interpreter test path).
    config: a launch config (LogitsConfig or dict) for both kernels instead of the table's.
    dtypes: None checks the cache dtypes device runs (no fp8 below sm_89: kernels.launch.supports).
    """
    if dtypes is None:
        dtypes = [d for d in ("bf16", "fp8") if supports(d, arch_of(torch.device(device)))]
    tol = dict(TOL, **(tol or {}))
    if seq_lens is None:
        gen = torch.Generator().manual_seed(seed)
        seq_lens = torch.randint(1, 5 * PAGE, (bs,), generator=gen)
        seq_lens[0] = 7  # shorter than one page
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int32)
    if max_len is None:
        max_len = (triton.cdiv(int(seq_lens.max()), PAGE) + 2) * PAGE  # wider than needed
    x = make_inputs(bs, seq_lens, heads, dim, max_len, device, seed)
    q, w, pt, sl = x["q"], x["w"], x["page_table"], x["seq_lens"]
    errors = {}
    if "bf16" in dtypes:
        kdt = torch.float32 if fp32_operands else torch.bfloat16
        # round through bf16 so both the test and the production path see bf16 values
        qb, kb = q.bfloat16().to(kdt), x["k"].bfloat16().to(kdt)
        out = torch.full((bs, max_len), float("nan"), device=device)
        indexer_logits_bf16_(qb, w, kb, pt, sl, out, config=config)
        ref = ref_logits_bf16(qb.double(), w.double(), kb.double(), pt, sl, max_len)
        errors["bf16"] = _compare(out, ref, "bf16")
        errors["torch_ref_bf16"] = _compare(
            ref_logits_bf16(qb.to(torch.bfloat16), w, kb.to(torch.bfloat16), pt, sl, max_len),
            ref,
            "torch_ref_bf16",
        )
    if "fp8" in dtypes:
        pages = quantize_fp8_pages(x["k"])
        q8 = (q * 8).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out = torch.full((bs, max_len), float("nan"), device=device)
        indexer_logits_fp8_(q8, w, pages, pt, sl, out, config=config)
        ref = ref_logits_fp8(q8, w, pages, pt, sl, max_len, compute_dtype=torch.float64)
        errors["fp8"] = _compare(out, ref, "fp8")
        errors["torch_ref_fp8"] = _compare(
            ref_logits_fp8(q8, w, pages, pt, sl, max_len), ref, "torch_ref_fp8"
        )
    bad = {k: v for k, v in errors.items() if v > tol.get(k, TOL_TORCH_REF)}
    if bad:
        raise AssertionError(f"relative error beyond tolerance {tol}: {bad} (all: {errors})")
    return errors


# ---------------------------------------------------------------------------
# compile_cases(): what kernels.compile_check compiles for each target
# ---------------------------------------------------------------------------


def _variants(arch, config):
    """(tag, config) pairs compile_cases compiles for arch: the table's (or config), the pointer
    path pipelined (7 stages) and not (3), and the descriptor paths arch has."""
    tma_cfg = dict(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5, k_load="tma")
    variants = [("", config)]
    if arch >= 90:  # TMA
        variants += [("_tma", tma_cfg), ("_prefetch", dict(tma_cfg, scale_load="prefetch"))]
    variants += [
        ("_ptr", dict(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=7, k_load="ptr")),
        ("_ptr3", dict(block_t=128, tiles_per_prog=4, num_warps=4, num_stages=3, k_load="ptr")),
    ]
    if arch >= 100:  # TMA gather4
        variants.append(
            ("_gather", dict(block_t=128, tiles_per_prog=8, num_warps=4, num_stages=3, k_load="gather"))
        )
    return variants


def _refused_fp8(q8, w, pages, pt, sl, out, config, arch):
    """(the launcher's refusal of fp8 on arch, the launch it would have built without that check)."""
    try:
        plan_fp8(q8, w, pages, pt, sl, out, config, arch)
        refused = ""  # not refused: the compile check then compiles it, and fails there
    except ValueError as e:
        refused = str(e)
    target = target_for(arch)
    table = config_for("fp8", arch, *q8.shape[1:], target.smem_per_block)
    c = table if config is None else as_config(config)
    return refused, plan(q8, w, *fp8_views(pages), pt, sl, out, c, True, target)


def compile_cases(arch: int, config: LogitsConfig | dict | None = None) -> list[Case]:
    """The launches the table gives arch at the benchmark's shape (or config's, if given), and the
    other load paths arch has, for kernels.compile_check. CPU tensors: only their dtypes and
    alignment reach the compiler, so the cache can be tiny. Where the launcher refuses fp8 (below
    sm_89), the case carries the refusal and the launch built without the check."""
    bs, h, d, max_len = (BENCH_SHAPE[n] for n in ("bs", "heads", "dim", "ctx"))
    q, w = torch.zeros(bs, h, d, dtype=torch.bfloat16), torch.zeros(bs, h)
    pt, sl = torch.zeros(bs, max_len // PAGE, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
    out = torch.empty(bs, max_len)
    kcache = torch.zeros(4, PAGE, d, dtype=torch.bfloat16)
    pages = torch.zeros(4, fp8_page_bytes(d), dtype=torch.uint8)
    q8 = q.to(torch.float8_e4m3fn)
    cases = []
    for tag, cfg in _variants(arch, config):
        for kind in ("bf16", "fp8"):
            refused = ""
            if kind == "bf16":
                launch = plan_bf16(q, w, kcache, pt, sl, out, cfg, arch)
            elif supports("fp8", arch):
                launch = plan_fp8(q8, w, pages, pt, sl, out, cfg, arch)
            else:
                refused, launch = _refused_fp8(q8, w, pages, pt, sl, out, cfg, arch)
            tma = launch.args["K_LOAD"] != K_LOADS.index("ptr")  # the table's own entry may use TMA
            # the rule in kernels.logits_configs: > 4 stages overlap pointer copies with the dot
            overlap = None if tma else launch.options["num_stages"] > 4
            name = f"logits_{kind}{tag}"
            cases.append(Case(name, launch, tensor_core=True, tma=tma, overlap=overlap, refused=refused))
    return cases
