"""Torch custom ops over the kernels, the form the model calls: on CUDA the Triton kernel, on the
CPU the torch reference, under fake tensors nothing. As ops they carry names (csi::...) that the
trace, the audit and CSAN report, and they capture into CUDA graphs like any aten op.

OP_ROLES says, for each of these ops, what its arguments are (read, written, the paged cache, the
per-request lengths): tools that model an op without running it (the CPU simulator's replay
timing) read the roles here instead of knowing the ops by name.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels.logits import (
    indexer_logits_bf16_,
    indexer_logits_fp8_,
    ref_logits_bf16,
    ref_logits_fp8,
)
from kernels.logits_args import check_bf16_args, check_fp8_args
from kernels.paged import PAGE, live_len, pad_logits
from kernels.topk import ref_topk_indices, topk_indices_triton

__all__ = ["OP_ROLES", "OpRoles", "indexer_logits_bf16", "indexer_logits_fp8", "topk_indices_op"]


def _into(out, seq_lens, ref):
    """The reference on the live columns only, padded with -inf into out (kernels.paged)."""
    pad_logits(ref(live_len(seq_lens, out.shape[1])), out.shape[1], out)


# ---------------------------------------------------------------------------
# Torch custom ops: CUDA -> Triton, CPU -> reference, fake -> nothing
# ---------------------------------------------------------------------------


@torch.library.custom_op("csi::indexer_logits_bf16", mutates_args=("out",), device_types="cpu")
def _indexer_logits_bf16_op(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    per_request: int = 0,
) -> None:
    check_bf16_args(q, w, kcache, page_table, seq_lens, out)
    _into(out, seq_lens, lambda n: ref_logits_bf16(q, w, kcache, page_table, seq_lens, n))


@_indexer_logits_bf16_op.register_kernel("cuda")
def _(q, w, kcache, page_table, seq_lens, out, per_request=0):
    indexer_logits_bf16_(q, w, kcache, page_table, seq_lens, out, per_request=per_request)


@_indexer_logits_bf16_op.register_fake
def _(q, w, kcache, page_table, seq_lens, out, per_request=0):
    return None


@torch.library.custom_op("csi::indexer_logits_fp8", mutates_args=("out",), device_types="cpu")
def _indexer_logits_fp8_op(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    per_request: int = 0,
) -> None:
    check_fp8_args(q, w, pages, page_table, seq_lens, out)
    _into(out, seq_lens, lambda n: ref_logits_fp8(q, w, pages, page_table, seq_lens, n))


@_indexer_logits_fp8_op.register_kernel("cuda")
def _(q, w, pages, page_table, seq_lens, out, per_request=0):
    indexer_logits_fp8_(q, w, pages, page_table, seq_lens, out, per_request=per_request)


@_indexer_logits_fp8_op.register_fake
def _(q, w, pages, page_table, seq_lens, out, per_request=0):
    return None


def indexer_logits_bf16(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    per_request: int = 0,
) -> None:
    """per_request > 0: that many programs per request (kernels.logits.plan), else fill the GPU."""
    torch.ops.csi.indexer_logits_bf16(q, w, kcache, page_table, seq_lens, out, per_request)


def indexer_logits_fp8(
    q: torch.Tensor,
    w: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    per_request: int = 0,
) -> None:
    torch.ops.csi.indexer_logits_fp8(q, w, pages, page_table, seq_lens, out, per_request)


# ---------------------------------------------------------------------------
# Top-k: CUDA -> the Triton kernel, CPU -> the exact reference (same tie rule: lowest index)
# ---------------------------------------------------------------------------


@torch.library.custom_op("csi::topk_indices", mutates_args=(), device_types="cpu")
def _topk_indices_op(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    return ref_topk_indices(logits, k, lengths)


@_topk_indices_op.register_kernel("cuda")
def _(logits, k, lengths=None):
    return topk_indices_triton(logits, k, lengths)


@_topk_indices_op.register_fake
def _(logits, k, lengths=None):
    return logits.new_empty(logits.shape[0], k, dtype=torch.int32)


def topk_indices_op(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.topk's contract as a torch op (csi::topk_indices): the Triton kernel on CUDA, the
    exact reference on the CPU; ties at the k-th value go to the lowest index on both."""
    return torch.ops.csi.topk_indices(logits, k, lengths)


# ---------------------------------------------------------------------------
# The ops' argument roles, for tools that model them without running them
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpRoles:
    """What one custom op's arguments are, by position in its schema. writes agrees with the op's
    mutates_args (the schema stays the authority on what an op writes). A paged op also names its
    cache, the per-request lengths that decide how much of the cache it streams, its
    programs-per-request argument, and the bytes one cached entry streams."""

    name: str  # as torch names the op: "csi::indexer_logits_bf16"
    reads: tuple[int, ...]  # tensor arguments read
    writes: tuple[int, ...] = ()  # tensor arguments written in place
    cache: int | None = None  # the paged cache (None: not a paged op)
    lengths: int | None = None  # per-request lengths (int32 [bs])
    programs: int | None = None  # programs per request (an int; 0 or absent: fill the GPU)
    entry_bytes: Callable[[torch.Tensor], int] | None = None  # from the cache tensor

    def overload(self) -> object:
        """The op's default overload (torch.ops.csi.<op>.default), registered above."""
        namespace, op = self.name.split("::")
        return getattr(getattr(torch.ops, namespace), op).default


def _bf16_entry_bytes(kcache):
    """[num_pages, PAGE, D] bfloat16: D values of 2 bytes."""
    return kcache.shape[-1] * kcache.element_size()


def _fp8_entry_bytes(pages):
    """[num_pages, PAGE*D + PAGE*4] uint8: D e4m3 bytes and a float32 scale per entry."""
    return pages.shape[-1] // PAGE


# (q, w, cache, page_table, seq_lens, out, per_request): the same positions in both layouts
_LOGITS_BF16 = OpRoles(
    "csi::indexer_logits_bf16",
    reads=(0, 1, 2, 3, 4),
    writes=(5,),
    cache=2,
    lengths=4,
    programs=6,
    entry_bytes=_bf16_entry_bytes,
)
OP_ROLES = (
    _LOGITS_BF16,
    replace(_LOGITS_BF16, name="csi::indexer_logits_fp8", entry_bytes=_fp8_entry_bytes),
    OpRoles("csi::topk_indices", reads=(0, 2), lengths=2),  # (logits, k, lengths): returns a new tensor
)
