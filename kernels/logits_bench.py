"""Timing the logits kernel (kernels.logits): its rows of the bench table, and the launch-config
sweep that stands behind kernels.logits_configs.CONFIGS.

The sweep times every config of logits_configs.candidates(kind, heads, dim, arch) on this GPU at
the benchmark's shape, checks each one's logits against the default config's (a fast wrong
config must not win), and reports the fastest per (kind, heads, dim, arch) with the CONFIGS line
that would adopt it. `python -m kernels --sweep --out DIR` writes the table. Both time only the
cache dtypes this GPU runs (no fp8 below sm_89: kernels.launch.supports).
"""

from collections.abc import Callable

import torch

from kernels.harness import median_us
from kernels.launch import supports, target_of
from kernels.logits import (
    indexer_logits_bf16_,
    indexer_logits_fp8_,
    ref_logits_bf16,
    ref_logits_fp8,
)
from kernels.logits_configs import candidates, config_for
from kernels.paged import FP8_MAX, PAGE, quantize_fp8_pages

__all__ = ["adopt_lines", "bench_inputs", "benchmark", "logit_bytes", "sweep"]


def logit_bytes(bs: int, ctx: int, heads: int, dim: int, fp8: bool) -> int:
    """Bytes a logits call must move: K (+ fp8 scales), q, w, page table, lengths, logits out."""
    k = bs * ctx * (dim + 4 if fp8 else 2 * dim)
    q = bs * heads * dim * (1 if fp8 else 2)
    return k + q + bs * heads * 4 + bs * (ctx // PAGE) * 4 + bs * 4 + bs * ctx * 4


def bench_inputs(bs: int, ctx: int, heads: int, dim: int, device: str | torch.device, seed: int = 0) -> dict:
    """Full-length requests, each reading its own pages scattered over the cache (a permutation)."""
    g = torch.Generator(device=device).manual_seed(seed)
    n_pages = bs * ctx // PAGE
    q = torch.randn(bs, heads, dim, device=device, generator=g).bfloat16()
    k = torch.randn(n_pages, PAGE, dim, device=device, generator=g).bfloat16()
    return dict(
        q=q,
        q8=q.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn),
        w=torch.randn(bs, heads, device=device, generator=g),
        k=k,
        pages=quantize_fp8_pages(k),
        page_table=torch.randperm(n_pages, device=device, generator=g).view(bs, -1).int(),
        seq_lens=torch.full((bs,), ctx, dtype=torch.int32, device=device),
        out=torch.empty(bs, ctx, device=device),
    )


def _calls(x, config=None):
    """{kind: () -> None}: the two kernels on the bench inputs."""
    q, q8, w, pt, sl, out = (x[n] for n in ("q", "q8", "w", "page_table", "seq_lens", "out"))
    return dict(
        bf16=lambda: indexer_logits_bf16_(q, w, x["k"], pt, sl, out, config=config),
        fp8=lambda: indexer_logits_fp8_(q8, w, x["pages"], pt, sl, out, config=config),
    )


def benchmark(
    bs: int = 32, ctx: int = 65536, heads: int = 64, dim: int = 128, device: str = "cuda"
) -> list[dict]:
    """Bench rows: both kernels with the table's configs and their torch references."""
    x = bench_inputs(bs, ctx, heads, dim, device)
    q, q8, w, pt, sl = (x[n] for n in ("q", "q8", "w", "page_table", "seq_lens"))
    refs = dict(
        bf16=lambda: ref_logits_bf16(q, w, x["k"], pt, sl, ctx),
        fp8=lambda: ref_logits_fp8(q8, w, x["pages"], pt, sl, ctx),
    )
    rows = []
    arch = target_of(torch.device(device)).arch
    for kind, fn in _calls(x).items():
        if not supports(kind, arch):
            continue
        nbytes = logit_bytes(bs, ctx, heads, dim, kind == "fp8")
        us, ref_us = median_us(fn), median_us(refs[kind])
        rows.append(dict(name=f"triton_logits_{kind}", us=us, bytes=nbytes, speedup_vs_torch=ref_us / us))
        rows.append(dict(name=f"torch_logits_{kind}", us=ref_us, bytes=nbytes))
    return rows


def _same_logits(out, want):
    """Same -inf mask, no NaN, finite parts equal to fp32 accumulation-order noise."""
    fin = torch.isfinite(want)
    if not torch.equal(torch.isfinite(out), fin) or torch.isnan(out).any():
        return False
    return float((out[fin] - want[fin]).norm() / want[fin].norm().clamp_min(1e-30)) < 1e-4


def sweep(
    bs: int = 32,
    ctx: int = 65536,
    heads: int = 64,
    dim: int = 128,
    device: str = "cuda",
    rep_ms: float = 40,
    progress: Callable[[str], object] | None = print,
) -> list[dict]:
    """One row per (kind, config): us, ok (logits match the default config's), and the best per
    kind flagged. Never raises on a config that fails: its row says why."""
    x = bench_inputs(bs, ctx, heads, dim, device)
    target = target_of(torch.device(device))  # its SMs and shared memory, read from the device
    arch, smem = target.arch, target.smem_per_block
    rows = []
    for kind in [k for k in ("bf16", "fp8") if supports(k, arch)]:
        nbytes = logit_bytes(bs, ctx, heads, dim, kind == "fp8")
        default = config_for(kind, arch, heads, dim, smem)
        _calls(x, default)[kind]()
        want = x["out"].clone()
        for cfg in candidates(kind, heads, dim, arch, smem):
            row = dict(kind=kind, heads=heads, dim=dim, arch=arch, **cfg._asdict(), default=cfg == default)
            try:
                x["out"].fill_(float("nan"))
                fn = _calls(x, cfg)[kind]
                fn()
                row.update(ok=_same_logits(x["out"], want), us=median_us(fn, rep_ms=rep_ms))
                row["gbps"] = nbytes / row["us"] * 1e-3
            except Exception as e:  # a config this GPU cannot run: recorded, not fatal
                row.update(ok=False, us=float("nan"), error=f"{type(e).__name__}: {str(e)[:160]}")
            rows.append(row)
            if progress:
                progress(f"sweep {kind} {cfg}: {row.get('us', float('nan')):.1f} us ok={row['ok']}")
        timed = [r for r in rows if r["kind"] == kind and r["ok"]]
        if timed:
            best = min(timed, key=lambda r: r["us"])
            best["best"] = True
            base = next((r for r in timed if r["default"]), None)
            for r in timed:
                r["vs_default"] = base["us"] / r["us"] if base else float("nan")
    return rows


def adopt_lines(rows: list[dict]) -> list[str]:
    """The CONFIGS entries the sweep's winners would be, as text to paste (none: no winner)."""
    from kernels.logits_configs import LogitsConfig

    lines = []
    for r in rows:
        if r.get("best") and not r["default"]:
            cfg = LogitsConfig(**{f: r[f] for f in LogitsConfig._fields})
            lines.append(f'("{r["kind"]}", {r["arch"] // 10}): {cfg!r},')
    return lines
