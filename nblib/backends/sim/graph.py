"""Graphs and replay: SimGraph has torch.cuda.CUDAGraph's surface (capture_begin, capture_end,
replay, reset, pool) and dev.graph(...) is torch.cuda.graph. Replay runs the captured nodes in
simulated-time order: each node computes at its end (a kernel reads its inputs over its whole run),
so a write from another stream that lands while a reader runs corrupts it, as the timing model says."""

import functools
import gc
import weakref
from collections.abc import Callable
from typing import Protocol

import numpy as np

from nblib.backends.capture_rules import SimCaptureError
from nblib.backends.opinfo import warm_up_dispatch_modes
from nblib.backends.sim.capture import Capture, CaptureMode
from nblib.backends.sim.rules import invalidate, violation
from nblib.backends.sim.timing import schedule
from nblib.core import collector


class CaptureHook(Protocol):
    """Code run around the capture boundaries of every graph of one device (dev.capture_hooks): each
    method gets the graph and `run`, the boundary itself with the hooks added before this one around
    it, and calls run() once. The audit's recorder (nblib.instruments.audit.trace.sim) is one."""

    def begin(self, graph: "SimGraph", run: Callable[[], None]) -> None: ...

    def end(self, graph: "SimGraph", run: Callable[[], None]) -> None: ...

    def abort(self, graph: "SimGraph", run: Callable[[], None]) -> None: ...


class SimGraph:
    """torch.cuda.CUDAGraph's surface: capture_begin/capture_end (or dev.graph), replay, reset, pool.
    After capture: nodes (Node list), syncs (Sync list), pool_id; after each replay,
    last_schedule (a timing.Schedule: starts, ends in simulated seconds). Each replay occupies the
    current stream's clock (dev.streams) for its span."""

    def __init__(self, dev):
        self.dev = dev
        self.nodes, self.syncs, self.pool_id = [], [], None
        self._ready = False
        self.last_schedule = None

    def pool(self):
        return self.pool_id

    def capture_begin(self, pool=None, capture_error_mode="global"):
        """Begin capturing on the current stream into the pool `pool` (None: a new one); the device's
        capture hooks run around it."""
        self._through_hooks("begin", lambda: self._begin(pool))

    def _begin(self, pool):
        dev = self.dev
        if dev.capture is not None:
            raise SimCaptureError("a capture is already underway")
        stream = dev.current_stream()
        if stream is dev.default_stream:
            raise violation(dev, "default_stream", "capture_begin on the default stream")
        self.pool_id = pool if pool is not None else dev.graph_pool_handle()
        warm_up_dispatch_modes()
        cap = Capture(dev, self, stream, self.pool_id)
        dev.capture = cap
        dev.allocator.begin_capture(self.pool_id)
        self._mode = CaptureMode(cap)
        self._mode.__enter__()

    def capture_end(self):
        """End the capture this graph began (on the stream it began on) and make the graph
        replayable; the device's capture hooks run around it."""
        self._through_hooks("end", self._end)

    def _end(self):
        dev = self.dev
        cap, stream = dev.capture, dev.current_stream()
        if cap is not None and cap.graph is self and stream is not cap.stream:
            raise violation(dev, "end_stream", f"capture_end on {stream.name}, begun on {cap.stream.name}")
        cap = self._finish()
        if cap.invalid is not None:
            raise violation(
                dev, "invalidated", f"capture_end after the capture broke ({cap.invalid})", cap.invalid
            )
        end = cap.frontier[cap.stream]
        seen, todo = set(), list(end)
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(cap.nodes[i].deps)
        for s, fr in cap.frontier.items():
            if any(i not in seen for i in fr):
                raise violation(
                    dev,
                    "unjoined",
                    f"capture ended with work on {s.name} not joined into the capturing stream: "
                    f"call capture_stream.wait_stream({s.name})",
                )
        self.nodes, self.syncs = cap.nodes, cap.syncs
        self.capture_stream = cap.stream
        n = len(self.nodes)
        self._deps = [nd.deps for nd in self.nodes]
        self._serial = all((i - 1) in self._deps[i] for i in range(1, n))
        self._run = [nd.run for nd in self.nodes]
        self._nbytes = np.array([nd.nbytes for nd in self.nodes], dtype=np.float64)
        self._costs = [(i, nd.cost) for i, nd in enumerate(self.nodes) if nd.cost is not None]
        self._rows = {i: nd.rows for i, nd in enumerate(self.nodes) if nd.rows}
        self._ready = True
        weakref.finalize(self, _destroyed, dev).atexit = False

    def _finish(self):
        dev = self.dev
        cap = dev.capture
        if cap is None or cap.graph is not self:
            raise SimCaptureError("capture_end without a matching capture_begin")
        try:
            self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            dev.capture = None
            dev.allocator.end_capture()
            cap.graph = None  # events recorded in the capture keep it: they must not keep the graph
        return cap

    def abort_capture(self):
        """Drop the capture this graph began, if it is underway, and leave the graph empty (not
        replayable); the device's capture hooks run around it."""
        self._through_hooks("abort", self._abort)

    def _abort(self):
        cap = self.dev.capture
        if cap is not None and cap.graph is self:
            self._finish()
        self.nodes, self._ready = [], False

    def _through_hooks(self, boundary, run):
        """run(), with each of the device's capture hooks around it (the hook added last outermost)."""
        for hook in self.dev.capture_hooks:
            run = functools.partial(getattr(hook, boundary), self, run)
        run()

    def reset(self):
        self.nodes, self.syncs, self._ready = [], [], False

    def expected_seconds(self):
        """The replay's span under the timing model without jitter: when its last node ends, in
        simulated seconds, for this replay's inputs (data-dependent kernels included)."""
        tm = self.dev.timing
        dur = tm.seconds(self._nbytes)
        for i, cost in self._costs:
            dur[i] = cost(tm)
        return max(schedule(self._deps, dur.tolist()).ends, default=0.0)

    def replay(self, delays=None):
        """Run the graph. delays (node index -> simulated seconds): those nodes start that much later
        than their dependencies allow, as behind a spin kernel on their stream; the audit's forced
        schedule (`--confirm`) alone passes it."""
        if not self._ready:
            raise RuntimeError("replay of a graph that was not captured successfully")
        n = len(self.nodes)
        if n == 0:
            return
        dev = self.dev
        dev.replaying = True
        try:
            span = self._replay_nodes(delays or {})
        finally:
            dev.replaying = False
        dev.streams.run(dev.current_stream(), span)

    def _replay_nodes(self, delays):
        """Run the nodes in simulated-time order; returns the replay's span."""
        if self._serial and not delays:  # one stream: the timing model cannot reorder anything
            for f in self._run:
                f()
            return self._serial_seconds()
        tm = self.dev.timing
        dur = tm.seconds(self._nbytes)
        for i, cost in self._costs:  # data-dependent kernels: this replay's inputs decide
            dur[i] = cost(tm)
        jitter = tm.jitter(len(self.nodes), self.dev.jitter_rng)
        dur = dur * jitter
        if tm.free_side_ops:
            main, free = self.capture_stream, tm.free_side_ops
            idx = [i for i, nd in enumerate(self.nodes) if nd.stream is not main and nd.op in free]
            dur[idx] = tm.latency * jitter[idx] if tm.free_side_bytes else 0.0
        sched = schedule(self._deps, dur.tolist(), delays)
        for _, _, _, f in sorted(self._steps(sched), key=lambda e: e[:3]):
            f()
        self.last_schedule = sched
        return max(sched.ends)

    def _steps(self, sched):
        """(time, node, part, closure) for one replay. A kernel reads its inputs over its whole run,
        so its result reflects them as they stand when it finishes: each node computes at its end,
        and a write that lands on another stream while a reader is still running corrupts what the
        reader returns, as on the GPU. A copy streams its rows in order: row r of R is done at
        start + (r + 1) / R of its run."""
        for i in range(len(self.nodes)):
            rows = self._rows.get(i)
            if rows is None:
                yield sched.ends[i], i, 0, self._run[i]
                continue
            start, span = sched.starts[i], sched.ends[i] - sched.starts[i]
            for r, f in enumerate(rows):
                yield (sched.ends[i] if r == len(rows) - 1 else start + span * (r + 1) / len(rows)), i, r, f

    def _serial_seconds(self):
        """One stream's replay under the timing model, without jitter: its nodes' durations summed."""
        tm = self.dev.timing
        dur = tm.seconds(self._nbytes)
        for i, cost in self._costs:
            dur[i] = cost(tm)
        return float(dur.sum())


class GraphCtx:
    """dev.graph(g, pool, stream): like torch.cuda.graph, capture on a side stream (shared by all
    captures unless `stream` is given); on error, nothing is left half-finished."""

    def __init__(self, dev, g, pool=None, stream=None, capture_error_mode="global"):
        self.dev, self.g, self.pool = dev, g, pool
        self.stream = stream if stream is not None else dev.capture_stream()

    def __enter__(self):
        if self.dev.gc_before_capture:  # opt-in: a collection costs ~80 ms per capture
            gc.collect()
        # as the CUDA facade does: no dead graph may be destroyed inside this capture by the collector
        self._collector = collector.paused()
        self._collector.__enter__()
        self.prev = self.dev.current_stream()
        self.dev.set_stream(self.stream)
        try:
            self.g.capture_begin(pool=self.pool)
        except BaseException:
            self.dev.set_stream(self.prev)
            self._collector.__exit__(None, None, None)
            raise

    def __exit__(self, et, ev, tb):
        try:
            if et is None:
                self.g.capture_end()
            else:
                self.g.abort_capture()
        except BaseException:
            self.g.abort_capture()
            raise
        finally:
            self.dev.set_stream(self.prev)
            self._collector.__exit__(None, None, None)
        return False


def _destroyed(dev):
    """A captured graph died (CUDA: cudaGraphExecDestroy). Inside another capture that breaks it."""
    invalidate(dev, "graph_destroyed", "a captured graph was destroyed while capturing")
