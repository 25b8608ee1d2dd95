"""Top-k entry indices of the indexer logits: which cached entries the sparse attention reads."""

import torch

from kernels import args as A


def check_topk_args(logits, k):
    A.tensor("logits", logits, (torch.float32, torch.float16, torch.bfloat16, torch.float64), ndim=2)
    A.need(isinstance(k, int) and k >= 1, f"k must be a positive int, got {k!r}")
    A.need(k <= logits.shape[1], f"k={k} is larger than the row ({logits.shape[1]} logits)")


def topk_indices(logits, k):
    """int32 [bs, k]: top-k entry indices, -1 where the value is -inf,
    sorted ascending with the -1s last (graph and eager results then compare as sets).
    No host sync: safe under CUDA graph capture."""
    check_topk_args(logits, k)
    vals, idx = torch.topk(logits, k, dim=-1)
    big = torch.iinfo(torch.int32).max
    idx = torch.where(vals == float("-inf"), big, idx.to(torch.int32))
    idx = idx.sort(dim=-1).values
    return torch.where(idx == big, -1, idx)
