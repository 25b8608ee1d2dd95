"""What each aten or custom op does to memory, from its schema alone: which arguments it writes
(alias_info.is_write: in-place ops, out= arguments, custom ops' declared mutates_args), which
returns alias an argument, which ops are views (no kernel, no memory), which only allocate, and
which a capture forbids. Backend-neutral: the simulator's capture and the CUDA trace recorder share it."""

import threading
from dataclasses import dataclass

import torch

# private API, no public one: __torch_dispatch__ modes exist only in torch.utils._python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "EMPTY_OPS",
    "FORBIDDEN",
    "VIEW_LIKE",
    "OpInfo",
    "arg",
    "mutated_args",
    "op_info",
    "warm_up_dispatch_modes",
]

# ops that allocate and write nothing (no node)
EMPTY_OPS = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::new_empty_strided",
}
# outputs that alias their input's storage without an alias annotation
VIEW_LIKE = {"aten::_unsafe_view", "aten::lift_fresh"}
FORBIDDEN = {
    "aten::_local_scalar_dense": "reads a tensor value on the host (.item(), bool(), "
    "int(), a data-dependent branch), a synchronization not permitted while capturing",
    "aten::set_": "changes a tensor's storage",
    "aten::resize_": "resizes a tensor",
    "aten::record_stream": "use dev.record_stream(t, stream) instead",
}


@dataclass
class OpInfo:
    kind: str  # view | empty | node | forbid
    returns: list  # per return: index of the argument it aliases (mutated) or None
    mutated: list  # (index, name) of arguments written
    n_returns: int


_OP_INFO: dict = {}  # OpOverload -> OpInfo


def op_info(func):
    """The OpInfo of an OpOverload, from its schema (cached)."""
    info = _OP_INFO.get(func)
    if info is not None:
        return info
    # OpOverload._schema: private, no public API gives alias_info (tests/test_private_api.py)
    schema = func._schema
    name = schema.name
    args = schema.arguments
    mutated = [(i, a.name) for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    rets = []
    for r in schema.returns:
        src = None
        if r.alias_info is not None and r.alias_info.is_write:
            for i, a in enumerate(args):
                if a.alias_info is not None and a.alias_info.before_set == r.alias_info.before_set:
                    src = i
                    break
        rets.append(src)
    is_view = bool(schema.returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )
    if name in FORBIDDEN:
        kind = "forbid"
    elif is_view or name in VIEW_LIKE:
        kind = "view"
    elif name in EMPTY_OPS:
        kind = "empty"
    else:
        kind = "node"
    info = _OP_INFO[func] = OpInfo(kind, rets, mutated, len(schema.returns))
    return info


def arg(args, kwargs, i, name):
    """Argument i of a call, positional or by its schema name."""
    return args[i] if i < len(args) else kwargs.get(name)


def mutated_args(info, args, kwargs):
    """The tensors an op writes in place (a Tensor[] argument counts each of its tensors)."""
    out = []
    for i, name in info.mutated:
        v = arg(args, kwargs, i, name)
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return out


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _one_op_under_a_mode():
    with _Passthrough():
        torch.zeros(1) + 0


_warm = threading.Event()


def warm_up_dispatch_modes():
    """Run one op under a dispatch mode, once per process, on a thread of its own, before any
    capture pushes a mode.

    torch imports torch._dynamo lazily at the first op under a TorchDispatchMode (~3 s), and that
    import leaves reference cycles holding every frame on the stack at the time (torch 2.11-2.13).
    Done inside a capture, the capture's graph and its callers' locals (earlier graphs too) become
    cyclic garbage, destroyed whenever the collector next runs, which can be inside a later capture;
    CUDA forbids destroying a graph while capturing and invalidates that capture. A thread of its
    own has no caller frames to keep."""
    if not _warm.is_set():
        t = threading.Thread(target=_one_op_under_a_mode, name="nblib-warm-up-dispatch-modes")
        t.start()
        t.join()
        _warm.set()
