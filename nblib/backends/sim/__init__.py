"""The CPU simulator: CUDA streams, events, graph capture and the caching allocator, on the CPU.

The point is fidelity of the mechanism, not speed: a captured graph's tensors live in one byte
arena handed out by a caching allocator that follows PyTorch's CUDACachingAllocator policy, so
when the allocator hands a freed block to a new tensor the two really share bytes; replay runs the
captured nodes through a seeded timing model, so two nodes on different streams with no
dependency edge between them interleave, and one can clobber the other's data -- sometimes.

    dev = SimDevice()
    side = dev.Stream()
    g = dev.CUDAGraph()
    with dev.graph(g, pool=dev.graph_pool_handle()):
        ...plain torch code, with dev.stream(side): ... ...
    g.replay()

Modules, bottom to top:
  allocator  pure Python, addresses only: rounding, small/large pools, best fit keyed by stream,
             split and merge, private pools, record_stream, an allocation log
  arena      CPU memory behind the addresses; tensors are views of it, and a block is freed when
             the last tensor sharing its storage dies (CPython refcounting)
  fastops    host shortcuts a replayed node runs in place of its op: the same bytes, sooner
  gemm       bf16 mm/bmm as a GPU computes them (fp32 sums, one rounding), installed on import
  heap       glibc's thresholds raised on import, so large host tensors reuse freed blocks
  rules      a broken capture rule (nblib.backends.capture_rules): SimCaptureError where CUDA
             fails the capture, and the capture it invalidates
  streams    streams and events: bookkeeping; while capturing they carry dependency frontiers
  capture    a TorchDispatchMode: view ops run at once (no memory), every other op is recorded as
             a node with its outputs allocated from the arena; nothing runs
  timing     the replay timing model: per-node durations from bytes moved and a seeded jitter
  eager_timing  eager kernels on per-stream clocks under the same model (dev.eager_timing()), so
             events around an eager step time it
  graph      SimGraph and dev.graph: capture begin/end, and replay in simulated-time order (each
             node computes at its end: it reads its inputs over its whole run, as a kernel does)
  facade     SimDevice, with torch.cuda's names

Beside it in nblib.backends, shared with the CUDA trace recorder: opinfo (what each op does to
memory, from its schema), storage (a tensor's byte extent and layout) and capture_rules (what a
capture forbids, as CUDA says it).

Outside capture, torch runs as plain CPU torch in program order (eager decode never forks), and
persistent tensors (weights, caches, static inputs) are ordinary CPU tensors outside the arena,
like tensors allocated outside a graph pool on CUDA.
"""

from nblib.backends.capture_rules import SimCaptureError
from nblib.backends.sim.allocator import (
    MB,
    MIN_BLOCK,
    SMALL_SIZE,
    Block,
    CachingAllocator,
    allocation_size,
    round_size,
)
from nblib.backends.sim.arena import Arena
from nblib.backends.sim.capture import Node, NodeAccess, python_stack
from nblib.backends.sim.facade import SimDevice
from nblib.backends.sim.gemm import install as _install_gemm
from nblib.backends.sim.graph import SimGraph
from nblib.backends.sim.heap import keep_large_blocks as _keep_large_blocks
from nblib.backends.sim.streams import SimEvent, SimStream, Sync
from nblib.backends.sim.timing import Schedule, Timing

_install_gemm()  # eager steps, replays and CPU references share one bf16 GEMM (gemm.py)
_keep_large_blocks()  # a step's tens-of-MB tensors reuse the heap's blocks (heap.py)

__all__ = [
    "MB",
    "MIN_BLOCK",
    "SMALL_SIZE",
    "Arena",
    "Block",
    "CachingAllocator",
    "Node",
    "NodeAccess",
    "Schedule",
    "SimCaptureError",
    "SimDevice",
    "SimEvent",
    "SimGraph",
    "SimStream",
    "Sync",
    "Timing",
    "allocation_size",
    "python_stack",
    "round_size",
]
