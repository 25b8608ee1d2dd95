"""The indexer logits' argument checks, shared by the Triton launchers (kernels.logits) and the
custom ops' CPU path (kernels.ops): q, w, the page table, the lengths and out against each other
and against each layout's cache (kernels.paged), each mistake a one-line ValueError before anything
is launched or computed."""

import torch

from kernels import args as A
from kernels.paged import MAX_HEADS, PAGE, SUPPORTED_DIMS, fp8_page_bytes

__all__ = ["check_bf16_args", "check_fp8_args"]

_BF16_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # fp16/fp32: test path


def _check_common(q, w, page_table, seq_lens, out):
    A.tensor("q", q, ndim=3, last_contiguous=True)
    bs, h, d = q.shape
    A.need(d in SUPPORTED_DIMS, f"q's head dim D={d} is not supported; use one of {SUPPORTED_DIMS}")
    A.need(1 <= h <= MAX_HEADS, f"q's heads H={h} must be in [1, {MAX_HEADS}]")
    A.tensor("w", w, torch.float32, shape=(bs, h), last_contiguous=True)
    A.tensor("page_table", page_table, torch.int32, shape=(bs, None), last_contiguous=True)
    A.tensor("seq_lens", seq_lens, torch.int32, shape=(bs,), contiguous=True)
    A.tensor("out", out, torch.float32, shape=(bs, None), last_contiguous=True)
    max_len, max_pages = out.shape[1], page_table.shape[1]
    A.need(
        max_len % PAGE == 0 and max_len <= max_pages * PAGE,
        f"out's width max_len={max_len} must be a multiple of {PAGE} and <= page_table's "
        f"max_pages*{PAGE}={max_pages * PAGE}",
    )
    A.same_device(q=q, w=w, page_table=page_table, seq_lens=seq_lens, out=out)


def check_bf16_args(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The bf16 kernel's arguments (q bf16, or fp16/fp32 on the test path; kcache of q's dtype,
    [pages, PAGE, D]): a one-line ValueError naming the first that is wrong."""
    _check_common(q, w, page_table, seq_lens, out)
    A.tensor("q", q, _BF16_KERNEL_DTYPES)
    A.tensor("kcache", kcache, q.dtype, shape=(None, PAGE, q.shape[2]), contiguous=True)
    A.same_device(q=q, kcache=kcache)


def check_fp8_args(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The fp8 kernel's arguments (q e4m3; pages uint8 [pages, fp8_page_bytes(D)]): a one-line
    ValueError naming the first that is wrong."""
    _check_common(q, w, page_table, seq_lens, out)
    A.tensor("q", q, torch.float8_e4m3fn)
    A.tensor("pages", pages, torch.uint8, shape=(None, fp8_page_bytes(q.shape[2])), contiguous=True)
    A.same_device(q=q, pages=pages)
