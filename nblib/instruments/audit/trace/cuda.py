"""The CUDA recorder: real captures (torch.cuda.CUDAGraph.capture_begin .. capture_end).

While the `with` block runs it wraps CUDAGraph.capture_begin/capture_end, Event.record/wait and
Stream.wait_event/wait_stream/record_event, and adds a function to Triton's launch_enter_hook; all
of it is undone when the block ends, also when it raised. For each capture it pushes a
TorchDispatchMode that sees every aten and custom op: accesses come from the op schema
(alias_info.is_write marks mutated arguments, which is how custom ops declare theirs through
mutates_args; fresh outputs are writes; byte ranges from data_ptr and strides), the stream is the
current one, and each fresh output's storage gets a weakref.finalize that records its free at the
program point where the last reference dies.

Raw Triton launches made outside any op reach us through triton.knobs.runtime.launch_enter_hook
(triton 3.6's documented launch hook). Its metadata holds the kernel's name and stream, plus what
the kernel's own `launch_metadata` function (triton.jit(launch_metadata=...)) returns: tensors found
there count as read and written. A launch that declares none is recorded as an opaque op and the
audit says so; the recorder never reads Triton's internal frames.

What a capture forbids, the recorder never does: it makes no CUDA call of its own while capturing
(no query, no synchronize, no event or stream creation), and it holds no CUDA object past the
capture that made it. Python's cyclic garbage collector is paused while an audited capture is
underway: the recorder allocates many Python objects per op, which would trigger collections
inside the capture that a plain capture does not; a collection there can free a stale CUDAGraph
(cudaGraphExecDestroy) or a Triton kernel (cuModuleUnload) kept alive by someone's reference
cycle, which CUDA forbids while a stream captures and which invalidates the capture. (torch 2.9+
does not collect before capture; see pytorch PR 161037.)
"""

import gc
import weakref

import torch

# private API, no public one: __torch_dispatch__ modes exist only in torch.utils._python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

# private API, no public one in torch (optree is the outside library); tests/test_private_api.py
from torch.utils._pytree import tree_flatten

from nblib.backends.opinfo import mutated_args, op_info, warm_up_dispatch_modes
from nblib.backends.storage import extent, layout
from nblib.instruments.audit.trace.recorder import Recording
from nblib.instruments.audit.trace.records import (
    Access,
    Alloc,
    Live,
    Op,
    alloc_step,
    free_step,
    op_name,
    op_step,
    record_step,
    stream_namer,
    wait_step,
)
from nblib.instruments.audit.trace.stacks import python_stack, site

try:  # optional: without triton there are no raw launches to see
    import triton
except ImportError:  # pragma: no cover
    triton = None


def stream_key(s):
    """Streams are new Python objects on every current_stream(): key them by device and id."""
    return (s.device_index, s.stream_id)


class _Capture:
    """The state of one capture underway. Finalizers of storages allocated in it hold this (not the
    recorder), and after the capture ends they only mark their allocation freed."""

    def __init__(self, trace, main):
        self.trace = trace
        self.names = stream_namer(stream_key(main))
        self.live = Live()
        self.open = True
        self.failed = False
        self.nops = 0
        self.ids = iter(range(1 << 62))
        self.events = {}  # id(Event) -> (the Event, kept alive until capture end; its latest clock)
        self.handles = {main.cuda_stream: stream_key(main)}  # raw cudaStream_t -> key, for Triton


class _Mode(TorchDispatchMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rec.record_op(func, args, kwargs or {})


class CudaRecording(Recording):
    """Records real CUDA captures made inside the `with` block."""

    def _install(self):
        self._cap = None  # _Capture while one is underway
        self._mode = None
        self._guard = 0  # > 0 inside a wrapped sync method or a dispatched op
        self._gc_was_enabled = None
        warm_up_dispatch_modes()  # now, not at the first op of the first capture
        G, E, S = torch.cuda.CUDAGraph, torch.cuda.Event, torch.cuda.Stream
        self._patch(G, "capture_begin", self._wrap_begin(G.capture_begin))
        self._patch(G, "capture_end", self._wrap_end(G.capture_end))
        for owner, name in (
            (E, "record"),
            (E, "wait"),
            (S, "wait_event"),
            (S, "wait_stream"),
            (S, "record_event"),
        ):
            self._patch(
                owner, name, self._wrap_sync(name if owner is S else f"event_{name}", getattr(owner, name))
            )
        if triton is not None:
            hooks, hook = triton.knobs.runtime.launch_enter_hook, self._triton_launch
            hooks.add(hook)
            self._undo.append(lambda: hooks.remove(hook))

    def _stop(self):
        if self._cap is not None:  # a capture_begin without its capture_end
            self.end_capture(ended=False)

    # -- capture boundaries ---------------------------------------------------------------------
    def _wrap_begin(self, orig):
        def capture_begin(g, *a, **k):
            main = torch.cuda.current_stream()
            self._gc_was_enabled = gc.isenabled()
            gc.disable()  # no collection inside the capture (see the module docstring)
            try:
                orig(g, *a, **k)
            except BaseException:
                self.resume_gc()
                raise
            self.begin_capture(main)

        capture_begin.__wrapped__ = orig
        return capture_begin

    def _wrap_end(self, orig):
        def capture_end(g):
            ended = False
            try:
                orig(g)
                ended = True
            finally:
                self.end_capture(ended)

        capture_end.__wrapped__ = orig
        return capture_end

    def begin_capture(self, main):
        """A capture began on stream `main`: start its trace and see its ops from now on."""
        trace = self.new_trace()  # graph stays None: a trace holds no CUDA object
        self._cap = _Capture(trace, main)
        self._mode = _Mode(self)
        self._mode.__enter__()

    def end_capture(self, ended):
        """The capture underway ended (`ended`: its capture_end returned) or was dropped: stop seeing
        its ops, mark its trace complete or not, and resume the garbage collector."""
        cap, mode = self._cap, self._mode
        self._cap = self._mode = None
        try:
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            if cap is not None:
                cap.open = False
                cap.trace.complete = ended and not cap.failed
                cap.events.clear()  # the events die now, outside any capture
            self.resume_gc()

    def resume_gc(self):
        """Python's cyclic collector back on, if it was on when the capture began."""
        if self._gc_was_enabled:
            gc.enable()
        self._gc_was_enabled = None

    def _stream(self, s=None):
        s = s if s is not None else torch.cuda.current_stream()
        key = stream_key(s)
        cs = getattr(s, "cuda_stream", None)
        if cs is not None:
            self._cap.handles[cs] = key
        return self._cap.names(key)

    # -- syncs ----------------------------------------------------------------------------------
    def _wrap_sync(self, kind, orig):
        def wrapper(*a, **k):
            outer = self._guard == 0 and self._cap is not None
            self._guard += 1
            try:
                result = orig(*a, **k)
            finally:
                self._guard -= 1
            if outer and self._cap is not None:
                self.record_sync(kind, a, k, result)
            return result

        wrapper.__wrapped__ = orig
        return wrapper

    def record_sync(self, kind, a, k, result):
        """A sync method of kind `kind` returned `result` for arguments (a, k) in the capture: its
        record and wait steps in the trace."""
        cap = self._cap
        ev = cap.trace.events
        if kind == "event_record":  # Event.record(self, stream=None)
            event, stream = a[0], (a[1] if len(a) > 1 else k.get("stream"))
            self._record(event, stream)
        elif kind == "event_wait":  # Event.wait(self, stream=None)
            event, stream = a[0], (a[1] if len(a) > 1 else k.get("stream"))
            ev.append(wait_step(self._stream(stream), self._clock(event)))
        elif kind == "record_event":  # Stream.record_event(self, event=None) -> event
            self._record(result, a[0])
        elif kind == "wait_event":  # Stream.wait_event(self, event)
            event = a[1] if len(a) > 1 else k["event"]
            ev.append(wait_step(self._stream(a[0]), self._clock(event)))
        elif kind == "wait_stream":  # Stream.wait_stream(self, other): a record plus a wait
            other = a[1] if len(a) > 1 else k["stream"]
            clock = ("wait_stream", len(ev))
            ev.append(record_step(self._stream(other), clock))
            ev.append(wait_step(self._stream(a[0]), clock))

    def _record(self, event, stream):
        cap = self._cap
        clock = ("event", id(event), len(cap.trace.events))
        cap.events[id(event)] = (event, clock)
        cap.trace.events.append(record_step(self._stream(stream), clock))

    def _clock(self, event):
        """The clock of the event's latest record in this capture; one recorded outside it orders
        nothing inside the graph."""
        got = self._cap.events.get(id(event))
        return got[1] if got is not None and got[0] is event else ("never recorded", id(event))

    # -- ops ------------------------------------------------------------------------------------
    def record_op(self, func, args, kwargs):
        """Run op `func` (the dispatch mode hands over every op) and, in the capture, record its
        accesses, its fresh allocations and its stream; returns what the op returns."""
        info = op_info(func)
        cap = self._cap
        if info.kind == "view" or cap is None or self._guard or not torch.cuda.is_current_stream_capturing():
            return func(*args, **kwargs)
        stream = self._stream()
        stack = python_stack(depth=3)
        # OpOverload._schema: private; OpOverload.name() is public but adds the overload name
        if func._schema.name == "aten::record_stream":
            a = cap.live.find(args[0].data_ptr())
            if a is not None:
                a.record_streams.append(self._stream(args[1]))
            return func(*args, **kwargs)
        self._guard += 1
        try:
            if info.kind != "empty":
                self._before(cap)
            out = func(*args, **kwargs)
        except Exception as e:
            cap.failed = True
            e.add_note(f"(capture audit) raised by {func} on stream {stream} at {site(stack)}")
            raise
        finally:
            self._guard -= 1
        mut = mutated_args(info, args, kwargs)
        flat, _ = tree_flatten((args, kwargs))
        acc = []
        for j, x in enumerate(flat):
            if isinstance(x, torch.Tensor) and x.is_cuda and x.numel():
                kind = "w" if any(x is m for m in mut) else "r"
                acc.append(
                    Access(
                        x.data_ptr(),
                        extent(x),
                        kind,
                        f"arg{j}",
                        cap.live.find(x.data_ptr()),
                        layout(x),
                        x.dtype,
                    )
                )
        res = [out] if info.n_returns == 1 else (list(out) if info.n_returns else [])
        for i, src in enumerate(info.returns):
            r = res[i] if i < len(res) else None
            if src is not None:
                continue
            for t in r if isinstance(r, (list, tuple)) else [r]:  # Tensor[] returns too
                if not isinstance(t, torch.Tensor) or not t.is_cuda:
                    continue
                a = _new_alloc(cap, t, stream, stack, func)
                if t.numel() and info.kind != "empty":
                    acc.append(Access(t.data_ptr(), extent(t), "w", f"out{i}", a, layout(t), t.dtype))
        if info.kind != "empty":
            cap.trace.events.append(op_step(Op(_next_op(cap), op_name(func), stream, stack, acc)))
        return out

    def _before(self, cap):
        """The forced schedule's hook (nblib.instruments.audit.confirm): called with the index the op
        about to be queued will have, so a spin kernel can be captured just before it."""
        if self.before_op is not None:
            self.before_op(cap.nops)

    # -- raw Triton launches --------------------------------------------------------------------
    def _triton_launch(self, metadata):
        """triton.knobs.runtime.launch_enter_hook: `metadata` is Triton's LazyDict (name, function,
        stream, and what the kernel's launch_metadata returns). Launches made inside a dispatched
        op are already covered by that op's schema."""
        cap = self._cap
        if cap is None or self._guard or metadata is None:
            return
        self._guard += 1
        try:
            self._before(cap)
        finally:
            self._guard -= 1
        data = metadata.get()
        handle = data.get("stream")
        cur = torch.cuda.current_stream()
        if cur.cuda_stream == handle:
            stream = self._stream(cur)
        else:
            key = cap.handles.get(handle)
            stream = cap.names(key) if key is not None else f"stream {handle!r}"
        tensors = launch_tensors(data)
        acc = [
            Access(x.data_ptr(), extent(x), "rw", f"arg{j}", cap.live.find(x.data_ptr()), layout(x), x.dtype)
            for j, x in enumerate(tensors)
            if x.is_cuda and x.numel()
        ]
        op = Op(_next_op(cap), f"triton::{data.get('name', '?')}", stream, python_stack(depth=2), acc)
        op.opaque = not acc
        cap.trace.events.append(op_step(op))


def launch_tensors(data):
    """The tensors a Triton launch's metadata carries (a value, or a list or tuple of them): what the
    kernel's own launch_metadata function chose to return."""
    out = []
    for v in data.values():
        out.extend(x for x in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(x, torch.Tensor))
    return out


def _next_op(cap):
    cap.nops += 1
    return cap.nops - 1


def _new_alloc(cap, t, stream, stack, func):
    """The allocation behind a fresh output, recorded once per storage; its free is recorded where
    the storage's last reference dies (a weakref.finalize holding only `cap` and the Alloc)."""
    st = t.untyped_storage()
    base = st.data_ptr()
    known = cap.live.find(base)
    if known is not None or st.nbytes() == 0:
        return known
    a = Alloc(next(cap.ids), base, st.nbytes(), stream, stack, op=op_name(func))
    cap.live.add(a)
    cap.trace.events.append(alloc_step(a))
    weakref.finalize(st, _freed, cap, a).atexit = False
    return a


def _freed(cap, a):
    cap.live.remove(a)
    if cap.open:  # freed while capturing (later frees do not matter)
        a.freed, a.free_stack = True, python_stack(depth=3)
        cap.trace.events.append(free_step(a))
