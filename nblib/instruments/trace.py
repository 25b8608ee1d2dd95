"""Record a capture: allocations, frees, every op's byte accesses, and the stream syncs, in program order.

    with nblib.instruments.trace.recording(dev) as rec:      # around code that captures by itself
        runner.capture(record=rec)               # rec(bucket) labels each capture (optional)
    rec.captures                                 # one CaptureTrace per graph captured

A CaptureTrace is a list of events in the order the host issued them:

    ("alloc", Alloc)            a tensor's bytes handed out by the caching allocator
    ("free", Alloc)             its last reference died (the allocator may reuse the bytes at once)
    ("op", Op)                  one kernel: its stream and the byte ranges it reads and writes
    ("record", stream, event)   event recorded on a stream
    ("wait", stream, event)     a stream waits on an event; wait_stream(s) is a record on s + a wait

Nothing here changes what is captured: the recorder only reads. nblib.instruments.audit turns a trace into
happens-before (vector clocks) and races.

Backends:
  sim   the simulator's capture already records all of it: graph nodes (op, stream, byte accesses,
        Python stack, allocator log position), stream/event syncs, and the allocator's log (alloc and
        free with address, size, allocation stream and stack). The recorder reads those when each
        capture ends; it installs nothing in the capture itself.
  cuda  a TorchDispatchMode pushed for each capture sees every aten and custom op (accesses from
        the op schema: alias_info.is_write marks mutated arguments, fresh outputs are writes, byte
        ranges from data_ptr and strides), the current stream, and new outputs (allocations, on the
        current stream); weakref.finalize on each new storage records its free at the program point
        where the last reference dies; patched Event.record/wait and Stream.wait_event/wait_stream/
        record_event record sync edges; triton's launch_enter_hook records raw Triton launches made
        outside any op (tensor arguments counted as read and write).
"""

import contextlib
import linecache
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass, field

import torch

from nblib.core.paths import NBLIB

_SKIP_FILES = tuple(
    str(NBLIB / f) for f in ("instruments/trace.py", "instruments/audit.py", "backends/sim.py")
)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_SUFFIX = ("contextlib.py", "weakref.py")


def _skip(fn):
    return (
        fn.startswith(_SKIP_FILES)
        or fn.startswith(_TORCH_DIR)
        or fn.endswith(_SKIP_SUFFIX)
        or f"{os.sep}triton{os.sep}" in fn
    )


def python_stack(limit=12, depth=1):
    """The caller's frames outside torch, triton and this package's instruments: innermost last."""
    f = sys._getframe(depth)
    out = []
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if not _skip(fn):
            out.append(dict(filename=fn, line=f.f_lineno, name=f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


def user_frames(stack):
    """A stack without the instruments' own frames (sim stacks keep audit.py's caller frames)."""
    return [
        fr
        for fr in (stack or [])
        if not _skip(fr["filename"]) and f"{os.sep}site-packages{os.sep}" not in fr["filename"]
    ]  # IPython, papermill, pytest


def site(stack, code=True):
    """'model.py:172 in _logits_buffer: t = torch.empty(...)': the innermost user frame."""
    frames = user_frames(stack)
    if not frames:
        return "?"
    fr = frames[-1]
    s = f"{os.path.basename(fr['filename'])}:{fr['line']} in {fr['name']}"
    if code:
        line = linecache.getline(fr["filename"], fr["line"]).strip()
        if line:
            s += f": {line[:90]}"
    return s


def format_stack(stack, indent="    "):
    return "\n".join(
        f"{indent}{os.path.basename(fr['filename'])}:{fr['line']} in {fr['name']}: "
        f"{linecache.getline(fr['filename'], fr['line']).strip()}"
        for fr in user_frames(stack)
    )


# ------------------------------------------------------------------------------------------------
# the trace
# ------------------------------------------------------------------------------------------------


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
    epoch: int = 0  # filled by the audit: this op's clock on its stream
    vc: dict = None  # filled by the audit: the stream's vector clock at this op


@dataclass(eq=False)
class CaptureTrace:
    label: dict  # {"capture": i} plus whatever rec(...) was given, e.g. bucket
    backend: str
    events: list = field(default_factory=list)
    graph: object = None  # the captured graph (sim: its nodes and last replay schedule)
    complete: bool = False  # False: the capture raised before it ended

    @property
    def ops(self):
        return [e[1] for e in self.events if e[0] == "op"]

    @property
    def allocs(self):
        return [e[1] for e in self.events if e[0] == "alloc"]

    def title(self):
        return ", ".join(f"{k} {v}" for k, v in self.label.items())


class _Live:
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


# ------------------------------------------------------------------------------------------------
# the recorder: one class, a backend per device
# ------------------------------------------------------------------------------------------------


class Recording:
    """Collects one CaptureTrace per capture started inside the `with` block."""

    def __init__(self, dev):
        self.dev = dev
        self.captures = []
        self._label = {}

    def __call__(self, bucket=None, **label):
        """rec(bucket) -> a context manager labelling the captures made inside it; pass `rec` as
        Runner.capture(record=rec) and every trace carries its bucket."""
        if bucket is not None:
            label = dict(bucket=bucket, **label)
        return self._labelled(label)

    @contextlib.contextmanager
    def _labelled(self, label):
        prev, self._label = self._label, {**self._label, **label}
        try:
            yield self
        finally:
            self._label = prev

    def _new_trace(self):
        t = CaptureTrace(label=dict(capture=len(self.captures), **self._label), backend=self.dev.name)
        self.captures.append(t)
        return t

    def report(self, names=None):
        """The audit of every complete capture recorded so far (nblib.instruments.audit.Report)."""
        from nblib.instruments import audit

        return audit.audit(self.captures, names=names)

    def __enter__(self):
        self._install()
        return self

    def __exit__(self, *exc):
        self._uninstall()
        return False


def recording(dev):
    """`with recording(dev) as rec:` records every capture made inside, on either backend."""
    if dev.name == "sim":
        return SimRecording(dev)
    if dev.name == "cuda":
        return CudaRecording(dev)
    raise ValueError(f"no capture recorder for backend {dev.name!r}: use 'sim' or 'cuda'")


# ------------------------------------------------------------------------------------------------
# sim: read the graph's nodes, syncs and the allocator log when the capture ends
# ------------------------------------------------------------------------------------------------


class SimRecording(Recording):
    """Wraps SimGraph.capture_begin/capture_end for graphs of this device while the block runs."""

    def _install(self):
        from nblib.backends import sim

        cls = sim.SimGraph
        self._orig = (cls.capture_begin, cls.capture_end, cls._abort)
        begin, end, abort = self._orig
        rec = self

        def capture_begin(g, *a, **k):
            if g.dev is not rec.dev:
                return begin(g, *a, **k)
            start = len(g.dev.allocator.log)
            stream = g.dev._cur
            begin(g, *a, **k)
            g._audit = (rec, rec._new_trace(), start, stream)

        def capture_end(g):
            end(g)
            info = g.__dict__.pop("_audit", None)
            if info is not None and info[0] is rec:
                rec._build(g, *info[1:])

        def _abort(g):
            g.__dict__.pop("_audit", None)  # the trace stays incomplete
            return abort(g)

        cls.capture_begin, cls.capture_end, cls._abort = capture_begin, capture_end, _abort

    def _uninstall(self):
        from nblib.backends import sim

        sim.SimGraph.capture_begin, sim.SimGraph.capture_end, sim.SimGraph._abort = self._orig

    def _build(self, g, trace, start, main):
        """Merge nodes, syncs and the allocator log slice into one program-order event list."""
        log = g.dev.allocator.log
        name = stream_namer(main)
        live, allocs, ev = _Live(), {}, trace.events
        ids = iter(range(1 << 62))
        li = start
        syncs = sorted(enumerate(g.syncs), key=lambda x: (x[1][3], x[0]))
        si = 0
        event_names = {}

        def flush_log(upto, op_name):
            nonlocal li
            while li < upto:
                e = log[li]
                li += 1
                if e["action"] == "alloc":
                    a = Alloc(
                        next(ids), e["addr"], e["size"], name(e["stream"]), e["stack"] or [], op=op_name
                    )
                    allocs[e["addr"]] = a
                    live.add(a)
                    ev.append(("alloc", a))
                elif e["action"] == "free_requested" and e["addr"] in allocs:
                    a = allocs.pop(e["addr"])
                    a.freed, a.free_stack = True, e["stack"] or []
                    live.remove(a)
                    ev.append(("free", a))

        def flush_syncs(upto):
            nonlocal si
            while si < len(syncs) and syncs[si][1][3] <= upto:
                kind, s, other, _ = syncs[si][1]
                si += 1
                if kind == "wait_stream":
                    key = ("wait_stream", si)
                    ev.append(("record", name(other), key))
                    ev.append(("wait", name(s), key))
                elif kind == "wait_event":
                    ev.append(("wait", name(s), event_names.setdefault(id(other), ("event", id(other)))))
                elif kind == "record":
                    key = ("event", id(other), si)  # each record is a new clock value
                    event_names[id(other)] = key
                    ev.append(("record", name(s), key))

        for n in g.nodes:
            before = len(ev)
            flush_log(n.alloc_seq, "aten::empty")
            outs = {addr for addr, _, rw, what in n.accesses if what.startswith("out")}
            for e in ev[before:]:  # this node's outputs were allocated just before it
                if e[0] == "alloc" and e[1].addr in outs:
                    e[1].op = op_name(n.op)
            flush_syncs(n.index)
            acc = [Access(addr, nb, rw, what, live.find(addr)) for addr, nb, rw, what in n.accesses if nb]
            ev.append(("op", Op(n.index, op_name(n.op), name(n.stream), n.stack or [], acc)))
        flush_log(len(log), "aten::empty")
        flush_syncs(1 << 62)
        trace.graph = g
        trace.complete = True


# ------------------------------------------------------------------------------------------------
# cuda: a dispatch mode, patched sync methods and triton's launch hook, for each capture
# ------------------------------------------------------------------------------------------------


def _extent(t):
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)) * t.element_size()


def _stream_key(s):
    """Streams are new Python objects on every current_stream(): key them by device and id."""
    return (s.device_index, s.stream_id)


class CudaRecording(Recording):
    """Records real CUDA captures (torch.cuda.CUDAGraph.capture_begin .. capture_end).

    Unverified on this CPU-only machine beyond its pure-Python parts: run tests/test_audit.py's
    gpu tests on the H200."""

    _lock = threading.Lock()

    def _install(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self
        self._trace = None
        self._mode = None
        self._guard = 0  # > 0 inside a patched sync method or a dispatched op
        self._names = None
        self._live = _Live()
        self._ids = iter(range(1 << 62))
        self._events = {}  # id(Event) -> (the Event, kept alive; key of its latest record)
        self._handles = {}  # raw cudaStream_t -> stream key (for triton's hook)
        G, E, S = torch.cuda.CUDAGraph, torch.cuda.Event, torch.cuda.Stream
        self._orig = dict(
            begin=G.capture_begin,
            end=G.capture_end,
            erecord=E.record,
            ewait=E.wait,
            wait_event=S.wait_event,
            wait_stream=S.wait_stream,
            record_event=S.record_event,
        )
        o = self._orig

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return rec._dispatch(func, args, kwargs or {})

        self._Mode = Mode

        def capture_begin(g, *a, **k):
            main = torch.cuda.current_stream()
            o["begin"](g, *a, **k)
            rec._begin(g, main)

        def capture_end(g):
            ended = False
            try:
                o["end"](g)
                ended = True
            finally:
                rec._end(g, ended)

        def sync(kind, orig):
            def wrapper(*a, **k):
                outer = rec._guard == 0 and rec._trace is not None
                rec._guard += 1
                try:
                    result = orig(*a, **k)
                finally:
                    rec._guard -= 1
                if outer:
                    rec._sync(kind, a, k, result)
                return result

            wrapper.__wrapped__ = orig
            return wrapper

        G.capture_begin, G.capture_end = capture_begin, capture_end
        E.record, E.wait = sync("erecord", o["erecord"]), sync("ewait", o["ewait"])
        S.wait_event, S.wait_stream = (
            sync("wait_event", o["wait_event"]),
            sync("wait_stream", o["wait_stream"]),
        )
        S.record_event = sync("record_event", o["record_event"])
        self._hook = self._triton_launch
        try:
            import triton

            triton.knobs.runtime.launch_enter_hook.add(self._hook)
        except (ImportError, AttributeError):
            self._hook = None

    def _uninstall(self):
        if self._mode is not None:
            self._pop_mode()
        G, E, S = torch.cuda.CUDAGraph, torch.cuda.Event, torch.cuda.Stream
        o = self._orig
        G.capture_begin, G.capture_end = o["begin"], o["end"]
        E.record, E.wait = o["erecord"], o["ewait"]
        S.wait_event, S.wait_stream, S.record_event = o["wait_event"], o["wait_stream"], o["record_event"]
        if self._hook is not None:
            import triton

            triton.knobs.runtime.launch_enter_hook.remove(self._hook)

    # -- capture boundaries ---------------------------------------------------------------------
    def _begin(self, g, main):
        self._trace = self._new_trace()
        self._trace.graph = g
        self._names = stream_namer(_stream_key(main))
        self._handles[main.cuda_stream] = _stream_key(main)
        self._live = _Live()
        self._nops = 0
        self._failed = False
        self._mode = self._Mode()
        self._mode.__enter__()

    def _end(self, g, ended):
        if self._mode is not None:
            self._pop_mode()
        if self._trace is not None:
            self._trace.complete = ended and not self._failed
        self._trace, self._failed = None, False

    def _next_op(self):
        self._nops += 1
        return self._nops - 1

    def _pop_mode(self):
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)

    def _stream(self, s=None):
        s = s if s is not None else torch.cuda.current_stream()
        key = _stream_key(s)
        cs = getattr(s, "cuda_stream", None)
        if cs is not None:
            self._handles[cs] = key
        return self._names(key)

    # -- syncs ----------------------------------------------------------------------------------
    def _sync(self, kind, a, k, result):
        ev = self._trace.events
        if kind == "erecord":  # Event.record(self, stream=None)
            event, stream = a[0], (a[1] if len(a) > 1 else k.get("stream"))
            key = ("event", id(event), len(ev))
            self._events[id(event)] = (event, key)
            ev.append(("record", self._stream(stream), key))
        elif kind == "ewait":  # Event.wait(self, stream=None)
            event, stream = a[0], (a[1] if len(a) > 1 else k.get("stream"))
            ev.append(("wait", self._stream(stream), self._event_key(event)))
        elif kind == "record_event":  # Stream.record_event(self, event=None) -> event
            key = ("event", id(result), len(ev))
            self._events[id(result)] = (result, key)
            ev.append(("record", self._stream(a[0]), key))
        elif kind == "wait_event":  # Stream.wait_event(self, event)
            event = a[1] if len(a) > 1 else k["event"]
            ev.append(("wait", self._stream(a[0]), self._event_key(event)))
        elif kind == "wait_stream":  # Stream.wait_stream(self, other): a record plus a wait
            other = a[1] if len(a) > 1 else k["stream"]
            key = ("wait_stream", len(ev))
            ev.append(("record", self._stream(other), key))
            ev.append(("wait", self._stream(a[0]), key))

    def _event_key(self, event):
        """The clock of the event's latest record in this capture; one recorded outside it orders
        nothing inside the graph."""
        got = self._events.get(id(event))
        return got[1] if got is not None and got[0] is event else ("never recorded", id(event))

    # -- ops ------------------------------------------------------------------------------------
    def _dispatch(self, func, args, kwargs):
        from torch.utils._pytree import tree_flatten

        from nblib.backends.sim import _arg, _op_info

        info = _op_info(func)
        if (
            info.kind == "view"
            or self._trace is None
            or self._guard
            or not torch.cuda.is_current_stream_capturing()
        ):
            return func(*args, **kwargs)
        stream = self._stream()
        stack = python_stack(depth=2)
        if func._schema.name == "aten::record_stream":
            a = self._live.find(args[0].data_ptr())
            if a is not None:
                a.record_streams.append(self._stream(args[1]))
            return func(*args, **kwargs)
        self._guard += 1
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            self._failed = True
            e.add_note(f"(capture audit) raised by {func} on stream {stream} at {site(stack)}")
            raise
        finally:
            self._guard -= 1
        mut = []
        for i, n in info.mutated:
            v = _arg(args, kwargs, i, n)
            mut.extend(v if isinstance(v, (list, tuple)) else [v])
        flat, _ = tree_flatten((args, kwargs))
        acc = []
        for j, x in enumerate(flat):
            if isinstance(x, torch.Tensor) and x.is_cuda and x.numel():
                kind = "w" if any(x is m for m in mut) else "r"
                acc.append(Access(x.data_ptr(), _extent(x), kind, f"arg{j}", self._live.find(x.data_ptr())))
        res = [out] if info.n_returns == 1 else (list(out) if info.n_returns else [])
        for i, src in enumerate(info.returns):
            r = res[i] if i < len(res) else None
            if src is not None:
                continue
            for t in r if isinstance(r, (list, tuple)) else [r]:  # Tensor[] returns too
                if not isinstance(t, torch.Tensor) or not t.is_cuda:
                    continue
                a = self._new_alloc(t, stream, stack, func)
                if t.numel() and info.kind != "empty":
                    acc.append(Access(t.data_ptr(), _extent(t), "w", f"out{i}", a))
        if info.kind != "empty":
            self._trace.events.append(("op", Op(self._next_op(), op_name(func), stream, stack, acc)))
        return out

    def _new_alloc(self, t, stream, stack, func):
        st = t.untyped_storage()
        base = st.data_ptr()
        known = self._live.find(base)
        if known is not None or st.nbytes() == 0:
            return known
        a = Alloc(next(self._ids), base, st.nbytes(), stream, stack, op=op_name(func))
        self._live.add(a)
        self._trace.events.append(("alloc", a))
        trace, live = self._trace, self._live

        def freed():  # runs where the last reference dies: that is the free site
            live.remove(a)
            if trace is self._trace:  # freed while capturing (later frees do not matter)
                a.freed, a.free_stack = True, python_stack(depth=2)
                trace.events.append(("free", a))

        weakref.finalize(st, freed).atexit = False
        return a

    # -- raw Triton launches --------------------------------------------------------------------
    def _triton_launch(self, metadata):
        """triton.knobs.runtime.launch_enter_hook: called by the launcher with a LazyDict holding
        name and stream; the arguments are read from the launching frame (JITFunction.run's
        bound_args, or CompiledKernel's runner's args). Launches made inside a dispatched op are
        already covered by that op's schema."""
        if self._trace is None or self._guard:
            return
        data = metadata.get() if hasattr(metadata, "get") else dict(metadata)
        args = triton_launch_args(sys._getframe(1))
        handle = data.get("stream")
        cur = torch.cuda.current_stream()
        if cur.cuda_stream == handle:
            stream = self._stream(cur)
        else:
            key = self._handles.get(handle)
            stream = self._names(key) if key is not None else f"stream {handle!r}"
        stack = python_stack(depth=2)
        acc = [
            Access(x.data_ptr(), _extent(x), "rw", f"arg{j}", self._live.find(x.data_ptr()))
            for j, x in enumerate(args)
            if isinstance(x, torch.Tensor) and x.is_cuda and x.numel()
        ]
        self._trace.events.append(
            ("op", Op(self._next_op(), f"triton::{data.get('name', '?')}", stream, stack, acc))
        )


def triton_launch_args(frame, depth=8):
    """The arguments of the Triton launch whose launcher called us: found in the launching frame
    (triton 3.6: JITFunction.run's `bound_args`, CompiledKernel.__getitem__'s runner's `args`)."""
    f = frame
    for _ in range(depth):
        if f is None:
            break
        loc = f.f_locals
        if f.f_code.co_name == "run" and "bound_args" in loc:
            return list(loc["bound_args"].values())
        if f.f_code.co_name == "runner" and "args" in loc:
            return list(loc["args"])
        f = f.f_back
    return []
