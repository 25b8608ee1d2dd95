"""The trace of one capture: allocations, frees, ops with their byte accesses, and stream syncs, as
named records in the order the host issued them. Both recorders (sim, cuda) produce these; the
audit reads nothing else."""

import linecache
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from nblib.instruments.audit.trace.stacks import user_frames


@dataclass(eq=False)
class Alloc:
    """One allocation made while capturing (or None for bytes from outside the capture's pool)."""

    id: int
    addr: int
    nbytes: int
    stream: str  # the allocation stream (whose free list gets the block back)
    stack: list
    op: str = "?"  # the op that created it (aten::empty, aten::mm, ...)
    free_stack: list = None  # where its last reference died; None: alive at capture end
    freed: bool = False
    record_streams: list = field(default_factory=list)
    name: str = None  # a readable name, when the caller knows one (see audit names=)

    @property
    def end(self):
        return self.addr + self.nbytes

    def label(self):
        """The caller's name for it, else the variable it was assigned to: 'h (model.py:180)'."""
        if self.name:
            return self.name
        frames = user_frames(self.stack)
        if not frames:
            return f"tensor at {self.addr:#x}"
        fr = frames[-1]
        where = f"{os.path.basename(fr['filename'])}:{fr['line']}"
        m = re.match(r"\s*([A-Za-z_][\w.]*)\s*=[^=]", linecache.getline(fr["filename"], fr["line"]))
        return f"{m.group(1)} ({where})" if m else f"tensor from {where}"


@dataclass(eq=False)
class Access:
    addr: int
    nbytes: int
    kind: str  # "r", "w", or "rw" (raw Triton launches: both)
    what: str  # the argument: "out", "arg2", "self", ...
    alloc: Alloc = None  # the live allocation holding addr, None: persistent memory
    layout: tuple = None  # (shape, stride, itemsize) of a strided view with gaps; None: dense
    dtype: object = None  # the tensor's torch.dtype, when the recorder saw the tensor

    @property
    def writes(self):
        return self.kind != "r"


@dataclass(eq=False)
class Op:
    index: int
    name: str
    stream: str
    stack: list
    accesses: list
    opaque: bool = False  # its accesses are unknown (a raw Triton launch that declares none)
    epoch: int = 0  # filled by the audit: this op's clock on its stream
    vc: dict = None  # filled by the audit: the stream's vector clock at this op


class Step(NamedTuple):
    """One event of a capture trace, in program order.

    alloc   a tensor's bytes handed out by the caching allocator          (alloc)
    free    its last reference died (the allocator may reuse the bytes)   (alloc)
    op      one kernel: its stream and the byte ranges it reads, writes   (op)
    record  an event recorded on a stream: a snapshot of its clock        (stream, clock)
    wait    a stream waits on a recorded clock; wait_stream(s) is a record on s plus a wait
    """

    kind: str  # "alloc" | "free" | "op" | "record" | "wait"
    alloc: Alloc = None
    op: Op = None
    stream: str = None
    clock: object = None  # record/wait: the key of one record (an event's record, a wait_stream)


def alloc_step(a):
    return Step("alloc", alloc=a)


def free_step(a):
    return Step("free", alloc=a)


def op_step(op):
    return Step("op", op=op)


def record_step(stream, clock):
    return Step("record", stream=stream, clock=clock)


def wait_step(stream, clock):
    return Step("wait", stream=stream, clock=clock)


@dataclass(eq=False)
class CaptureTrace:
    label: dict  # {"capture": i} plus whatever rec(...) was given, e.g. bucket
    backend: str
    events: list = field(default_factory=list)  # Step list
    graph: object = None  # sim: the SimGraph (its nodes and last replay schedule); cuda: None
    complete: bool = False  # False: the capture raised before it ended

    @property
    def ops(self):
        return [e.op for e in self.events if e.kind == "op"]

    @property
    def allocs(self):
        return [e.alloc for e in self.events if e.kind == "alloc"]

    def title(self):
        return ", ".join(f"{k} {v}" for k, v in self.label.items())


class Live:
    """Live allocations by address, to say which one an access falls in."""

    def __init__(self):
        self.by_addr = {}

    def add(self, a):
        self.by_addr[a.addr] = a

    def remove(self, a):
        if self.by_addr.get(a.addr) is a:
            del self.by_addr[a.addr]

    def find(self, addr):
        for a in self.by_addr.values():  # few live transients at once: a scan is enough
            if a.addr <= addr < a.end:
                return a
        return None


def op_name(func):
    """'aten.mm.default' -> 'aten::mm', 'csi.indexer_logits_bf16.default' -> 'csi::indexer_logits_bf16'."""
    parts = str(func).split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) > 1 else parts[0]


def stream_namer(main):
    """Role names: the stream the capture began on is "main", the others "side", "side2", ..."""
    names = {main: "main"}

    def name(key):
        if key not in names:
            n = len(names)
            names[key] = "side" if n == 1 else f"side{n}"
        return names[key]

    return name
