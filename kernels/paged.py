"""The paged index-K cache: its two layouts and the writes that fill it.

A request's cached entry t lives at entry t % PAGE of page page_table[b, t // PAGE].

  bf16 cache   [num_pages, PAGE, D] bfloat16
  fp8 cache    [num_pages, PAGE*D + PAGE*4] uint8 per page: PAGE*D e4m3 bytes (entry-major), then
               PAGE float32 scales, one per entry (the DeepGEMM / SGLang layout, 8448 bytes at D=128)

The fp8 page is also a [PAGE + 256/D, D] byte matrix (D divides 256): rows 0..63 the values, the
rest the scales. The TMA path of the logits kernel reads it that way.

Writes are torch index_put_ ops (no Triton kernel: one small scatter per decode step), safe under
CUDA graph capture because they allocate nothing that outlives the step and never sync.
"""

import torch

from kernels import args as A

__all__ = [
    "DIM",
    "FP8_MAX",
    "FP8_PAGE_BYTES",
    "MAX_HEADS",
    "PAGE",
    "SUPPORTED_DIMS",
    "dequantize_fp8_pages",
    "fp8_page_bytes",
    "fp8_scales",
    "fp8_values",
    "fp8_views",
    "live_len",
    "pad_logits",
    "quantize_fp8_pages",
    "write_entries_bf16_",
    "write_entries_fp8_",
]

PAGE = 64  # entries per page
DIM = 128  # index head dim
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# fp8 page: PAGE*DIM e4m3 bytes (entry-major) then PAGE float32 scales.
FP8_PAGE_BYTES = PAGE * DIM + PAGE * 4  # 8448, the DeepGEMM/SGLang layout
SUPPORTED_DIMS = (32, 64, 128)  # powers of two, >= 32 for the fp8 tensor-core dot
MAX_HEADS = 128


def fp8_page_bytes(dim: int = DIM) -> int:
    """Bytes of one fp8 page at head dim `dim`: values then float32 scales."""
    return PAGE * dim + PAGE * 4


def _fp8_dim(pages):
    """Head dim of an fp8 page buffer, from its row width (PAGE*D + PAGE*4)."""
    if pages.dim() != 2 or pages.shape[1] % PAGE != 0 or pages.shape[1] // PAGE <= 4:
        raise ValueError(
            f"fp8 pages must be uint8 [num_pages, {PAGE}*D + {PAGE * 4}], got {tuple(pages.shape)}"
        )
    return pages.shape[1] // PAGE - 4


def fp8_values(pages: torch.Tensor) -> torch.Tensor:
    """View [num_pages, PAGE, D] float8_e4m3fn of the value bytes (no copy)."""
    d = _fp8_dim(pages)
    return pages[:, : PAGE * d].view(torch.float8_e4m3fn).view(-1, PAGE, d)


def fp8_scales(pages: torch.Tensor) -> torch.Tensor:
    """View [num_pages, PAGE] float32 of the per-entry scales (no copy)."""
    d = _fp8_dim(pages)
    return pages[:, PAGE * d :].view(torch.float32)


def fp8_views(pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two dtype views of one buffer (views allocate no memory): e4m3 values, float32 scales."""
    return pages.view(torch.float8_e4m3fn), pages.view(torch.float32)


def _quantize_rows(k):
    """Per-row (per-entry) e4m3 quantization: k ~= vals * scale, scale = amax / 448."""
    k = k.float()
    scale = (k.abs().amax(dim=-1) / FP8_MAX).clamp_min(1e-12)
    # clamp: k / scale can land a rounding step above 448, which e4m3fn turns into NaN
    vals = (k / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return vals, scale


def quantize_fp8_pages(k: torch.Tensor) -> torch.Tensor:
    """k [num_pages, PAGE, D] float -> uint8 [num_pages, PAGE*D + PAGE*4]."""
    if k.dim() != 3 or k.shape[1] != PAGE:
        raise ValueError(f"k must be [num_pages, {PAGE}, D], got {tuple(k.shape)}")
    vals, scale = _quantize_rows(k)
    pages = torch.empty(k.shape[0], fp8_page_bytes(k.shape[2]), dtype=torch.uint8, device=k.device)
    fp8_values(pages).view(torch.uint8).copy_(vals.view(torch.uint8))
    fp8_scales(pages).copy_(scale)
    return pages


def dequantize_fp8_pages(pages: torch.Tensor) -> torch.Tensor:
    """uint8 fp8 pages -> float32 [num_pages, PAGE, D]."""
    return fp8_values(pages).float() * fp8_scales(pages).unsqueeze(-1)


_SLOT_DTYPES = (torch.int32, torch.int64)


def _check_write(name, cache, dtype, row_shape, slots, k):
    A.tensor(name, cache, dtype, shape=(None, *row_shape), contiguous=True)
    A.tensor("slots", slots, _SLOT_DTYPES, ndim=1)
    A.tensor("k", k, ndim=2)
    A.need(k.is_floating_point(), f"k must be floating point, got {k.dtype}")
    A.need(k.shape[0] == slots.shape[0], f"k has {k.shape[0]} rows but slots has {slots.shape[0]} entries")
    A.same_device(**{name: cache, "slots": slots, "k": k})


def write_entries_bf16_(kcache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor) -> None:
    """Store k [n, D] at flat slots (page * PAGE + offset). Graph-capture safe.
    Slots are not range-checked here (that would sync): out of range fails in index_put_."""
    _check_write("kcache", kcache, torch.bfloat16, (PAGE, k.shape[-1]), slots, k)
    kcache.view(-1, kcache.shape[-1])[slots.long()] = k.to(kcache.dtype)


def write_entries_fp8_(pages: torch.Tensor, slots: torch.Tensor, k: torch.Tensor) -> None:
    """Quantize k [n, D] and store values + scales at flat slots. Graph-capture safe."""
    A.tensor("k", k, ndim=2)
    A.need(k.shape[1] in SUPPORTED_DIMS, f"k's head dim D={k.shape[1]} must be one of {SUPPORTED_DIMS}")
    _check_write("pages", pages, torch.uint8, (fp8_page_bytes(k.shape[1]),), slots, k)
    vals, scale = _quantize_rows(k)
    slots = slots.long()
    page, off = slots // PAGE, slots % PAGE
    # index_put_ through views writes straight into the page bytes; uint8 because
    # index_put_ is not implemented for float8 on every backend
    fp8_values(pages).view(torch.uint8)[page, off] = vals.view(torch.uint8)
    fp8_scales(pages)[page, off] = scale


def live_len(seq_lens: torch.Tensor, max_len: int) -> int:
    """Columns up to the longest request, rounded up to a page: every later column is -inf, so the
    references compute these only (the engine sizes max_len for its longest request, often far longer
    than a batch's). It reads the lengths on the host, so on CUDA (where the reference is a timed
    baseline) it keeps every column."""
    if seq_lens.is_cuda:
        return max_len
    longest = int(seq_lens.max().clamp(0, max_len)) if seq_lens.numel() else 0
    return min(max_len, -(-longest // PAGE) * PAGE)


def pad_logits(logits: torch.Tensor, max_len: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[bs, L] live logits -> [bs, max_len], -inf beyond L; into `out` when given (no temporary)."""
    n = logits.shape[1]
    if out is None:
        if n == max_len:
            return logits
        out = logits.new_empty((logits.shape[0], max_len))
    out[:, :n].copy_(logits)
    out[:, n:].fill_(float("-inf"))
    return out
