"""SimDevice: torch.cuda's names over the simulator (streams, events, graphs, the caching
allocator and the arena behind it), so the model code that calls dev.X runs here as on CUDA."""

import contextlib
import itertools

import numpy as np
import torch

from nblib.backends.sim.allocator import MB, CachingAllocator
from nblib.backends.sim.arena import Arena, raw_bytes
from nblib.backends.sim.capture import Capture, python_stack
from nblib.backends.sim.eager_timing import EagerTiming, StreamClocks
from nblib.backends.sim.graph import CaptureHook, GraphCtx, SimGraph
from nblib.backends.sim.rules import violation
from nblib.backends.sim.streams import SimEvent, SimStream, StreamCtx
from nblib.backends.sim.timing import Timing
from nblib.backends.storage import extent


class SimDevice:
    """torch.cuda's names over the simulator; see the module docstring."""

    name = "sim"

    def __init__(self, seed=0, timing=None, arena_chunk_bytes=256 * MB, threads=1):
        """threads: torch's CPU intra-op threads (None: leave as is). One thread is fastest for the
        small tensors the sim runs and immune to oversubscription (OpenMP spin-waits on a busy
        2-core machine made replays 10-50x slower)."""
        if threads is not None:
            torch.set_num_threads(threads)
        self.torch_device = torch.device("cpu")
        self.timing = timing or Timing.calibrated()
        self.arena = Arena(arena_chunk_bytes)
        self.record_stacks = True  # Python stacks on allocator events and nodes
        self.gc_before_capture = False  # torch.cuda.graph collects first only under force_cudagraph_gc
        self.allocator = CachingAllocator(
            self.arena.segment, context=lambda: python_stack() if self.record_stacks else None
        )
        self._stream_ids = itertools.count()
        self._pool_ids = itertools.count(1)
        self.default_stream = SimStream(self, name="default")
        self._cur = self.default_stream
        self.capture: Capture | None = None  # the capture underway, None when none is
        self.capture_hooks: list[CaptureHook] = []  # run around every graph's capture boundaries
        self._cap_stream = None
        # simulated seconds of GPU work, per stream: a graph replay occupies its stream for its span,
        # an eager op for its kernel's modelled time while eager_timing() is on (else nothing), and
        # an event reads its stream's time, so Event.elapsed_time is simulated time
        self.streams = StreamClocks()
        self.replaying = False  # a graph replay is running its nodes (their ops are the replay's)
        self.manual_seed(seed)

    # streams and events
    def Stream(self, priority=0, **_):
        return SimStream(self, priority)

    def Event(self, enable_timing=False, blocking=False, interprocess=False):
        return SimEvent(self, enable_timing, blocking, interprocess)

    def stream(self, s):
        return StreamCtx(self, s)

    def current_stream(self):
        return self._cur

    def set_stream(self, s):
        """torch.cuda.set_stream: make `s` the current stream (outside a `with dev.stream(...)`)."""
        self._cur = s

    def synchronize(self):
        """Replay completes before returning, so there is nothing to wait for but the clocks; while
        capturing, CUDA refuses a device-wide synchronize."""
        if self.capture is not None:
            raise violation(self, "sync", "synchronize() while capturing")
        self.streams.sync()

    @property
    def clock(self):
        """Simulated seconds when all the GPU work queued so far ends."""
        return self.streams.latest()

    def eager_timing(self):
        """A block in which each eager kernel occupies its stream for the timing model's duration
        (nblib.backends.sim.eager_timing), so events around eager work time it, as on a GPU."""
        return EagerTiming(self)

    def is_capturing(self):
        """Whether a capture is underway on any stream."""
        return self.capture is not None

    def abort_capture(self) -> None:
        """End the capture underway, if any, without a graph (its graph is left empty): for a step
        that began a capture of its own and left it open."""
        if self.capture is not None:
            self.capture.graph.abort_capture()

    # graphs
    def CUDAGraph(self, keep_graph=False):
        return SimGraph(self)

    def graph(self, g, pool=None, stream=None, capture_error_mode="global"):
        return GraphCtx(self, g, pool, stream, capture_error_mode)

    def graph_pool_handle(self):
        return (0, next(self._pool_ids))

    def is_current_stream_capturing(self):
        return self.capture is not None and self._cur in self.capture.frontier

    def capture_stream(self) -> SimStream:
        """The stream dev.graph captures on when given none, made at its first use (torch.cuda.graph's
        default_capture_stream)."""
        if self._cap_stream is None:
            self._cap_stream = SimStream(self, name="capture")
        return self._cap_stream

    def new_stream_id(self) -> int:
        """The next stream's number (0 for the default stream)."""
        return next(self._stream_ids)

    # allocation
    def alloc_like(self, meta: torch.Tensor, stream: SimStream) -> torch.Tensor:
        """An arena tensor shaped like `meta`, allocated for `stream` by the caching allocator."""
        n = extent(meta) + meta.storage_offset() * meta.element_size()
        if n == 0:
            return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
        addr, block = self.allocator.malloc(n, stream)
        t = self.arena.tensor(addr, n, meta.dtype, meta.shape, meta.stride(), _Freer(self.allocator, block))
        if meta.storage_offset():
            t = t.as_strided(meta.shape, meta.stride(), meta.storage_offset())
        return t

    @staticmethod
    def bytes_at(addr, nbytes):
        """The device memory at [addr, addr+nbytes) as a uint8 tensor view (nothing kept alive)."""
        return raw_bytes(addr, nbytes)

    @staticmethod
    def serial():
        """A block in which eager work runs in host order, whatever its streams: the simulator's
        eager ops already do."""
        return contextlib.nullcontext()

    def record_stream(self, t, stream):
        """t.record_stream(stream): its block is not reused before the capture ends."""
        if isinstance(t, torch.Tensor) and self.arena.owns(t):
            b = self.block_of(t)
            if b is not None:
                self.allocator.record_stream(b, stream)

    def block_of(self, t):
        """The allocated block behind arena tensor t, or None."""
        return self.allocator.active.get(t.untyped_storage().data_ptr())

    # misc
    def manual_seed(self, seed):
        """Seed the replay timing model (a new jitter draw every replay)."""
        self.jitter_rng = np.random.default_rng(seed)

    def device_name(self):
        return "CPU simulator"

    def memory_history(self, enabled):
        self.record_stacks = bool(enabled)

    def memory_snapshot(self):
        return self.allocator.snapshot()


class _Freer:
    __slots__ = ("allocator", "block")

    def __init__(self, allocator, block):
        self.allocator, self.block = allocator, block

    def __call__(self):
        self.allocator.free(self.block)
