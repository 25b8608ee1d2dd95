"""Checking the Triton top-k kernels (kernels.topk.KERNELS) against ref_topk_indices (exact) and
torch.topk (as a set of values): random, tied, all -inf, fewer finite than k, NaN/inf/-0, one top
entry per sub-chunk, lengths and short rows, with a guard past the k-th output column."""

from typing import Any

import torch
import triton

from kernels.topk import mask_lengths, ref_topk_indices, topk_indices_triton

__all__ = ["cases", "check", "check_rows"]


def check_rows(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None, **kw: Any) -> int:
    """Triton (kw: topk_indices_triton's kernel and config) vs ref_topk_indices (exact), and vs
    torch.topk as a set of values; returns the number of rows compared. Raises AssertionError on
    any difference, or on a write past k."""
    bs = logits.shape[0]
    canary = torch.full((bs, k + 16), -7, dtype=torch.int32, device=logits.device)
    got = topk_indices_triton(logits, k, lengths, out=canary[:, :k], **kw)
    if not (canary[:, k:] == -7).all():
        raise AssertionError("the kernel wrote past the k-th output column")
    want = ref_topk_indices(logits, k, lengths)
    if not torch.equal(got, want):
        bad = (got != want).any(1).nonzero().flatten().tolist()
        raise AssertionError(f"top-k differs from ref_topk_indices in rows {bad[:10]}")
    # the same values as torch.topk picks (ties may pick other indices of equal value)
    masked = mask_lengths(logits.float(), lengths)
    vals = torch.topk(masked, k, dim=1).values.sort(1).values
    ours = masked.gather(1, want.clamp_min(0).long()).masked_fill(want < 0, float("-inf")).sort(1).values
    same = (ours == vals) | (torch.isnan(ours) & torch.isnan(vals))
    if not same.all():
        raise AssertionError(f"top-k values differ from torch.topk's in {int((~same.all(1)).sum())} rows")
    return logits.shape[0]


def cases(
    device: str = "cuda", width: int = 65536, k: int = 512, bs: int = 8, seed: int = 0
) -> list[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """Random, tied, all -inf, fewer finite than k, NaN/inf/-0, one top entry per sub-chunk,
    short (lengths, and a row of k + 3): (name, logits, lengths)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = torch.randn(bs, width, generator=g)
    tied = torch.randint(0, 4, (bs, width), generator=g).float()  # thousands of ties at the k-th
    special = rnd.clone()
    special[:, ::97] = float("inf")
    special[:, 5::89] = float("nan")
    special[:, 7::13] = float("-inf")
    special[:, 11::17] = -0.0
    few = torch.full((bs, width), float("-inf"))
    few[:, : k // 2] = torch.randn(bs, k // 2, generator=g)  # fewer finite values than k
    spread = torch.rand(bs, width, generator=g) - 2  # one top entry in each 16-entry sub-chunk:
    spread[:, ::16] = torch.rand(bs, triton.cdiv(width, 16), generator=g)  # the bound is exact
    lens = torch.randint(0, width + 1, (bs,), generator=g, dtype=torch.int32)
    lens[0], lens[-1] = 0, k - 1
    to = lambda t: t.to(device)
    return [
        ("random", to(rnd), None),
        ("tied", to(tied), None),
        ("all_-inf", to(torch.full((bs, width), float("-inf"))), None),
        ("fewer_than_k", to(few), None),
        ("nan_inf_-0", to(special), None),
        ("one_per_sub_chunk", to(spread), None),
        ("lengths", to(rnd), to(lens)),
        ("short_row", to(rnd[:, : k + 3].contiguous()), None),
    ]


def check(
    device: str = "cuda", width: int = 65536, k: int = 512, bs: int = 8, kernel: str | None = None
) -> dict[str, int]:
    """Every case of cases() with one of kernels.topk.KERNELS (None: the default); returns
    {name: rows}."""
    return {name: check_rows(x, k, lens, kernel=kernel) for name, x, lens in cases(device, width, k, bs)}
