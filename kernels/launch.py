"""A kernel launch as a value: which kernel, grid, arguments and options, and the GPU it is for.
Launchers build one (the configs they pick depend on the target: its compute capability, its SM
count and its shared memory per block) and run it; the compile check (kernels.compile_check)
builds the same launch for sm_80 ... sm_120 and compiles it on any machine, through Triton's own
argument specialization, so what it checks is what would run.

What runs where (kernels.logits_configs has the configs):

  sm_80 / sm_86 (Ampere)   bf16 through pointer loads; no fp8 (no e4m3 tensor cores): refused
  sm_89 (Ada)              bf16 and fp8 through pointer loads (no TMA on Ada)
  sm_90a (Hopper)          K through a TMA descriptor, wgmma
  sm_100a (Blackwell)      the H200's configs, tcgen05
  sm_120 (RTX Blackwell)   bf16 and fp8 through pointer loads, mma.sync (no wgmma / tcgen05)
"""

from functools import cache
from typing import Any, NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

__all__ = [
    "ARCH_FACTS",
    "ArchFacts",
    "Case",
    "DEFAULT_ARCH",
    "FP_FUSION",
    "KB",
    "Launch",
    "MIN_ARCH",
    "Target",
    "arch_of",
    "compile_for",
    "facts",
    "num_sms",
    "require",
    "run",
    "supports",
    "target_for",
    "target_of",
    "target_running",
]

DEFAULT_ARCH = 90  # the interpreter on a CPU plays an H200
KB = 1024


class Target(NamedTuple):
    """The GPU a launch is planned for."""

    arch: int  # compute capability as an int: 80 for sm_80, 120 for sm_120
    name: str  # the device's name, or "sm_<arch>" for a target compiled for and not held
    sms: int  # streaming multiprocessors
    smem_per_block: int  # bytes of shared memory one CTA may opt in to


class ArchFacts(NamedTuple):
    sms: int  # SMs of the part named beside it: a product fact, not an architecture one
    smem_per_block: int  # opt-in shared memory per block, bytes
    threads_per_sm: int  # resident threads per SM (the compile check's occupancy estimate)


# Used only where no device can say: a target compiled for and not held (kernels.compile_check),
# the interpreter on a CPU, or a torch whose device properties lack shared_memory_per_block_optin.
# Shared memory and threads: NVIDIA's per-compute-capability tables (the opt-in maximum per block
# is an SM's capacity less the 1 KB CUDA reserves per block; CUTLASS's SMEM_CAPACITY_MAP agrees).
ARCH_FACTS = {
    80: ArchFacts(108, 163 * KB, 2048),  # A100
    86: ArchFacts(84, 99 * KB, 1536),  # A40
    89: ArchFacts(142, 99 * KB, 1536),  # L40S
    90: ArchFacts(132, 227 * KB, 2048),  # H100 / H200 SXM
    100: ArchFacts(148, 227 * KB, 2048),  # B200
    120: ArchFacts(170, 99 * KB, 1536),  # RTX 5090
}
# The oldest GPU each cache dtype's tensor-core dot compiles for: bf16 mma since Ampere; e4m3
# (Triton's fp8e4nv) since Ada, whose mma.sync takes e4m3 operands.
MIN_ARCH = {"bf16": 80, "fp8": 89}


# Every launch contracts a * b + c into one FMA, as Triton did by default up to 3.9; 3.10 turns that
# default off (Triton 3.9 warns where it is left to the default). Chosen here, a kernel's rounding,
# and what its tests compare bit for bit, does not move with the Triton version or the
# TRITON_DEFAULT_FP_FUSION of the environment.
FP_FUSION = True


class Launch(NamedTuple):
    kernel: Any  # a @triton.jit function (or, in tests, its interpreted twin)
    grid: tuple
    args: dict  # every kernel parameter by name, constexprs included
    options: dict  # num_warps, num_stages

    def call_kwargs(self) -> dict:
        """What kernel[grid](...) takes: the arguments, then the options, FP fusion explicit
        (the interpreter drops what it has no use for)."""
        return {**self.args, "enable_fp_fusion": FP_FUSION, **self.options}


def run(launch: Launch) -> object:
    """Launch it; the compiled kernel Triton returns (its n_regs, n_spills on a GPU)."""
    return launch.kernel[launch.grid](**launch.call_kwargs())


def arch_of(device: torch.device) -> int:
    """Compute capability as an int (90 for sm_90); DEFAULT_ARCH off CUDA (the interpreter)."""
    if device.type != "cuda":
        return DEFAULT_ARCH
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def facts(arch: int) -> ArchFacts:
    """The table's entry for arch, or for the nearest older architecture it has."""
    known = [a for a in ARCH_FACTS if a <= arch] or [min(ARCH_FACTS)]
    return ARCH_FACTS[max(known)]


def target_for(arch: int) -> Target:
    """A Target for a GPU not held (compiling for it; the interpreter): the table's facts."""
    f = facts(arch)
    return Target(arch, f"sm_{arch}", f.sms, f.smem_per_block)


@cache
def _device_target(index):
    p = torch.cuda.get_device_properties(index)
    arch = 10 * p.major + p.minor
    # shared_memory_per_block_optin: torch 2.3 and later; older ones leave it to the table
    smem = getattr(p, "shared_memory_per_block_optin", 0) or facts(arch).smem_per_block
    return Target(arch, p.name, p.multi_processor_count, smem)


def target_of(device: torch.device) -> Target:
    """The Target of device, read from it (SM count, opt-in shared memory per block); off CUDA,
    target_for(DEFAULT_ARCH): the interpreter plays an H200."""
    if device.type != "cuda":
        return target_for(DEFAULT_ARCH)
    return _device_target(device.index if device.index is not None else torch.cuda.current_device())


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of device (132 on an H200; the interpreter pretends the same)."""
    return target_of(device).sms


def supports(dtype: str, arch: int) -> bool:
    """Whether a GPU of compute capability arch (90 for sm_90) runs the kernels on cache dtype
    "bf16" or "fp8"; the notebooks' setup leaves out the index dtypes this says no to."""
    if dtype not in MIN_ARCH:
        raise ValueError(f"cache dtype {dtype!r}: choose one of {', '.join(MIN_ARCH)}")
    return arch >= MIN_ARCH[dtype]


def require(dtype: str, target: Target) -> None:
    """A one-line ValueError unless target runs dtype, before any compile (Triton's own error for
    fp8 on Ampere names no GPU and comes from deep inside the compiler)."""
    if not supports(dtype, target.arch):
        need, sm = MIN_ARCH[dtype], f"sm_{target.arch}"
        gpu = sm if target.name == sm else f"{target.name} ({sm})"
        raise ValueError(
            f"{dtype} index keys need compute capability {need // 10}.{need % 10} or later; "
            f"{gpu} has no {dtype} tensor cores: use index dtype bf16"
        )


def target_running(dtype: str, device: torch.device, arch: int | None = None) -> Target:
    """The GPU a launch on cache dtype `dtype` is planned for: arch's (compiling for it), else
    device's; a one-line ValueError (require) where it cannot run dtype."""
    target = target_of(device) if arch is None else target_for(arch)
    require(dtype, target)
    return target


def compile_for(launch: Launch, arch: int) -> object:
    """Compile launch for GPUTarget("cuda", arch, 32) without a GPU: the signature, constexprs and
    alignment/divisibility attributes come from Triton's binder, as at a real launch. (This uses
    JITFunction._pack_args, Triton 3.6's own step between binding and compiling.)"""
    fn = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = launch.call_kwargs()
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )


class Case(NamedTuple):
    """One kernel launch to compile: what a launcher would run on arch, and what it should get."""

    name: str
    launch: Launch
    tensor_core: bool  # has a tl.dot that must land on the tensor cores
    tma: bool  # loads through a tensor descriptor
    overlap: bool | None = None  # pipelined loads overlap the dot inside a CTA (None: no claim)
    pdl: bool = False  # programmatic dependent launch: griddepcontrol instructions in the code
    # the launcher's one-line refusal of this target (launch: the same launch built without the
    # check, which the compile check expects to fail); "" where the launcher runs it
    refused: str = ""
