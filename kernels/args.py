"""Argument checks shared by every public kernel entry: bad input raises a one-line ValueError
that names the argument and what it must be, before anything is launched. Host-side only (shapes,
dtypes, devices, strides), so the checks never sync and are safe inside CUDA graph capture."""

import torch
from triton.runtime.interpreter import InterpretedFunction

__all__ = ["launchable", "need", "same_device", "tensor"]


def need(ok: object, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def tensor(
    name: str,
    x: torch.Tensor,
    dtypes: torch.dtype | tuple[torch.dtype, ...] | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    contiguous: bool = False,
    last_contiguous: bool = False,
) -> None:
    """x is a torch.Tensor with one of `dtypes`, `ndim` dims, `shape` (None entries: any size).
    The messages are formatted only on failure: every custom op on the CPU checks its arguments
    at every call, so the passing path stays free of string work."""
    if not isinstance(x, torch.Tensor):
        need(False, f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None:
        dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
        if x.dtype not in dtypes:
            need(False, f"{name} must be {' or '.join(map(str, dtypes))}, got {x.dtype}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and x.dim() != ndim:
        need(False, f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if shape is not None and not all(s is None or s == n for s, n in zip(shape, x.shape)):
        want = tuple("*" if s is None else s for s in shape)
        need(False, f"{name} must have shape {want}, got {tuple(x.shape)}".replace("'*'", "*"))
    if contiguous and not x.is_contiguous():
        need(False, f"{name} must be contiguous (call .contiguous()), got strides {x.stride()}")
    if last_contiguous and not (x.dim() == 0 or x.stride(-1) == 1):
        need(False, f"{name} must be contiguous in its last dim")


def same_device(**tensors: torch.Tensor) -> None:
    devices = {str(x.device) for x in tensors.values()}
    need(len(devices) == 1, f"{', '.join(tensors)} must be on one device, got {sorted(devices)}")


def launchable(kernel: object, device: torch.device) -> None:
    """Triton kernels run on CUDA tensors (or anywhere under the Triton interpreter)."""
    need(
        device.type == "cuda" or isinstance(kernel, InterpretedFunction),
        f"the Triton kernel needs CUDA tensors, got {device}; on the CPU call the custom op or the "
        f"torch reference instead",
    )
