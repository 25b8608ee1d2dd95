"""Host-side shortcuts for ops whose CPU implementation spends its time on work that cannot change
the result: each returns what the op returns, bit for bit, and falls back to the op itself
whenever that is not certain. They change how fast the host computes a node, never which nodes
a graph holds or how many bytes each moves, so the replay's simulated schedule (timing.py) is
the same with and without them.

torch.topk over a whole row of the indexer's logits walks all 131,072 columns; the top k of a row
whose columns from L on are all -inf are the top k of its first L columns (L >= k), so topk runs on
the live prefix (nblib.core.live finds it).

    vals, idx = fastops.topk(logits, 16)          # torch.topk(logits, 16), faster when the tail is -inf
"""

import torch

from nblib.core.live import live_columns


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
