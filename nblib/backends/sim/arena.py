"""The arena: CPU memory behind the allocator's addresses.

Segments are carved from big zeroed chunks (lazily committed by the OS), 2 MiB-aligned like
cudaMalloc. A tensor the capture allocates is a view of its block's bytes that owns its own
storage, so when the allocator hands a freed block to a new tensor the two really share bytes; the
block is freed when the last tensor sharing that storage dies (CPython refcounting).
"""

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from nblib.backends.sim.allocator import MB, ROUND_LARGE
from nblib.backends.storage import extent


@dataclass(eq=False)
class Chunk:
    """One contiguous piece of CPU memory that segments are carved from."""

    base: int  # its address (2 MiB-aligned)
    nbytes: int
    used: int  # bytes handed out as segments, from the front
    array: np.ndarray  # uint8 view of the memory (keeps it alive)
    bytes: torch.Tensor  # the same memory as a uint8 tensor, for shadows

    def holds(self, addr):
        return self.base <= addr < self.base + self.nbytes


class _Owner:
    """numpy's view of one block; the block's tensors keep it alive through their storage, and a
    finalizer frees the block when the last of them dies."""

    __slots__ = ("__array_interface__", "chunk", "__weakref__")


class Arena:
    """Zeroed CPU memory in chunks; segments are carved from them."""

    def __init__(self, chunk_bytes=256 * MB):
        self.chunk_bytes = chunk_bytes
        self.chunks = []  # Chunk list

    def segment(self, nbytes):
        for c in self.chunks:
            if c.nbytes - c.used >= nbytes:
                addr = c.base + c.used
                c.used += nbytes
                return addr
        size = max(self.chunk_bytes, nbytes)
        arr = np.zeros(size + ROUND_LARGE, dtype=np.uint8)
        base = arr.ctypes.data
        pad = (-base) % ROUND_LARGE  # 2 MiB-aligned like cudaMalloc
        arr = arr[pad : pad + size]
        self.chunks.append(Chunk(base + pad, size, nbytes, arr, torch.from_numpy(arr)))
        return base + pad

    def find(self, addr):
        return next((c for c in self.chunks if c.holds(addr)), None)

    def tensor(self, addr, nbytes, dtype, size, stride, on_free):
        """A fresh tensor over [addr, addr+nbytes) that owns its own storage; on_free() runs when
        the storage dies."""
        c = self.find(addr)
        o = _Owner()
        o.__array_interface__ = dict(data=(addr, False), shape=(nbytes,), typestr="|u1", version=3)
        o.chunk = c.array
        fin = weakref.finalize(o, on_free)
        fin.atexit = False
        return torch.from_numpy(np.asarray(o)).view(dtype).as_strided(size, stride)

    def shadow(self, t):
        """A view of the same bytes as arena tensor t that does not keep t's block alive."""
        st = t.untyped_storage()
        c = self.find(st.data_ptr())
        off = st.data_ptr() - c.base  # 512-aligned, so a whole number of elements
        return c.bytes.view(t.dtype).as_strided(
            t.shape, t.stride(), off // t.element_size() + t.storage_offset()
        )

    def owns(self, t):
        return self.find(t.untyped_storage().data_ptr()) is not None


def raw_bytes(addr, nbytes):
    """The process's memory at [addr, addr+nbytes) as a uint8 tensor that owns nothing (arena bytes
    or a persistent CPU tensor's): the caller keeps the memory alive while it uses the view."""
    o = _Owner()
    o.__array_interface__ = dict(data=(addr, False), shape=(nbytes,), typestr="|u1", version=3)
    o.chunk = None
    return torch.from_numpy(np.asarray(o))


def bytes_moved(tensors):
    """What a kernel over these tensors moves, for the timing model: each distinct extent once (the
    same tensor passed twice is read once)."""
    extents = {(t.data_ptr(), extent(t)) for t in tensors if t.numel()}
    return sum(n for _, n in extents)
