"""Capture: a TorchDispatchMode that records every op as a graph node and allocates its outputs from
the arena, running nothing. View ops run at once (they touch no memory); ops a capture forbids
raise SimCaptureError. Each node keeps closures over shadows of its tensors so replay can run it
later, at its end time in the replay's schedule; a copy also keeps one closure per row of its
destination, which replay runs in order over the copy's run (a copy streams its rows in address order,
so the first rows are read as soon as it starts)."""

import os
import sys
from typing import NamedTuple

import torch

# private API, no public one: __torch_dispatch__ modes exist only in torch.utils._python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

# private API, no public one in torch (optree is the outside library); tests/test_private_api.py
from torch.utils._pytree import tree_flatten, tree_unflatten

from kernels.ops import OP_ROLES
from nblib.backends.capture_rules import SimCaptureError
from nblib.backends.opinfo import FORBIDDEN, arg, mutated_args, op_info
from nblib.backends.sim.allocator import stream_name
from nblib.backends.sim.arena import bytes_moved
from nblib.backends.sim.fastops import shortcut
from nblib.backends.sim.rules import violation
from nblib.backends.storage import extent, layout

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_FILES = ("contextlib.py", "weakref.py")
# the custom ops' argument roles, by overload (importing kernels.ops registers the ops)
_ROLES = {r.overload(): r for r in OP_ROLES}


def python_stack(limit=10):
    """The caller's Python frames outside the simulator and torch, innermost last:
    [dict(filename, line, name)]."""
    f = sys._getframe(1)
    out = []
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if not fn.startswith((_PACKAGE, _TORCH_DIR)) and not fn.endswith(_SKIP_FILES):
            out.append(dict(filename=fn, line=f.f_lineno, name=f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


class NodeAccess(NamedTuple):
    """A byte extent one node reads or writes."""

    addr: int
    nbytes: int
    kind: str  # "r" | "w"
    what: str  # the argument: "arg2", "out0", ...
    layout: tuple = None  # (shape, stride, itemsize) of a strided view with gaps, else None
    dtype: torch.dtype = None  # the tensor's element type (the audit's --confirm reads values by it)


class Node:
    """One recorded kernel: op name, stream, deps (indices of nodes it waits for: the previous node
    on its stream plus event/wait_stream edges), nbytes (bytes moved, for the timing model),
    accesses (NodeAccess list), stack (Python frames at capture), alloc_seq (allocator log entries
    before it). run() executes it at once; read() computes from its inputs into temporaries and
    write(state) stores the results; rows: for a copy, one closure per row of its destination (run
    in order, they do what run() does), else None."""

    __slots__ = (
        "index",
        "op",
        "stream",
        "deps",
        "nbytes",
        "accesses",
        "stack",
        "alloc_seq",
        "run",
        "read",
        "write",
        "cost",
        "rows",
    )

    def __repr__(self):
        return f"Node({self.index} {self.op} on {stream_name(self.stream)} after {list(self.deps)})"


class Capture:
    """The state of one capture underway: nodes, each stream's frontier, and the syncs made."""

    def __init__(self, dev, graph, stream, pool_id):
        self.dev, self.graph, self.stream, self.pool_id = dev, graph, stream, pool_id
        self.frontier = {stream: ()}  # stream -> node indices its next node depends on
        self.nodes = []
        self.syncs = []  # Sync records, in program order
        self.invalid = None  # why the capture is broken (a rule was broken), or None

    def record(self, func, info, args, kwargs):
        dev = self.dev
        arena = dev.arena
        stream = dev.current_stream()
        if self.invalid is not None:
            raise violation(
                dev, "invalidated", f"{func} after the capture broke ({self.invalid})", self.invalid
            )
        if stream is dev.default_stream:
            raise violation(dev, "legacy", f"{func} on the default stream while capturing")
        if stream not in self.frontier:
            raise violation(
                dev,
                "uncaptured_stream",
                f"{stream.name} is not part of the capture: it must wait on the capturing stream "
                f"(e.g. {stream.name}.wait_stream(capture_stream)) before queuing work",
            )
        fresh = [i for i, src in enumerate(info.returns) if src is None]
        outs = {}
        if fresh:
            margs, mkwargs = tree_map_tensors(to_meta, args, kwargs)
            mres = func(*margs, **mkwargs)
            mres = [mres] if info.n_returns == 1 else list(mres)
            for i in fresh:
                outs[i] = dev.alloc_like(mres[i], stream)
        result = []
        for i, src in enumerate(info.returns):
            result.append(
                outs[i] if src is None else arg(args, kwargs, src, func._schema.arguments[src].name)
            )
        if info.kind == "empty":
            return result[0]
        # the node: shadows of arena tensors (they do not keep blocks alive), persistent tensors as is
        flat, spec = tree_flatten((args, kwargs))
        mut_objs = mutated_args(info, args, kwargs)
        mut_idx = [
            j for j, x in enumerate(flat) if isinstance(x, torch.Tensor) and any(x is m for m in mut_objs)
        ]
        leaves, accesses = [], []
        for j, x in enumerate(flat):
            if isinstance(x, torch.Tensor):
                sx = arena.shadow(x) if arena.owns(x) else x
                leaves.append(sx)
                kind = "w" if j in mut_idx else "r"
                accesses.append(NodeAccess(x.data_ptr(), extent(x), kind, f"arg{j}", layout(x), x.dtype))
            else:
                leaves.append(x)
        out_shadows = []
        for i in fresh:
            o = outs[i]
            if o.numel():
                out_shadows.append((i, arena.shadow(o)))
                accesses.append(NodeAccess(o.data_ptr(), extent(o), "w", f"out{i}", layout(o), o.dtype))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)] + [outs[i] for i in fresh]
        nbytes = bytes_moved(tensors)
        n = Node()
        n.index, n.op, n.stream = len(self.nodes), str(func), stream
        n.deps = self.frontier[stream]
        n.nbytes, n.accesses = nbytes, accesses
        n.stack = python_stack() if dev.record_stacks else None
        n.alloc_seq = len(dev.allocator.log)
        n.run, n.read, n.write = _make_closures(func, leaves, spec, mut_idx, out_shadows, info.n_returns)
        n.cost = node_cost(func, leaves, spec, nbytes)
        n.rows = _copy_rows(func, leaves, spec, out_shadows)
        self.frontier[stream] = (n.index,)
        self.nodes.append(n)
        if info.n_returns == 0:
            return None
        return result[0] if info.n_returns == 1 else tuple(result)


def is_paged(func):
    """Whether func is a paged op (its duration follows the replay's sequence lengths)."""
    roles = _ROLES.get(func)
    return roles is not None and roles.cache is not None


def has_cost(func):
    """Whether the bytes func moves do not time it (node_cost gives its duration): a paged op, or
    torch.topk (several kernels a call). Cheap: an eager op asks before its arguments are walked."""
    return func is torch.ops.aten.topk.default or is_paged(func)


def node_cost(func, leaves, spec, nbytes):
    """The node's duration as a closure of the Timing, for the ops has_cost names; None for every
    other op."""
    if func is torch.ops.aten.topk.default:
        args, kwargs = tree_unflatten(leaves, spec)
        x, k = args[0], arg(args, kwargs, 1, "k")
        cols = x.shape[-1] if x.dim() else 1
        rows = x.numel() // max(cols, 1)
        return lambda timing: timing.topk_seconds(rows, cols, k, nbytes)
    return paged_cost(func, leaves, spec)


def paged_cost(func, leaves, spec):
    """A paged op's duration depends on this replay's sequence lengths, not on its arguments'
    sizes (the cache is far larger than what one step reads): a closure the replay calls with the
    Timing. Which arguments are the cache, the lengths and the output comes from the op's roles
    (kernels.ops.OP_ROLES). None for every other op."""
    roles = _ROLES.get(func)
    if roles is None or roles.cache is None:
        return None
    args, kwargs = tree_unflatten(leaves, spec)  # shadows: the lengths are read at each replay
    names = [a.name for a in func._schema.arguments]
    cache, seq_lens, out, per_request = (
        arg(args, kwargs, i, names[i]) for i in (roles.cache, roles.lengths, roles.writes[0], roles.programs)
    )
    per_request = per_request if isinstance(per_request, int) else 0
    entry_bytes = roles.entry_bytes(cache)
    out_bytes = out.numel() * out.element_size()
    return lambda timing: timing.indexer_seconds(seq_lens.tolist(), entry_bytes, per_request, out_bytes)


_COPIES = (torch.ops.aten.clone.default, torch.ops.aten.copy_.default)


def _copy_rows(func, leaves, spec, out_shadows):
    """A copy kernel streams its source in address order over its run, so it reads the first rows
    near its start and the last near its end (a strided grid over the elements, as PyTorch's copy
    kernels are): one closure per row of the destination, for a copy of two rows or more whose source
    and destination have one shape; None for every other op."""
    if func not in _COPIES:
        return None
    args, _ = tree_unflatten(leaves, spec)
    if func is torch.ops.aten.clone.default:
        if not out_shadows:
            return None
        src, dst = args[0], out_shadows[0][1]
    else:
        dst, src = args[0], args[1]
    if not isinstance(src, torch.Tensor) or dst.dim() < 2 or dst.shape[0] < 2 or src.shape != dst.shape:
        return None
    return [lambda r=r: dst[r].copy_(src[r]) for r in range(dst.shape[0])]


def to_meta(x):
    """A meta tensor shaped like tensor x (anything else as it is): what the op would return, unrun."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def tree_map_tensors(fn, args, kwargs):
    flat, spec = tree_flatten((args, kwargs))
    return tree_unflatten([fn(x) for x in flat], spec)


def _make_closures(func, leaves, spec, mut_idx, out_shadows, n_returns):
    """run(): read and write at once; read() -> state: read the inputs, compute into temporaries
    (mutated arguments are cloned first); write(state): store outputs and mutated arguments.
    The op runs through its host shortcut, if it has one (fastops: the same result, sooner)."""
    func = shortcut(func)
    args, kwargs = tree_unflatten(leaves, spec)
    single = n_returns == 1

    def write_outs(res):
        if single:
            out_shadows[0][1].copy_(res)
        else:
            for i, o in out_shadows:
                o.copy_(res[i])

    if not out_shadows:
        write_outs = None

    def run():
        res = func(*args, **kwargs)
        if write_outs is not None:
            write_outs(res)

    if not mut_idx:

        def read():
            return func(*args, **kwargs), None
    else:

        def read():
            tmp = list(leaves)
            clones = []
            for j in mut_idx:
                c = leaves[j].clone()
                tmp[j] = c
                clones.append(c)
            a, k = tree_unflatten(tmp, spec)
            return func(*a, **k), clones

    def write(state):
        res, clones = state
        if clones:
            for j, c in zip(mut_idx, clones):
                leaves[j].copy_(c)
        if write_outs is not None:
            write_outs(res)

    return run, read, write


class CaptureMode(TorchDispatchMode):
    """Pushed for the length of one capture: every op goes to Capture.record."""

    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = op_info(func)
        if info.kind == "view":
            return func(*args, **kwargs)
        if info.kind == "forbid":
            rule = "sync" if func._schema.name == "aten::_local_scalar_dense" else "unsupported_op"
            raise violation(self.cap.dev, rule, f"{func} while capturing: it {FORBIDDEN[func._schema.name]}")
        try:
            return self.cap.record(func, info, args, kwargs)
        except SimCaptureError:
            raise
        except Exception as e:
            raise SimCaptureError(f"capturing {func} failed: {type(e).__name__}: {e}") from e
