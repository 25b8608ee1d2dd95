"""Persistent buffers: the fix. Each buffer belongs to one (stream, bucket, shape, dtype), is
allocated before capture, outside the graph pool, and lives as long as the graphs that use it.

    bufs = PersistentBuffers(dev)
    bufs.reserve("side", bucket, (bucket, max_ctx), torch.float32)   # before capturing `bucket`
    logits = bufs.get("side", bucket, (bucket, max_ctx), torch.float32)  # inside the capture

Nothing the graph pool hands out can share its bytes, since the block was never in that pool and is
never freed, so no other tensor, on any stream, can be given them. Keying by stream and bucket keeps
two concurrent users, or two buckets' graphs, from sharing one buffer. A request first made while
capturing is refused: allocated then, the buffer would come from the graph's pool, which is the bug.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["BufferKey", "PersistentBufferError", "PersistentBuffers"]

# a buffer's identity: (stream, bucket, shape, dtype)
BufferKey = tuple[str, int, tuple[int, ...], torch.dtype]


class PersistentBufferError(RuntimeError):
    """A buffer was first requested inside a capture (reserve it before capturing)."""


class PersistentBuffers:
    def __init__(self, dev: "Device"):
        self.dev = dev
        self._bufs: dict[BufferKey, torch.Tensor] = {}

    @staticmethod
    def key(stream: object, bucket: int, shape: Sequence[int], dtype: torch.dtype) -> BufferKey:
        return (str(stream), int(bucket), tuple(int(s) for s in shape), dtype)

    def reserve(
        self, stream: object, bucket: int, shape: Sequence[int], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Allocate the buffer now (a no-op when it exists). Refused while capturing."""
        k = self.key(stream, bucket, shape, dtype)
        if k not in self._bufs:
            if self.dev.is_current_stream_capturing():
                raise PersistentBufferError(
                    f"persistent buffer {_name(k)} first requested inside a capture, where it would come "
                    f"from the graph's pool: reserve it before capturing (DecodeModel.prepare(bucket) does)"
                )
            self._bufs[k] = torch.empty(k[2], dtype=dtype, device=self.dev.torch_device)
        return self._bufs[k]

    def get(
        self, stream: object, bucket: int, shape: Sequence[int], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The buffer for this key: reserved earlier, or (outside a capture) allocated now."""
        return self.reserve(stream, bucket, shape, dtype)

    def __contains__(self, k: object) -> bool:
        return k in self._bufs

    def __len__(self) -> int:
        return len(self._bufs)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._bufs.values())

    def describe(self) -> list[dict[str, Any]]:
        return [
            dict(buffer=_name(k), nbytes=t.numel() * t.element_size(), addr=hex(t.data_ptr()))
            for k, t in self._bufs.items()
        ]


def _name(k: BufferKey) -> str:
    stream, bucket, shape, dtype = k
    return f"{stream}/bucket {bucket}/{'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')}"
