"""A kernel launch as a value: which kernel, grid, arguments and options. Launchers build one
(the configs they pick depend on the GPU's architecture) and run it; the compile check
(kernels.compile_check) builds the same launch for sm_90a / sm_100a and compiles it on any
machine, through Triton's own argument specialization, so what it checks is what would run."""

from functools import cache
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

DEFAULT_ARCH = 90  # the interpreter on a CPU plays an H200


class Launch(NamedTuple):
    kernel: object  # a @triton.jit function (or, in tests, its interpreted twin)
    grid: tuple
    args: dict  # every kernel parameter by name, constexprs included
    options: dict  # num_warps, num_stages


def run(launch):
    launch.kernel[launch.grid](**launch.args, **launch.options)


def arch_of(device):
    """Compute capability as an int (90 for sm_90); DEFAULT_ARCH off CUDA (the interpreter)."""
    if device.type != "cuda":
        return DEFAULT_ARCH
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


@cache
def sm_count(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device):
    """Streaming multiprocessors of device (132 on an H200; the interpreter pretends the same)."""
    if device.type != "cuda":
        return 132
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def compile_for(launch, arch):
    """Compile launch for GPUTarget("cuda", arch, 32) without a GPU: the signature, constexprs and
    alignment/divisibility attributes come from Triton's binder, as at a real launch. (This uses
    JITFunction._pack_args, Triton 3.6's own step between binding and compiling.)"""
    fn = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**launch.args, **launch.options}
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )


class Case(NamedTuple):
    """One kernel launch to compile: what a launcher would run on arch, and what it should get."""

    name: str
    launch: object  # kernels.launch.Launch
    tensor_core: bool  # has a tl.dot that must land on the tensor cores
    tma: bool  # loads through a tensor descriptor
    overlap: bool | None = None  # pipelined loads overlap the dot inside a CTA (None: no claim)
    pdl: bool = False  # programmatic dependent launch: griddepcontrol instructions in the code
