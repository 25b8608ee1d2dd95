"""Top-k entry indices of the indexer logits: which cached entries the sparse attention reads."""

import torch


def topk_indices(logits, k):
    """int32 [bs, min(k, width)]: top-k entry indices, -1 where the value is -inf,
    sorted ascending with the -1s last (graph and eager results then compare as sets).
    No host sync: safe under CUDA graph capture."""
    k = min(k, logits.shape[-1])
    vals, idx = torch.topk(logits, k, dim=-1)
    big = torch.iinfo(torch.int32).max
    idx = torch.where(vals == float("-inf"), big, idx.to(torch.int32))
    idx = idx.sort(dim=-1).values
    return torch.where(idx == big, -1, idx)
