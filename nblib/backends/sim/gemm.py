"""The simulator's bf16 matrix products: fp32 products and sums, one rounding to bf16.

A GPU's bf16 GEMM multiplies and accumulates in fp32 and rounds its result once; so does this.
torch's own CPU kernel for bf16 `mm`/`bmm` on a CPU without bf16 units converts element by element
and takes about 20x as long as the fp32 GEMM ([8, 256] x [256, 1024]: 27 ms against 1.5 ms on a
2-core AVX2 machine), and the model's trunk, MLP and the indexer's reference spend most of a
simulated step there.

`install()` registers these as the CPU kernels of aten::mm and aten::bmm for the whole process,
once (importing the simulator does it): eager steps, captured nodes replayed later and every
reference computed on the CPU then share one set of numerics, so a replay that lost no race
stays bit for bit equal to its eager step. Other dtypes run torch's own kernels (the `out=`
overloads, which this leaves alone); CUDA tensors never reach a CPU kernel. The op and its
schema are unchanged, so a capture still records aten::mm, with the same inputs and one output.
"""

import threading
import warnings

import torch

_installed = threading.Event()
_LIB = []  # the Library registration lives as long as the process


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten::mm on the CPU: bf16 through the fp32 GEMM, any other dtype as torch computes it."""
    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32)
        return torch.ops.aten.mm.out(a.float(), b.float(), out=out).to(torch.bfloat16)
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.promote_types(a.dtype, b.dtype))
    return torch.ops.aten.mm.out(a, b, out=out)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten::bmm on the CPU, as `mm` above for each batch entry."""
    shape = (a.shape[0], a.shape[1], b.shape[2])
    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        out = torch.empty(shape, dtype=torch.float32)
        return torch.ops.aten.bmm.out(a.float(), b.float(), out=out).to(torch.bfloat16)
    out = torch.empty(shape, dtype=torch.promote_types(a.dtype, b.dtype))
    return torch.ops.aten.bmm.out(a, b, out=out)


def install() -> None:
    """Register `mm` and `bmm` as the process's CPU kernels of aten::mm and aten::bmm (once)."""
    if _installed.is_set():
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # torch warns that a CPU kernel is being replaced: replacing it is the point
        warnings.simplefilter("ignore")
        lib.impl("mm", mm, "CPU")
        lib.impl("bmm", bmm, "CPU")
    _LIB.append(lib)
    _installed.set()
