"""e4m3 bytes to a wider float on the host: the fp8 reference's conversion of the gathered pages,
the simulator's largest single cost on the CPU (kernels.logits.ref_logits_fp8 calls it).

    e4m3_to(raw_uint8, torch.bfloat16)   # the values of raw.view(float8_e4m3fn).to(bfloat16)
"""

import torch

__all__ = ["e4m3_to"]

_E4M3_TABLES: dict[torch.dtype, torch.Tensor] = {}
_E4M3_PAIR_TABLES: dict[torch.dtype, torch.Tensor] = {}
_PAIR_WORD = {2: torch.int32, 4: torch.int64}  # a pair of converted values, as one word to gather


def e4m3_to(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 bytes holding e4m3 values -> dtype, the same values as .view(float8_e4m3fn).to(dtype).
    On the CPU through tables (index_select), the simulator's largest single cost: torch's
    element-by-element fp8 conversion takes 4-6x the time of a table of the 65,536 byte pairs,
    each pair's two converted values gathered as one word (half the indices and index casts of a
    byte table, 1.3-1.5x faster: scripts/bench_fp8_reference.py at ec6fdfc); the byte table where
    the bytes cannot be read as pairs (an odd count or offset, a dtype wider than 4 bytes)."""
    if raw.device.type != "cpu":
        return raw.view(torch.float8_e4m3fn).to(dtype)
    flat = raw.reshape(-1)
    word = _PAIR_WORD.get(dtype.itemsize)
    if word is None or flat.numel() % 2 or flat.storage_offset() % 2:
        return _e4m3_table(dtype).index_select(0, flat.int()).view(raw.shape)
    pairs = _e4m3_pair_table(dtype, word)
    # the two bytes as one index, little-endian; through uint16 the widening needs no mask (an
    # int16 view widened then masked with 0xFFFF took twice the time of the whole conversion)
    index = flat.view(torch.uint16).int()
    return pairs.index_select(0, index).view(dtype).view(raw.shape)


def _e4m3_table(dtype):
    table = _E4M3_TABLES.get(dtype)
    if table is None:
        every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
        table = _E4M3_TABLES[dtype] = every.to(dtype)
    return table


def _e4m3_pair_table(dtype, word):
    """[65536] words: entry lo | hi << 8 holds (value of byte lo, value of byte hi) in memory
    order, as the int16 view of two little-endian bytes reads them."""
    pairs = _E4M3_PAIR_TABLES.get(dtype)
    if pairs is None:
        one = _e4m3_table(dtype)
        i = torch.arange(65536)
        both = torch.stack([one[i & 0xFF], one[i >> 8]], dim=1).contiguous()
        pairs = _E4M3_PAIR_TABLES[dtype] = both.view(word).view(-1)
    return pairs
