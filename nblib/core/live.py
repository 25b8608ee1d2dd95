"""The live prefix of a logits row: the indexer's logits are [bs, max_ctx] fp32 (the pool geometry
the race needs), but a decode batch's entries fill only the first few hundred columns and every
later column is -inf. A pass of column-chunk maxima finds where each row's live entries end, so
top-k and comparisons can skip the -inf tail. A NaN or any finite value past the live entries (a
lost race's garbage) makes its chunk live, so a corrupted row counts as live in full.

    n = live.live_columns(logits, 16)          # logits[:, n:] is all -inf
    ends = live.live_ends(logits, 16)          # per row: logits[r, ends[r]:] is all -inf
"""

import torch

__all__ = ["CHUNK", "NEG_INF", "live_columns", "live_ends"]

CHUNK = 1024  # columns per maximum: a multiple of the indexer's page (64), small next to max_ctx
NEG_INF = float("-inf")


def live_columns(x: torch.Tensor, k: int) -> int:
    """The smallest multiple of CHUNK (at least k) past which every entry of the 2-D float tensor
    x is -inf: the widest row's live_ends; x.shape[1] when that cannot be established cheaply (odd
    widths, other dtypes)."""
    if x.dim() != 2 or x.shape[0] == 0:
        return x.shape[-1]
    return int(live_ends(x, k).max())


def live_ends(x: torch.Tensor, k: int) -> torch.Tensor:
    """Per row of the 2-D float tensor x (int64 [bs]): the smallest multiple of CHUNK (at least k)
    past which that row is all -inf; x.shape[1] for every row when that cannot be established
    cheaply."""
    bs, n = x.shape
    if not x.is_floating_point() or not x.is_contiguous() or n % CHUNK or bs == 0 or n <= CHUNK:
        return torch.full((bs,), n, dtype=torch.int64)
    live = x.view(bs, n // CHUNK, CHUNK).amax(-1) != NEG_INF  # NaN != -inf: a NaN's chunk is live
    last = (live * torch.arange(1, n // CHUNK + 1)).amax(1)  # 1 + the last live chunk, 0 if none
    return (last * CHUNK).clamp(min=min(n, -(-k // CHUNK) * CHUNK))
