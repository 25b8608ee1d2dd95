"""The logits kernel's launch-config sweep: time each config for both cache dtypes, for picking
BF16_CONFIG / FP8_CONFIG. `python -m kernels --sweep --out DIR` writes the table."""

import torch

from kernels.harness import median_us
from kernels.logits import _bench_inputs, indexer_logits_bf16_, indexer_logits_fp8_
from kernels.paged import quantize_fp8_pages

SWEEP = [
    dict(block_t=bt, tiles_per_prog=tp, num_warps=nw, num_stages=ns)
    for bt in (64, 128)
    for tp in (4, 16)
    for nw in (4, 8)
    for ns in (3, 5, 7)
]


def sweep(bs=32, ctx=65536, heads=64, dim=128, device="cuda", configs=SWEEP):
    """Time each launch config for both kernels (for picking BF16_CONFIG / FP8_CONFIG)."""
    x = _bench_inputs(bs, ctx, heads, dim, device)
    q, w, k, pt, sl, out = x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], x["out"]
    pages = quantize_fp8_pages(k)
    q8 = q.to(torch.float8_e4m3fn)
    rows = []
    for cfg in configs:
        for kind, fn in (
            ("bf16", lambda cfg=cfg: indexer_logits_bf16_(q, w, k, pt, sl, out, config=cfg)),
            ("fp8", lambda cfg=cfg: indexer_logits_fp8_(q8, w, pages, pt, sl, out, config=cfg)),
        ):
            try:
                us = median_us(fn)
            except Exception as e:  # e.g. out of shared memory for a large config
                us = float("nan")
                print(f"{kind} {cfg}: {type(e).__name__}: {str(e)[:120]}")
            rows.append(dict(kind=kind, us=us, **cfg))
    return rows
