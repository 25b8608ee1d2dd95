"""Where a tensor's elements lie in memory, from its shape and strides alone (any device): the bytes
from its first element to one past its last, and the layout of a strided view whose elements leave
gaps. Backend-neutral: the simulator's allocator and capture and the CUDA trace recorder share it."""

import torch

__all__ = ["extent", "layout"]


def layout(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(shape, stride, itemsize) of a tensor whose elements leave gaps in its extent (a strided
    view), None for a dense one: the audit compares gapped accesses element by element."""
    if t.numel() == 0 or extent(t) == t.numel() * t.element_size():
        return None
    return tuple(t.shape), tuple(t.stride()), t.element_size()


def extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to one past its last, over its strides."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)) * t.element_size()
