"""The simulator's recorder. The simulator's capture already records everything the audit needs:
graph nodes (op, stream, byte accesses, Python stack, allocator log position), Sync records, and
the allocator's log (alloc and free with address, size, allocation stream and stack). While the
`with` block runs, the recorder is one of its device's capture hooks (dev.capture_hooks, around
every graph's capture_begin, capture_end and abort_capture) and merges those into one
program-order trace when each capture ends; it installs nothing in the capture itself."""

import gc
import weakref
from typing import NamedTuple

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


class _Pending(NamedTuple):
    """A capture underway on a recorded device: its trace, where its allocator log starts, its stream."""

    trace: object
    log_start: int
    main: object
    gc_was_enabled: bool


class SimRecording(Recording):
    """A capture hook on its device (nblib.backends.sim.graph.CaptureHook) while the block runs: one
    trace per capture."""

    def _install(self):
        self._pending = weakref.WeakKeyDictionary()  # graph -> _Pending, for each capture underway
        hooks = self.dev.capture_hooks
        hooks.append(self)
        self._undo.append(lambda: hooks.remove(self))

    def begin(self, g, run):
        """Around capture_begin: no collection while the capture is underway, and a trace for it."""
        start, stream, was = len(g.dev.allocator.log), g.dev.current_stream(), gc.isenabled()
        gc.disable()  # as on CUDA: no collection inside an audited capture (trace/cuda.py says why)
        try:
            run()
        except BaseException:
            _resume(was)
            raise
        self._pending[g] = _Pending(self.new_trace(), start, stream, was)

    def end(self, g, run):
        """Around capture_end: the trace built from the graph and the allocator log."""
        p = self._pending.get(g)
        try:
            run()
        finally:
            if p is not None:
                _resume(p.gc_was_enabled)
        self._pending.pop(g, None)
        if p is not None:
            build(g, p.trace, p.log_start, p.main)

    def abort(self, g, run):
        """Around abort_capture: the trace stays incomplete."""
        p = self._pending.pop(g, None)
        if p is not None:
            _resume(p.gc_was_enabled)
        run()


def _resume(was_enabled):
    if was_enabled:
        gc.enable()


def build(g, trace, start, main):
    """Merge the graph's nodes and syncs and the allocator log from `start` into one program-order
    event list."""
    log = g.dev.allocator.log
    name = stream_namer(main)
    live, allocs, ev = Live(), {}, trace.events
    ids = iter(range(1 << 62))
    li, si = start, 0
    syncs = g.syncs  # in program order
    event_clock = {}  # id(event) -> the clock of its latest record

    def flush_log(upto, op):
        nonlocal li
        while li < upto:
            e = log[li]
            li += 1
            if e["action"] == "alloc":
                a = Alloc(next(ids), e["addr"], e["size"], name(e["stream"]), e["stack"] or [], op=op)
                allocs[e["addr"]] = a
                live.add(a)
                ev.append(alloc_step(a))
            elif e["action"] == "free_requested" and e["addr"] in allocs:
                a = allocs.pop(e["addr"])
                a.freed, a.free_stack = True, e["stack"] or []
                live.remove(a)
                ev.append(free_step(a))

    def flush_syncs(upto):
        nonlocal si
        while si < len(syncs) and syncs[si].at <= upto:
            s = syncs[si]
            si += 1
            if s.kind == "wait_stream":
                clock = ("wait_stream", si)
                ev.append(record_step(name(s.other), clock))
                ev.append(wait_step(name(s.stream), clock))
            elif s.kind == "wait_event":
                clock = event_clock.setdefault(id(s.other), ("event", id(s.other)))
                ev.append(wait_step(name(s.stream), clock))
            elif s.kind == "record":
                clock = ("event", id(s.other), si)  # each record is a new clock value
                event_clock[id(s.other)] = clock
                ev.append(record_step(name(s.stream), clock))

    for n in g.nodes:
        before = len(ev)
        flush_log(n.alloc_seq, "aten::empty")
        outs = {a.addr for a in n.accesses if a.what.startswith("out")}
        for e in ev[before:]:  # this node's outputs were allocated just before it
            if e.kind == "alloc" and e.alloc.addr in outs:
                e.alloc.op = op_name(n.op)
        flush_syncs(n.index)
        acc = [
            Access(a.addr, a.nbytes, a.kind, a.what, live.find(a.addr), a.layout, a.dtype)
            for a in n.accesses
            if a.nbytes
        ]
        ev.append(op_step(Op(n.index, op_name(n.op), name(n.stream), n.stack or [], acc)))
    flush_log(len(log), "aten::empty")
    flush_syncs(1 << 62)
    trace.graph = g
    trace.complete = True
