"""One facade, two backends: model, runner and workload code call `dev.X` where they would call
`torch.cuda.X`, so the same decode step runs on a real GPU ("cuda") and on the CPU simulator ("sim").

    dev = nblib.backends.device.get("cuda" | "sim" | "auto")
    s = dev.Stream(); with dev.stream(s): ...; dev.current_stream().wait_stream(s)
    g = dev.CUDAGraph(); with dev.graph(g, pool=dev.graph_pool_handle()): ...; g.replay()

This module is where nblib calls torch.cuda: the facade, and the host's questions asked before any
device is opened (has_cuda, gpu_count, gpu_name; cuda_graph_seconds times a function on CUDA).
Two modules call torch.cuda themselves, by design, because they watch torch.cuda rather than use it:
  nblib.instruments.audit.trace.cuda  the CUDA recorder patches torch.cuda.CUDAGraph, Event and Stream
                                and asks torch.cuda for the current stream and whether it captures,
                                to see every call a real capture makes (the facade's included)
  nblib.instruments.csan        PyTorch's own CUDA sanitizer (torch.cuda._sanitizer), which hooks
                                torch.cuda process-wide, in a child process, CUDA only
"""

import contextlib
from typing import TYPE_CHECKING, TypeAlias

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nblib.core import collector

if TYPE_CHECKING:  # for type hints only: get() imports the simulator lazily
    from nblib.backends.sim.facade import SimDevice

BACKENDS = ("cuda", "sim")
# what get() returns: the type of `dev` wherever nblib takes the facade
Device: TypeAlias = "CudaDevice | SimDevice"


class CudaDevice:
    """A thin alias of torch.cuda (the module docstring says where else nblib calls torch.cuda)."""

    name = "cuda"

    def __init__(self):
        self.torch_device = torch.device("cuda", torch.cuda.current_device())
        self.Event = torch.cuda.Event
        self.CUDAGraph = torch.cuda.CUDAGraph
        self.stream = torch.cuda.stream
        self.current_stream = torch.cuda.current_stream
        self.graph_pool_handle = torch.cuda.graph_pool_handle
        self.synchronize = torch.cuda.synchronize
        self.is_current_stream_capturing = torch.cuda.is_current_stream_capturing
        self.manual_seed = torch.cuda.manual_seed
        self.set_stream = torch.cuda.set_stream

    @property
    def default_stream(self):
        """The device's legacy default stream (the simulator's facade has the same attribute)."""
        return torch.cuda.default_stream(self.torch_device)

    @staticmethod
    @contextlib.contextmanager
    def graph(g, **kwargs):
        """torch.cuda.graph(g, **kwargs) with the cyclic collector paused while it captures, so that
        no dead graph from earlier work is destroyed inside this capture (see nblib.core.collector).
        cuBLAS's handle is made first: a process whose first matmul is captured would otherwise call
        cublasCreate inside the capture, which fails (CUBLAS_STATUS_NOT_INITIALIZED)."""
        torch.cuda.current_blas_handle()
        with collector.paused(), torch.cuda.graph(g, **kwargs):
            yield

    def device_name(self):
        return torch.cuda.get_device_name(self.torch_device)

    @staticmethod
    def abort_capture() -> None:
        """Nothing is done on CUDA: torch has no way to end a capture without the graph that began it,
        so a stream left capturing stays so (the simulator's facade ends its capture)."""

    @staticmethod
    def eager_timing():
        """Nothing to do: the GPU times eager kernels itself (the simulator's facade models them)."""
        return contextlib.nullcontext()

    @staticmethod
    def Stream(*args, **kwargs):  # noqa: N802  (spelled as torch.cuda.Stream, which it replaces)
        """A new side stream that is neither the capture stream nor the current one.

        torch.cuda.Stream() hands out streams round robin from a fixed pool (32 per priority), so
        after enough draws a "side" stream is the very stream torch.cuda.graph captures on: the
        planned overlap silently becomes one serial stream, and a race in the code is not a race
        in the graph (tests/test_device.py shows it on the GPU)."""
        new = lambda: torch.cuda.Stream(*args, **kwargs)  # noqa: E731
        return distinct_stream(new, torch.cuda.graph, torch.cuda.current_stream)

    @staticmethod
    def bytes_at(addr, nbytes):
        """The device memory at [addr, addr+nbytes) as a uint8 tensor view (nothing kept alive),
        through the CUDA array interface torch.as_tensor reads."""
        return torch.as_tensor(_DeviceBytes(addr, nbytes), device="cuda")

    @staticmethod
    def serial():
        """A block in which eager work runs in host order, whatever its streams: the device is
        synchronized after each op, so no two kernels overlap (an eager reference for the audit)."""
        return _Serial()

    @staticmethod
    def spin(seconds):
        """A kernel that spins for about `seconds` on the current stream (captured into a graph when
        capturing): the audit's forced schedule, never the suite's runs."""
        hz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate * 1e3  # kHz
        torch.cuda._sleep(int(seconds * hz))  # private: torch's own tests use it to delay a stream

    @staticmethod
    def record_stream(t, stream):
        """t.record_stream(stream), spelled the same on both backends (CPU tensors have none)."""
        t.record_stream(stream)

    def memory_history(self, enabled):
        """Record the caching allocator's alloc/free trace (addresses, sizes, streams, stacks)."""
        # private, and no public API records the trace (torch.cuda.memory_snapshot() gives the
        # segments only); PyTorch's memory docs name these two (tests/test_private_api.py)
        torch.cuda.memory._record_memory_history("all" if enabled else None, stacks="python")

    def memory_snapshot(self):
        return torch.cuda.memory._snapshot()


class _DeviceBytes:
    """Device memory by address, for torch.as_tensor (the CUDA array interface, version 3)."""

    def __init__(self, addr, nbytes):
        self.__cuda_array_interface__ = dict(
            data=(addr, False), shape=(nbytes,), typestr="|u1", version=3, strides=None
        )


class _Serial(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize()
        return out


def distinct_stream(new_stream, graph_cls, current_stream, tries=64):
    """new_stream() until it differs from the graph class's capture stream and the current stream."""
    # default_capture_stream: an undocumented class attribute, no public API names the stream
    # torch.cuda.graph captures on by default (tests/test_private_api.py)
    if graph_cls.default_capture_stream is None:  # torch creates it lazily at the first capture
        graph_cls.default_capture_stream = new_stream()
    taken = {graph_cls.default_capture_stream.cuda_stream, current_stream().cuda_stream}
    for _ in range(tries):
        s = new_stream()
        if s.cuda_stream not in taken:
            return s
    raise RuntimeError(f"no side stream distinct from the capture stream in {tries} draws from torch's pool")


def has_cuda():
    return torch.cuda.is_available()


def gpu_count():
    """GPUs this process sees (0 without CUDA): one per lane or sweep worker."""
    return torch.cuda.device_count()


def gpu_name():
    """The current GPU's name, asked before (or without) opening the device facade."""
    return torch.cuda.get_device_name()


def get(name="auto"):
    """The device facade for `name`: "cuda", "sim", or "auto" (cuda when present, else sim)."""
    if name == "auto":
        name = "cuda" if has_cuda() else "sim"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)} (or auto)")
    if name == "cuda":
        if not has_cuda():
            raise RuntimeError(
                "backend 'cuda' needs a CUDA GPU and this machine has none: "
                "use backend 'sim' (the CPU simulator) instead"
            )
        return CudaDevice()
    from nblib.backends import sim  # imported lazily: the simulator is pure CPU code

    return sim.SimDevice()


def cuda_graph_seconds(fn, replays, warmup=10):
    """fn captured into a CUDA graph (after one eager warm-up on a side stream, as torch asks), then
    `replays` replays each timed with CUDA events after `warmup` untimed ones: seconds per replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with collector.paused(), torch.cuda.graph(g):
        fn()
    from kernels.harness import replay_ms  # lazily: it imports Triton

    return [ms * 1e-3 for ms in replay_ms(g, replays, warmup)]
