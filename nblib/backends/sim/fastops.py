"""Host-side shortcuts for ops whose CPU implementation spends its time on work that cannot change
the result: each returns what the op returns, bit for bit, and falls back to the op itself
whenever that is not certain. They change how fast the host computes a node, never which nodes
a graph holds or how many bytes each moves, so the replay's simulated schedule (timing.py) is
the same with and without them.

The indexer's logits are [bs, max_ctx] fp32 (the pool geometry the race needs), but a decode
batch's entries fill only the first few hundred columns; every later column is -inf. torch.topk
over a whole row walks all 131,072 columns; the top k of a row whose columns from L on are all
-inf are the top k of its first L columns (L >= k), so a pass of column-chunk maxima finds L and
topk runs on the live prefix. A NaN or any finite value past the live entries (a lost race's
garbage) makes its chunk live, so corrupted rows are searched in full.

    vals, idx = fastops.topk(logits, 16)          # torch.topk(logits, 16), faster when the tail is -inf
    n = fastops.live_columns(logits, 16)          # logits[:, n:] is all -inf
"""

import torch

CHUNK = 1024  # columns per maximum: a multiple of the indexer's page (64), small next to max_ctx
NEG_INF = float("-inf")


def live_columns(x, k):
    """The smallest multiple of CHUNK (at least k) past which every entry of the 2-D float tensor
    x is -inf: the widest row's live_ends; x.shape[1] when that cannot be established cheaply (odd
    widths, other dtypes)."""
    if x.dim() != 2 or x.shape[0] == 0:
        return x.shape[-1]
    return int(live_ends(x, k).max())


def live_ends(x, k):
    """Per row of the 2-D float tensor x (int64 [bs]): the smallest multiple of CHUNK (at least k)
    past which that row is all -inf; x.shape[1] for every row when that cannot be established
    cheaply."""
    bs, n = x.shape
    if not x.is_floating_point() or not x.is_contiguous() or n % CHUNK or bs == 0 or n <= CHUNK:
        return torch.full((bs,), n, dtype=torch.int64)
    live = x.view(bs, n // CHUNK, CHUNK).amax(-1) != NEG_INF  # NaN != -inf: a NaN's chunk is live
    last = (live * torch.arange(1, n // CHUNK + 1)).amax(1)  # 1 + the last live chunk, 0 if none
    return (last * CHUNK).clamp(min=min(n, -(-k // CHUNK) * CHUNK))


def topk(x, k, dim=-1, largest=True, sorted=True):
    """torch.topk(x, k, dim, largest, sorted), over the live prefix of the last dimension when
    everything after it is -inf (largest only: the smallest of such a row are -inf)."""
    if not largest or dim not in (-1, x.dim() - 1):
        return torch.topk(x, k, dim, largest, sorted)
    n = live_columns(x, k)
    return torch.topk(x[:, :n] if n < x.shape[-1] else x, k, dim, largest, sorted)


def _topk_op(self, k, dim=-1, largest=True, sorted=True):
    return topk(self, k, dim, largest, sorted)


# aten overload -> its shortcut, with the overload's signature (the replay calls it in its place)
SHORTCUTS = {torch.ops.aten.topk.default: _topk_op}


def shortcut(func):
    """The function a replayed node runs for op `func`: its shortcut, or the op itself."""
    return SHORTCUTS.get(func, func)
