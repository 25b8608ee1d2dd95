"""Streams and events. Outside capture eager work runs in program order and they keep the streams'
simulated clocks (dev.streams: a wait makes one stream's next work start after the other's); while
capturing, each stream in the capture carries a dependency frontier (the graph nodes its next
node waits for), an event recorded in the capture snapshots its stream's frontier, and a wait
merges one frontier into another. Every sync is logged as a Sync record for the trace."""

from typing import NamedTuple

from nblib.backends.sim.rules import invalidate, violation


class Sync(NamedTuple):
    """One stream/event edge made while capturing."""

    kind: str  # "record" (an event on a stream) | "wait_event" | "wait_stream"
    stream: object  # the stream that records or waits
    other: object  # the event recorded or waited on, or the stream waited on
    at: int  # graph nodes recorded before it (its place in program order)


class SimStream:
    """A stream: bookkeeping in eager mode; while capturing, it carries a dependency frontier."""

    def __init__(self, dev, priority=0, name=None):
        self.dev, self.priority = dev, priority
        self.id = dev.new_stream_id()
        self.name = name or f"stream{self.id}"

    def wait_stream(self, other):
        """Work queued on self after this waits for all work queued on `other` so far (torch: an
        event recorded on `other`, waited on by self)."""
        cap = self.dev.capture
        if cap is not None and other in cap.frontier:
            cap.frontier[self] = union(cap.frontier.get(self), cap.frontier[other])
            cap.syncs.append(Sync("wait_stream", self, other, len(cap.nodes)))
        elif cap is not None and self in cap.frontier:
            raise violation(self.dev, "isolation", f"{self.name}.wait_stream({other.name}) while capturing")
        elif cap is None:
            self.dev.streams.wait(self, self.dev.streams.start(other))

    def wait_event(self, event):
        cap = self.dev.capture
        if cap is not None and event.capture is cap:
            cap.frontier[self] = union(cap.frontier.get(self), event.frontier)
            cap.syncs.append(Sync("wait_event", self, event, len(cap.nodes)))
        elif cap is not None and self in cap.frontier and event.recorded:
            if event.capture is None:
                raise violation(
                    self.dev, "isolation", f"{self.name} waits on an event recorded outside the capture"
                )
            # recorded in another capture: as on CUDA, the wait is accepted and the capture broken
            invalidate(self.dev, "merge", f"{self.name} waited on an event recorded in another capture")
        elif cap is None and event.at is not None:
            self.dev.streams.wait(self, event.at)

    def record_event(self, event=None):
        event = event or SimEvent(self.dev)
        event.record(self)
        return event

    def synchronize(self):
        if self._capturing():
            raise violation(self.dev, "sync", f"{self.name}.synchronize() while it captures")
        self.dev.streams.sync(self)

    def query(self):
        if self._capturing():
            raise violation(self.dev, "query", f"{self.name}.query() while it captures")
        return True

    def _capturing(self):
        cap = self.dev.capture
        return cap is not None and self in cap.frontier

    def __repr__(self):
        return f"<SimStream {self.name}>"


class SimEvent:
    def __init__(self, dev, enable_timing=False, blocking=False, interprocess=False):
        self.dev = dev
        # the capture of its latest record (None: eager), and its stream's frontier there (the nodes
        # a wait on it waits for)
        self.capture, self.frontier = None, ()
        self.recorded = False  # never recorded: waiting on it waits for nothing, as on CUDA
        self.at = None  # its stream's clock at its latest record outside a capture (simulated seconds)

    def record(self, stream=None):
        stream = stream or self.dev.current_stream()
        cap = self.dev.capture
        self.recorded = True
        if cap is not None and stream in cap.frontier:
            self.capture, self.frontier = cap, cap.frontier[stream]
            cap.syncs.append(Sync("record", stream, self, len(cap.nodes)))
        else:
            self.capture, self.frontier = None, ()
            self.at = self.dev.streams.start(stream)

    def elapsed_time(self, end):
        """Milliseconds of simulated GPU time between this event's record and end's (graph replays,
        and eager kernels under dev.eager_timing()), as torch.cuda.Event.elapsed_time."""
        if self.at is None or end.at is None:
            raise RuntimeError("elapsed_time of an event not recorded outside a capture")
        return (end.at - self.at) * 1e3

    def wait(self, stream=None):
        (stream or self.dev.current_stream()).wait_event(self)

    def synchronize(self):
        if self._captured():
            raise violation(
                self.dev, "captured_event", "event.synchronize() on an event recorded in the capture"
            )
        if self.at is not None:
            self.dev.streams.host_waits(self.at)

    def query(self):
        if self._captured():
            raise violation(self.dev, "captured_event", "event.query() on an event recorded in the capture")
        return True

    def _captured(self):
        return self.capture is not None and self.capture is self.dev.capture


def union(a, b):
    """Two frontiers merged (sorted node indices)."""
    if not a:
        return b
    return tuple(sorted(set(a) | set(b)))


class StreamCtx:
    """dev.stream(s): make s current for the block (None: leave the current stream)."""

    def __init__(self, dev, stream):
        self.dev, self.s = dev, stream

    def __enter__(self):
        self.prev = self.dev.current_stream()
        if self.s is not None:
            self.dev.set_stream(self.s)
        return self.s

    def __exit__(self, *exc):
        self.dev.set_stream(self.prev)
        return False
