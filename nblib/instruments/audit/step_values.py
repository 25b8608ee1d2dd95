"""What `--confirm` compares: the persistent state a captured step writes (saved once, restored
before each run, read after it) and the step's values against an eager run's, bit for bit, with the
dtype's rounding counted apart (nblib.instruments.audit.confirm runs the comparison)."""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils._pytree import tree_flatten

from nblib.instruments.audit.trace import site

__all__ = ["Difference", "StepState", "beyond_rounding", "differences", "persistent_writes", "same_bits"]


@dataclass
class _Range:
    addr: int
    nbytes: int
    dtype: object
    name: str


def persistent_writes(trace):
    """The ranges outside the capture's pool that the step's ops write (overlapping ones merged),
    each named by its first writer's line."""
    writes = [(a, op) for op in trace.ops for a in op.accesses if a.alloc is None and a.writes]
    spans = sorted(((a.addr, a.addr + a.nbytes, a.dtype, op) for a, op in writes), key=lambda s: s[0])
    out = []
    for lo, hi, dtype, op in spans:
        if out and lo < out[-1].addr + out[-1].nbytes:
            last = out[-1]
            last.nbytes = max(last.nbytes, hi - last.addr)
            continue
        out.append(_Range(lo, hi - lo, dtype, f"persistent bytes written by {op.name} at {site(op.stack)}"))
    return out


class StepState:
    """The persistent ranges' bytes: saved once, restored before each run, read after it."""

    def __init__(self, dev, ranges):
        self.dev, self.ranges = dev, ranges
        self.saved = [dev.bytes_at(r.addr, r.nbytes).clone() for r in ranges]

    def restore(self):
        for r, b in zip(self.ranges, self.saved):
            self.dev.bytes_at(r.addr, r.nbytes).copy_(b)

    def values(self, result, copy=True):
        """(name, tensor) for the step's return value and every persistent range: copies, or with
        copy=False views of the live bytes (to compare at once, before the next run)."""
        outs = [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]
        name = lambda i: f"the step's output {i}" if len(outs) > 1 else "the step's output"  # noqa: E731
        keep = (lambda t: t.detach().clone()) if copy else (lambda t: t.detach())  # noqa: E731
        vals = [(name(i), keep(t)) for i, t in enumerate(outs)]
        for r in self.ranges:
            b = keep(self.dev.bytes_at(r.addr, r.nbytes))
            size = _itemsize(r.dtype)
            vals.append((r.name, b.view(r.dtype) if size and r.nbytes % size == 0 else b))
        return vals


def _itemsize(dtype):
    return torch.empty(0, dtype=dtype).element_size() if dtype is not None else 0


class Difference(NamedTuple):
    """One value that differs from its reference: max_abs over the finite elements of a float
    value (None: none finite, or not a float), nonfinite: NaN or inf where the reference had none,
    rounding: every element within the dtype's rounding tolerance of the reference."""

    name: str
    max_abs: float | None
    nonfinite: bool
    rounding: bool = False


def _within_rounding(got, want):
    """Whether two float tensors of one dtype are equal within that dtype's default tolerance
    (torch.testing.assert_close's: float32 rtol 1.3e-6, atol 1e-5; bfloat16 rtol 1.6e-2)."""
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
    except AssertionError:
        return False
    return True


def differences(got, want):
    """The values of `got` ((name, tensor) pairs) that differ from `want`'s bit for bit, in order;
    those within rounding are marked so (Difference.rounding)."""
    out = []
    for (name, g), (_, w) in zip(got, want):
        if g.shape == w.shape and g.dtype == w.dtype and same_bits(g, w):
            continue
        m, bad, within = None, False, False
        if g.dtype.is_floating_point and g.shape == w.shape and g.dtype == w.dtype:
            gf, wf = g.double(), w.double()
            ok = torch.isfinite(gf) & torch.isfinite(wf)
            bad = bool((~torch.isfinite(gf) & torch.isfinite(wf)).any())
            m = float((gf[ok] - wf[ok]).abs().max()) if ok.any() else None
            within = not bad and _within_rounding(g, w)
        out.append(Difference(name, m, bad, within))
    return out


def beyond_rounding(got, want):
    """differences(got, want) less those within rounding."""
    return [d for d in differences(got, want) if not d.rounding]


def same_bits(a, b):
    """Whether two tensors of one shape and dtype hold the same bytes (NaN equal to the same NaN),
    read eight bytes at a time where they allow it (several times faster than byte by byte)."""
    a, b = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    if a.numel() % 8 == 0 and a.data_ptr() % 8 == 0 and b.data_ptr() % 8 == 0:
        a, b = a.view(torch.int64), b.view(torch.int64)
    return torch.equal(a, b)
