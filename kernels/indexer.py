"""The indexer's public surface, as the model (nblib.engine.model) and the instruments call it:
page layouts and writes (kernels.paged), logits (kernels.logits), top-k (kernels.topk).
To move the model's top-k onto the Triton kernel, call topk_indices_op where it calls
topk_indices: same arguments, same result up to ties at the k-th value (lowest index wins).
`python -m kernels.indexer ...` is `python -m kernels ...`."""

from kernels.logits import (
    indexer_logits_bf16_,
    indexer_logits_fp8_,
    ref_logits_bf16,
    ref_logits_fp8,
)
from kernels.logits_check import check, make_inputs
from kernels.ops import indexer_logits_bf16, indexer_logits_fp8, topk_indices_op
from kernels.paged import (
    DIM,
    FP8_MAX,
    FP8_PAGE_BYTES,
    PAGE,
    dequantize_fp8_pages,
    fp8_page_bytes,
    fp8_scales,
    fp8_values,
    quantize_fp8_pages,
    write_entries_bf16_,
    write_entries_fp8_,
)
from kernels.topk import ref_topk_indices, topk_indices, topk_indices_triton

__all__ = [
    "DIM",
    "FP8_MAX",
    "FP8_PAGE_BYTES",
    "PAGE",
    "check",
    "dequantize_fp8_pages",
    "fp8_page_bytes",
    "fp8_scales",
    "fp8_values",
    "indexer_logits_bf16",
    "indexer_logits_bf16_",
    "indexer_logits_fp8",
    "indexer_logits_fp8_",
    "make_inputs",
    "quantize_fp8_pages",
    "ref_logits_bf16",
    "ref_logits_fp8",
    "ref_topk_indices",
    "topk_indices",
    "topk_indices_op",
    "topk_indices_triton",
    "write_entries_bf16_",
    "write_entries_fp8_",
]

if __name__ == "__main__":
    from kernels.__main__ import main

    main()
