"""A canary over persistent buffers you name (a KV cache, a page table), around any step of yours.

Before each replay it checksums every buffer in blocks of `block` bytes, and copies the few blocks
that hold the regions the step may write; after the replay it checksums again. A block whose checksum
changed and that holds none of those regions changed where the step may not write: an alarm, with the
block's byte range. A block that holds an allowed region is compared byte by byte with its copy,
outside the region: an alarm names the exact bytes. What the canary keeps between the two is the
checksums and the copied blocks, never a copy of a whole cache.

    canary = BufferCanary({"kv": kv_cache, "pages": page_table},
                          writes=lambda: {"kv": [(slot * row_bytes, (slot + 1) * row_bytes)]})
    alarms = canary.around(graph.replay)     # [] when only the allowed bytes changed

The checksum of a block is the sum of its 32-bit words weighted by their positions, in 64-bit
integers (wrapping): any one word changed changes it, and so does a swap of two words.
"""

from collections.abc import Callable

import torch
from pydantic import BaseModel

__all__ = ["Alarm", "BufferCanary"]

Regions = dict[str, list[tuple[int, int]]]  # buffer name -> [(start byte, stop byte)]


class Alarm(BaseModel):
    """Bytes [start, stop) of buffer `buffer` changed outside the regions the step may write; `exact`:
    the range is the changed bytes themselves, else the whole block that changed."""

    buffer: str
    start: int
    stop: int
    exact: bool


def _words(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("the canary watches contiguous buffers: pass the storage's own tensor, not a view")
    raw = t.detach().reshape(-1).view(torch.uint8)
    if raw.numel() % 4:
        raise ValueError(
            f"a buffer of {raw.numel()} bytes: the canary reads 32-bit words, so a multiple of 4"
        )
    return raw.view(torch.int32)


def _checksums(words: torch.Tensor, per_block: int, chunk_blocks: int = 1 << 14) -> torch.Tensor:
    """One checksum per block of `per_block` words (the last block zero-padded), chunk by chunk so the
    64-bit temporaries stay small."""
    n_blocks = -(-words.numel() // per_block)
    weights = torch.arange(1, per_block + 1, dtype=torch.int64, device=words.device)
    out = torch.empty(n_blocks, dtype=torch.int64, device=words.device)
    for b0 in range(0, n_blocks, chunk_blocks):
        b1 = min(n_blocks, b0 + chunk_blocks)
        part = words[b0 * per_block : b1 * per_block].to(torch.int64)
        pad = (b1 - b0) * per_block - part.numel()
        if pad:
            part = torch.nn.functional.pad(part, (0, pad))
        out[b0:b1] = (part.view(b1 - b0, per_block) * weights).sum(-1)
    return out


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, stop) index runs where `mask` is true."""
    idx = torch.nonzero(mask).flatten().tolist()
    runs = []
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


class BufferCanary:
    """Checksums of named buffers around a replay; an alarm for bytes changed outside `writes()`,
    the regions (byte ranges per buffer) the step may write at this replay."""

    def __init__(
        self, buffers: dict[str, torch.Tensor], writes: Callable[[], Regions] | None = None, block: int = 4096
    ):
        if block <= 0 or block % 4:
            raise ValueError(f"block is a positive multiple of 4 bytes, got {block}")
        self.buffers = {name: _words(t) for name, t in buffers.items()}
        self.writes = writes or dict
        self.block = block
        self._before = None

    def _blocks_of(self, start, stop):
        return range(start // self.block, -(-stop // self.block))

    def before(self) -> None:
        regions = self.writes()
        unknown = set(regions) - set(self.buffers)
        if unknown:
            raise ValueError(f"writes() names buffers the canary does not watch: {sorted(unknown)}")
        per = self.block // 4
        self._before = {}
        for name, words in self.buffers.items():
            raw = words.view(torch.uint8)
            held = {b for s, e in regions.get(name, []) for b in self._blocks_of(s, e)}
            copies = {b: raw[b * self.block : (b + 1) * self.block].clone() for b in held}
            self._before[name] = (_checksums(words, per), regions.get(name, []), copies)

    def after(self) -> list[Alarm]:
        if self._before is None:
            raise RuntimeError("after() without before(): call canary.around(replay), or before() first")
        alarms, per = [], self.block // 4
        for name, words in self.buffers.items():
            sums, allowed, copies = self._before[name]
            raw = words.view(torch.uint8)
            for b in torch.nonzero(_checksums(words, per) != sums).flatten().tolist():
                lo = b * self.block
                if b not in copies:
                    alarms.append(
                        Alarm(buffer=name, start=lo, stop=min(lo + self.block, raw.numel()), exact=False)
                    )
                    continue
                now = raw[lo : lo + self.block]
                changed = now != copies[b]
                for s, e in allowed:
                    changed[max(s - lo, 0) : max(e - lo, 0)] = False
                alarms += [
                    Alarm(buffer=name, start=lo + s, stop=lo + e, exact=True) for s, e in _runs(changed)
                ]
        self._before = None
        return alarms

    def around(self, replay: Callable[[], object]) -> list[Alarm]:
        """before(), replay(), then after(): the alarms of this replay. On CUDA the checksums queue on
        the current stream behind the replay, and reading them waits for it."""
        self.before()
        replay()
        return self.after()
