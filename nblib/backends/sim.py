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

Layers, top to bottom:
  1. CachingAllocator   pure Python, addresses only: rounding, small/large pools, best fit keyed by
                        stream, split and merge, private pools, record_stream, an allocation log
  2. Arena              CPU memory behind the addresses; tensors are views of it, and a block is
                        freed when the last tensor sharing its storage dies (CPython refcounting)
  3. streams, events    bookkeeping; while capturing they carry dependency frontiers
  4. capture            a TorchDispatchMode: view ops run at once (no memory), every other op is
                        recorded as a node with its outputs allocated from the arena; nothing runs
  5. replay             nodes start when their dependencies end; each reads its inputs at its start
                        and writes its outputs at its end, in simulated-time order; durations come
                        from bytes moved and a seeded lognormal jitter
  6. SimDevice          the facade, with torch.cuda's names

Outside capture, torch runs as plain CPU torch in program order (eager decode never forks), and
persistent tensors (weights, caches, static inputs) are ordinary CPU tensors outside the arena,
like tensors allocated outside a graph pool on CUDA.
"""

import bisect
import gc
import itertools
import os
import sys
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

# ------------------------------------------------------------------------------------------------
# 1. The caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings)
# ------------------------------------------------------------------------------------------------

MB = 1 << 20
MIN_BLOCK = 512  # kMinBlockSize: every size is rounded up to a multiple of this
SMALL_SIZE = 1 * MB  # kSmallSize: blocks up to this come from the small pool
SMALL_BUFFER = 2 * MB  # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MB  # kLargeBuffer: segment size for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MB  # kMinLargeAlloc
ROUND_LARGE = 2 * MB  # kRoundLarge: larger requests get segments rounded up to this


def round_size(size):
    """round_size(): at least 512 bytes, rounded up to a multiple of 512."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size):
    """get_allocation_size(): the segment to cudaMalloc when no cached block fits `size`."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


class Segment:
    """One cudaMalloc: [addr, addr+size), owned by a pool and the stream that allocated it."""

    __slots__ = ("addr", "size", "stream", "pool", "head")

    def __init__(self, addr, size, stream, pool):
        self.addr, self.size, self.stream, self.pool, self.head = addr, size, stream, pool, None


class Block:
    """A contiguous piece of a segment; prev/next link the pieces of one segment by address."""

    __slots__ = (
        "addr",
        "size",
        "requested",
        "stream",
        "pool",
        "prev",
        "next",
        "allocated",
        "stream_uses",
        "segment",
        "__weakref__",
    )

    def __init__(self, addr, size, stream, pool, segment):
        self.addr, self.size, self.stream, self.pool, self.segment = addr, size, stream, pool, segment
        self.requested = 0
        self.prev = self.next = None
        self.allocated = False
        self.stream_uses = set()

    def __repr__(self):
        state = "allocated" if self.allocated else "free"
        return f"Block({self.addr:#x}, {self.size}, {state}, stream={_name(self.stream)})"


class BlockPool:
    """Free blocks of one size class, ordered like BlockComparatorSize: stream, size, address."""

    def __init__(self, is_small, pool_id):
        self.is_small, self.pool_id = is_small, pool_id
        self.free = {}  # stream -> sorted [(size, addr)]
        self.by_addr = {}  # addr -> free Block

    def insert(self, b):
        bisect.insort(self.free.setdefault(b.stream, []), (b.size, b.addr))
        self.by_addr[b.addr] = b

    def erase(self, b):
        lst = self.free[b.stream]
        del lst[bisect.bisect_left(lst, (b.size, b.addr))]
        del self.by_addr[b.addr]

    def best_fit(self, stream, size):
        """get_free_block(): the smallest free block of `stream` with size >= `size`, lowest address
        among equals. Blocks freed by another stream are never considered."""
        lst = self.free.get(stream)
        if not lst:
            return None
        i = bisect.bisect_left(lst, (size, -1))
        return self.by_addr[lst[i][1]] if i < len(lst) else None


class PoolPair:
    """A memory pool: the default one or a graph's private pool, each with small and large blocks."""

    def __init__(self, pool_id):
        self.id = pool_id
        self.small = BlockPool(True, pool_id)
        self.large = BlockPool(False, pool_id)


def _virtual_segments(base=0x7F0000000000):
    """Default segment source for the allocator used alone: fake, 2 MiB-aligned addresses."""
    nxt = [base]

    def alloc(nbytes):
        addr = nxt[0]
        nxt[0] += ROUND_LARGE * ((nbytes + ROUND_LARGE - 1) // ROUND_LARGE)
        return addr

    return alloc


class CachingAllocator:
    """PyTorch's CUDA caching allocator policy over plain integer addresses.

    malloc(size, stream) -> (addr, block); free(block); record_stream(block, stream).
    begin_capture(pool_id) routes allocations into a private pool (shared by every capture given
    the same id) until end_capture(); frees of record_stream'ed blocks during capture are deferred
    until the capture ends. `log` lists every event: dicts with seq, action (segment_alloc, alloc,
    free_requested, free_completed), addr, size (requested bytes), block_size, stream, pool, stack.
    """

    def __init__(self, segment_alloc=None, context=None):
        self.segment_alloc = segment_alloc or _virtual_segments()
        self.context = context  # () -> stack summary, or None
        self.default = PoolPair(None)
        self.private = {}  # pool id -> PoolPair
        self.capture_pool = None  # PoolPair allocations are routed to while capturing
        self.deferred = []  # record_stream'ed blocks freed during capture
        self.segments = []  # Segment list, in allocation order
        self.active = {}  # addr -> allocated Block
        self.log = []
        self._seq = itertools.count()

    # -- pools --------------------------------------------------------------------------------
    def pool(self, pool_id):
        if pool_id is None:
            return self.default
        if pool_id not in self.private:
            self.private[pool_id] = PoolPair(pool_id)
        return self.private[pool_id]

    def begin_capture(self, pool_id):
        self.capture_pool = self.pool(pool_id)

    def end_capture(self):
        """The capture is over: deferred frees complete (on CUDA, once their events have fired)."""
        self.capture_pool = None
        deferred, self.deferred = self.deferred, []
        for b in deferred:
            b.stream_uses.clear()
            self._free_block(b)

    @property
    def capturing(self):
        return self.capture_pool is not None

    # -- malloc / free ------------------------------------------------------------------------
    def malloc(self, size, stream, pool_id=...):
        """Allocate `size` bytes for `stream`; returns (addr, block). pool_id defaults to the capture
        pool while capturing, else the default pool."""
        pp = (self.capture_pool or self.default) if pool_id is ... else self.pool(pool_id)
        rsize = round_size(size)
        bp = pp.small if rsize <= SMALL_SIZE else pp.large
        b = bp.best_fit(stream, rsize)
        if b is None:
            size_seg = allocation_size(rsize)
            seg = Segment(self.segment_alloc(size_seg), size_seg, stream, bp)
            b = seg.head = Block(seg.addr, size_seg, stream, bp, seg)
            self.segments.append(seg)
            self._record("segment_alloc", b, size_seg)
        else:
            bp.erase(b)
        remaining = b.size - rsize
        if remaining >= MIN_BLOCK if bp.is_small else remaining > SMALL_SIZE:  # should_split()
            head = Block(b.addr, rsize, stream, bp, b.segment)  # the front part is handed out
            head.prev, head.next = b.prev, b
            if b.prev is not None:
                b.prev.next = head
            else:
                b.segment.head = head
            b.prev = head
            b.addr += rsize
            b.size -= rsize
            bp.insert(b)
            b = head
        b.allocated = True
        b.requested = size
        self.active[b.addr] = b
        self._record("alloc", b, size)
        return b.addr, b

    def free(self, block):
        """free(): back to the pool at once, unless record_stream'ed streams used it (then deferred
        while capturing; on CUDA outside capture it waits on events, which the sim has already
        passed since replay is synchronous)."""
        if not block.allocated:
            raise RuntimeError(f"double free of {block!r}")
        block.allocated = False
        del self.active[block.addr]
        self._record("free_requested", block, block.requested)
        if block.stream_uses and self.capturing:
            self.deferred.append(block)
            return
        block.stream_uses.clear()
        self._free_block(block)

    def record_stream(self, block, stream):
        """recordStream(): uses on the allocation stream need no synchronization."""
        if stream is not block.stream:
            block.stream_uses.add(stream)

    def _free_block(self, b):
        bp = b.pool
        self._record("free_completed", b, b.requested)
        for nb in (b.prev, b.next):  # try_merge_blocks()
            if nb is None or nb.allocated or nb.stream_uses or nb.addr not in bp.by_addr:
                continue
            bp.erase(nb)
            if nb is b.prev:
                b.addr = nb.addr
                b.prev = nb.prev
                if b.prev is not None:
                    b.prev.next = b
                else:
                    b.segment.head = b
            else:
                b.next = nb.next
                if b.next is not None:
                    b.next.prev = b
            b.size += nb.size
        bp.insert(b)

    # -- introspection ------------------------------------------------------------------------
    def _record(self, action, b, size):
        self.log.append(
            dict(
                seq=next(self._seq),
                action=action,
                addr=b.addr,
                size=size,
                block_size=b.size,
                stream=b.stream,
                pool=b.pool.pool_id,
                stack=self.context() if self.context else None,
            )
        )

    def blocks(self):
        """Every block of every segment, by segment then address."""
        out = []
        for seg in self.segments:
            b = seg.head
            while b is not None:
                out.append(b)
                b = b.next
        return out

    def snapshot(self):
        """A torch.cuda.memory._snapshot()-shaped dict: segments with their blocks, and the trace."""
        segs = []
        for seg in self.segments:
            blocks, b = [], seg.head
            while b is not None:
                state = (
                    "active_allocated"
                    if b.allocated
                    else ("active_pending_free" if b.stream_uses else "inactive")
                )
                blocks.append(dict(address=b.addr, size=b.size, requested_size=b.requested, state=state))
                b = b.next
            segs.append(
                dict(
                    address=seg.addr,
                    total_size=seg.size,
                    stream=_name(seg.stream),
                    segment_type="small" if seg.pool.is_small else "large",
                    segment_pool_id=seg.pool.pool_id,
                    blocks=blocks,
                )
            )
        trace = [dict(e, stream=_name(e["stream"]), frames=e["stack"] or []) for e in self.log]
        return dict(segments=segs, device_traces=[trace])


# ------------------------------------------------------------------------------------------------
# 2. The arena: CPU memory behind the allocator's addresses
# ------------------------------------------------------------------------------------------------


class _Owner:
    """numpy's view of one block; the block's tensors keep it alive through their storage, and a
    finalizer frees the block when the last of them dies."""

    __slots__ = ("__array_interface__", "chunk", "__weakref__")


class Arena:
    """Zeroed CPU memory in chunks (lazily committed by the OS); segments are carved from them."""

    def __init__(self, chunk_bytes=256 * MB):
        self.chunk_bytes = chunk_bytes
        self.chunks = []  # [base, nbytes, used, numpy uint8, torch uint8]

    def segment(self, nbytes):
        for c in self.chunks:
            if c[1] - c[2] >= nbytes:
                addr = c[0] + c[2]
                c[2] += nbytes
                return addr
        size = max(self.chunk_bytes, nbytes)
        arr = np.zeros(size + ROUND_LARGE, dtype=np.uint8)
        base = arr.ctypes.data
        pad = (-base) % ROUND_LARGE  # 2 MiB-aligned like cudaMalloc
        arr = arr[pad : pad + size]
        self.chunks.append([base + pad, size, nbytes, arr, torch.from_numpy(arr)])
        return base + pad

    def find(self, addr):
        for c in self.chunks:
            if c[0] <= addr < c[0] + c[1]:
                return c
        return None

    def tensor(self, addr, nbytes, dtype, size, stride, on_free):
        """A fresh tensor over [addr, addr+nbytes) that owns its own storage; on_free() runs when
        the storage dies."""
        c = self.find(addr)
        o = _Owner()
        o.__array_interface__ = dict(data=(addr, False), shape=(nbytes,), typestr="|u1", version=3)
        o.chunk = c[3]
        fin = weakref.finalize(o, on_free)
        fin.atexit = False
        return torch.from_numpy(np.asarray(o)).view(dtype).as_strided(size, stride)

    def shadow(self, t):
        """A view of the same bytes as arena tensor t that does not keep t's block alive."""
        st = t.untyped_storage()
        c = self.find(st.data_ptr())
        off = st.data_ptr() - c[0]  # 512-aligned, so a whole number of elements
        return (
            c[4].view(t.dtype).as_strided(t.shape, t.stride(), off // t.element_size() + t.storage_offset())
        )

    def owns(self, t):
        p = t.untyped_storage().data_ptr()
        for c in self.chunks:
            if c[0] <= p < c[0] + c[1]:
                return True
        return False


# ------------------------------------------------------------------------------------------------
# 3. Streams and events
# ------------------------------------------------------------------------------------------------


def _name(s):
    return getattr(s, "name", None) or str(s)


class SimStream:
    """A stream: bookkeeping in eager mode; while capturing, it carries a dependency frontier."""

    def __init__(self, dev, priority=0, name=None):
        self.dev, self.priority = dev, priority
        self.id = next(dev._stream_ids)
        self.name = name or f"stream{self.id}"

    def wait_stream(self, other):
        """Work queued on self after this waits for all work queued on `other` so far."""
        cap = self.dev._cap
        if cap is not None and other in cap.frontier:
            cap.frontier[self] = _union(cap.frontier.get(self), cap.frontier[other])
            cap.syncs.append(("wait_stream", self, other, len(cap.nodes)))

    def wait_event(self, event):
        cap = self.dev._cap
        if cap is not None and event._cap is cap:
            cap.frontier[self] = _union(cap.frontier.get(self), event._deps)
            cap.syncs.append(("wait_event", self, event, len(cap.nodes)))

    def record_event(self, event=None):
        event = event or SimEvent(self.dev)
        event.record(self)
        return event

    def synchronize(self):
        pass

    def query(self):
        return True

    def __repr__(self):
        return f"<SimStream {self.name}>"


class SimEvent:
    def __init__(self, dev, enable_timing=False, blocking=False, interprocess=False):
        self.dev = dev
        self._cap, self._deps = None, ()

    def record(self, stream=None):
        stream = stream or self.dev.current_stream()
        cap = self.dev._cap
        if cap is not None and stream in cap.frontier:
            self._cap, self._deps = cap, cap.frontier[stream]
            cap.syncs.append(("record", stream, self, len(cap.nodes)))
        else:
            self._cap, self._deps = None, ()

    def wait(self, stream=None):
        (stream or self.dev.current_stream()).wait_event(self)

    def synchronize(self):
        pass

    def query(self):
        return True


def _union(a, b):
    if not a:
        return b
    return tuple(sorted(set(a) | set(b)))


class _StreamCtx:
    def __init__(self, dev, stream):
        self.dev, self.s = dev, stream

    def __enter__(self):
        self.prev = self.dev._cur
        if self.s is not None:
            self.dev._cur = self.s
        return self.s

    def __exit__(self, *exc):
        self.dev._cur = self.prev
        return False


# ------------------------------------------------------------------------------------------------
# 4. Capture: a dispatch mode that records nodes and allocates their outputs, running nothing
# ------------------------------------------------------------------------------------------------


class SimCaptureError(RuntimeError):
    pass


# ops that allocate and write nothing (no node)
_EMPTY_OPS = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::new_empty_strided",
}
# outputs that alias their input's storage without an alias annotation
_VIEW_LIKE = {"aten::_unsafe_view", "aten::lift_fresh"}
_FORBIDDEN = {
    "aten::_local_scalar_dense": "reads a tensor value on the host (.item(), bool(), "
    "int(), a data-dependent branch), a synchronization not permitted while capturing",
    "aten::set_": "changes a tensor's storage",
    "aten::resize_": "resizes a tensor",
    "aten::record_stream": "use dev.record_stream(t, stream) instead",
}


@dataclass
class _OpInfo:
    kind: str  # view | empty | node | forbid
    returns: list  # per return: index of the argument it aliases (mutated) or None
    mutated: list  # (index, name) of arguments written
    n_returns: int


_OP_INFO = {}


def _op_info(func):
    info = _OP_INFO.get(func)
    if info is not None:
        return info
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
    if name in _FORBIDDEN:
        kind = "forbid"
    elif is_view or name in _VIEW_LIKE:
        kind = "view"
    elif name in _EMPTY_OPS:
        kind = "empty"
    else:
        kind = "node"
    info = _OP_INFO[func] = _OpInfo(kind, rets, mutated, len(schema.returns))
    return info


def _arg(args, kwargs, i, name):
    return args[i] if i < len(args) else kwargs.get(name)


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _extent(t):
    """Bytes from t's first element to one past its last, over its strides."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)) * t.element_size()


_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_FILES = ("contextlib.py", "weakref.py")


def python_stack(limit=10):
    """The caller's Python frames outside this file and torch, innermost last: [(file, line, fn)]."""
    f = sys._getframe(1)
    out = []
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if fn != _HERE and not fn.startswith(_TORCH_DIR) and not fn.endswith(_SKIP_FILES):
            out.append(dict(filename=fn, line=f.f_lineno, name=f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


class Node:
    """One recorded kernel: op name, stream, deps (indices of nodes it waits for: the previous node
    on its stream plus event/wait_stream edges), nbytes (bytes moved, for the timing model),
    accesses [(addr, nbytes, "r" | "w", what)] (byte extents it reads and writes), stack (Python
    frames at capture), alloc_seq (allocator log entries before it). run() executes it at once;
    read() computes from its inputs into temporaries and write(state) stores the results."""

    __slots__ = (
        "index",
        "op",
        "stream",
        "deps",
        "nbytes",
        "accesses",
        "stack",
        "alloc_seq",
        "run",
        "read",
        "write",
    )

    def __repr__(self):
        return f"Node({self.index} {self.op} on {_name(self.stream)} after {list(self.deps)})"


class _Capture:
    def __init__(self, dev, graph, stream, pool_id):
        self.dev, self.graph, self.stream, self.pool_id = dev, graph, stream, pool_id
        self.frontier = {stream: ()}  # stream -> node indices its next node depends on
        self.nodes = []
        self.syncs = []  # (kind, stream, other, nodes recorded so far)

    def record(self, func, info, args, kwargs):
        dev = self.dev
        arena = dev.arena
        stream = dev._cur
        if stream not in self.frontier:
            raise SimCaptureError(
                f"{stream.name} is not part of the capture: it must wait on the capturing stream "
                f"(e.g. {stream.name}.wait_stream(capture_stream)) before queuing work"
            )
        fresh = [i for i, src in enumerate(info.returns) if src is None]
        outs = {}
        if fresh:
            margs, mkwargs = tree_map_tensors(_to_meta, args, kwargs)
            mres = func(*margs, **mkwargs)
            mres = [mres] if info.n_returns == 1 else list(mres)
            for i in fresh:
                outs[i] = dev._alloc_like(mres[i], stream)
        result = []
        for i, src in enumerate(info.returns):
            result.append(
                outs[i] if src is None else _arg(args, kwargs, src, func._schema.arguments[src].name)
            )
        if info.kind == "empty":
            return result[0]
        # the node: shadows of arena tensors (they do not keep blocks alive), persistent tensors as is
        flat, spec = tree_flatten((args, kwargs))
        mut_objs = []
        for i, name in info.mutated:
            v = _arg(args, kwargs, i, name)
            mut_objs.extend(v if isinstance(v, (list, tuple)) else [v])
        mut_idx = [
            j for j, x in enumerate(flat) if isinstance(x, torch.Tensor) and any(x is m for m in mut_objs)
        ]
        leaves, accesses, nbytes, seen = [], [], 0, set()
        for j, x in enumerate(flat):
            if isinstance(x, torch.Tensor):
                sx = arena.shadow(x) if arena.owns(x) else x
                leaves.append(sx)
                ext = _extent(x)
                rng = (x.data_ptr(), ext)
                accesses.append((x.data_ptr(), ext, "w" if j in mut_idx else "r", f"arg{j}"))
                if rng not in seen:
                    seen.add(rng)
                    nbytes += ext
            else:
                leaves.append(x)
        out_shadows = []
        for i in fresh:
            o = outs[i]
            if o.numel():
                out_shadows.append((i, arena.shadow(o)))
                accesses.append((o.data_ptr(), _extent(o), "w", f"out{i}"))
                nbytes += _extent(o)
        n = Node()
        n.index, n.op, n.stream = len(self.nodes), str(func), stream
        n.deps = self.frontier[stream]
        n.nbytes, n.accesses = nbytes, accesses
        n.stack = python_stack() if dev.record_stacks else None
        n.alloc_seq = len(dev.allocator.log)
        n.run, n.read, n.write = _make_closures(func, leaves, spec, mut_idx, out_shadows, info.n_returns)
        self.frontier[stream] = (n.index,)
        self.nodes.append(n)
        if info.n_returns == 0:
            return None
        return result[0] if info.n_returns == 1 else tuple(result)


def tree_map_tensors(fn, args, kwargs):
    flat, spec = tree_flatten((args, kwargs))
    return tree_unflatten([fn(x) for x in flat], spec)


def _make_closures(func, leaves, spec, mut_idx, out_shadows, n_returns):
    """run(): read and write at once; read() -> state: read the inputs, compute into temporaries
    (mutated arguments are cloned first); write(state): store outputs and mutated arguments."""
    args, kwargs = tree_unflatten(leaves, spec)
    single = n_returns == 1

    def write_outs(res):
        if single:
            out_shadows[0][1].copy_(res)
        else:
            for i, o in out_shadows:
                o.copy_(res[i])

    if not out_shadows:
        write_outs = None

    def run():
        res = func(*args, **kwargs)
        if write_outs is not None:
            write_outs(res)

    if not mut_idx:

        def read():
            return func(*args, **kwargs), None
    else:

        def read():
            tmp = list(leaves)
            clones = []
            for j in mut_idx:
                c = leaves[j].clone()
                tmp[j] = c
                clones.append(c)
            a, k = tree_unflatten(tmp, spec)
            return func(*a, **k), clones

    def write(state):
        res, clones = state
        if clones:
            for j, c in zip(mut_idx, clones):
                leaves[j].copy_(c)
        if write_outs is not None:
            write_outs(res)

    return run, read, write


class _CaptureMode(TorchDispatchMode):
    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = _op_info(func)
        if info.kind == "view":
            return func(*args, **kwargs)
        if info.kind == "forbid":
            raise SimCaptureError(f"{func} while capturing: it {_FORBIDDEN[func._schema.name]}")
        try:
            return self.cap.record(func, info, args, kwargs)
        except SimCaptureError:
            raise
        except Exception as e:
            raise SimCaptureError(f"capturing {func} failed: {type(e).__name__}: {e}") from e


# ------------------------------------------------------------------------------------------------
# 5. Graphs and replay
# ------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """Replay timing model: duration = (latency + bytes / bandwidth) * lognormal(0, sigma)."""

    latency: float = 4e-6  # seconds per kernel launch
    bandwidth: float = 1e11  # bytes per second
    sigma: float = 0.25  # jitter


class SimGraph:
    """torch.cuda.CUDAGraph's surface: capture_begin/capture_end (or dev.graph), replay, reset, pool.
    After capture: nodes (Node list), syncs (stream/event edges), pool_id; after each replay,
    last_schedule = (starts, ends) in simulated seconds."""

    def __init__(self, dev):
        self.dev = dev
        self.nodes, self.syncs, self.pool_id = [], [], None
        self._ready = False
        self.last_schedule = None

    def pool(self):
        return self.pool_id

    def capture_begin(self, pool=None, capture_error_mode="global"):
        dev = self.dev
        if dev._cap is not None:
            raise SimCaptureError("a capture is already underway")
        self.pool_id = pool if pool is not None else dev.graph_pool_handle()
        cap = _Capture(dev, self, dev._cur, self.pool_id)
        dev._cap = cap
        dev.allocator.begin_capture(self.pool_id)
        self._mode = _CaptureMode(cap)
        self._mode.__enter__()

    def capture_end(self):
        cap = self._finish()
        end = cap.frontier[cap.stream]
        seen, todo = set(), list(end)
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(cap.nodes[i].deps)
        for s, fr in cap.frontier.items():
            if any(i not in seen for i in fr):
                raise SimCaptureError(
                    f"capture ended with work on {s.name} not joined into the capturing stream "
                    f"(cudaErrorStreamCaptureUnjoined): call capture_stream.wait_stream({s.name})"
                )
        self.nodes, self.syncs = cap.nodes, cap.syncs
        n = len(self.nodes)
        self._deps = [nd.deps for nd in self.nodes]
        self._serial = all((i - 1) in self._deps[i] for i in range(1, n))
        self._run = [nd.run for nd in self.nodes]
        self._nbytes = np.array([nd.nbytes for nd in self.nodes], dtype=np.float64)
        self._ready = True

    def _finish(self):
        dev = self.dev
        cap = dev._cap
        if cap is None or cap.graph is not self:
            raise SimCaptureError("capture_end without a matching capture_begin")
        try:
            self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            dev._cap = None
            dev.allocator.end_capture()
        return cap

    def _abort(self):
        if self.dev._cap is not None and self.dev._cap.graph is self:
            self._finish()
        self.nodes, self._ready = [], False

    def reset(self):
        self.nodes, self.syncs, self._ready = [], [], False

    def replay(self):
        if not self._ready:
            raise RuntimeError("replay of a graph that was not captured successfully")
        n = len(self.nodes)
        if n == 0:
            return
        if self._serial:  # one stream: the timing model cannot reorder anything
            for f in self._run:
                f()
            return
        tm = self.dev.timing
        dur = (tm.latency + self._nbytes / tm.bandwidth) * self.dev._rng.lognormal(0.0, tm.sigma, n)
        dur = dur.tolist()
        starts, ends = [0.0] * n, [0.0] * n
        events = []
        for i, deps in enumerate(self._deps):
            s = 0.0
            for d in deps:
                s = max(s, ends[d])
            starts[i] = s
            ends[i] = s + dur[i]
            events.append((s, 1, i))
            events.append((ends[i], 0, i))
        events.sort()  # at equal times, ends before starts
        nodes, pending = self.nodes, {}
        j, m = 0, len(events)
        while j < m:
            _, kind, i = events[j]
            if kind == 1:
                nxt = events[j + 1] if j + 1 < m else None
                if nxt is not None and nxt[2] == i:  # nothing happens in between: run at once
                    nodes[i].run()
                    j += 2
                    continue
                pending[i] = nodes[i].read()
            else:
                nodes[i].write(pending.pop(i))
            j += 1
        self.last_schedule = (starts, ends)


class _GraphCtx:
    """dev.graph(g, pool, stream): like torch.cuda.graph, capture on a side stream (shared by all
    captures unless `stream` is given); on error, nothing is left half-finished."""

    def __init__(self, dev, g, pool=None, stream=None, capture_error_mode="global"):
        self.dev, self.g, self.pool = dev, g, pool
        self.stream = stream if stream is not None else dev._capture_stream()

    def __enter__(self):
        if self.dev.gc_before_capture:  # torch.cuda.graph collects garbage here (~80 ms)
            gc.collect()
        self.prev = self.dev._cur
        self.dev._cur = self.stream
        try:
            self.g.capture_begin(pool=self.pool)
        except BaseException:
            self.dev._cur = self.prev
            raise

    def __exit__(self, et, ev, tb):
        try:
            if et is None:
                self.g.capture_end()
            else:
                self.g._abort()
        except BaseException:
            self.g._abort()
            raise
        finally:
            self.dev._cur = self.prev
        return False


# ------------------------------------------------------------------------------------------------
# 6. The facade
# ------------------------------------------------------------------------------------------------


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
        self.timing = timing or Timing()
        self.arena = Arena(arena_chunk_bytes)
        self.record_stacks = True  # Python stacks on allocator events and nodes
        self.gc_before_capture = False  # torch.cuda.graph runs gc.collect() before capturing
        self.allocator = CachingAllocator(
            self.arena.segment, context=lambda: python_stack() if self.record_stacks else None
        )
        self._stream_ids = itertools.count()
        self._pool_ids = itertools.count(1)
        self.default_stream = SimStream(self, name="default")
        self._cur = self.default_stream
        self._cap = None
        self._cap_stream = None
        self.manual_seed(seed)

    # streams and events
    def Stream(self, priority=0, **_):
        return SimStream(self, priority)

    def Event(self, enable_timing=False, blocking=False, interprocess=False):
        return SimEvent(self, enable_timing, blocking, interprocess)

    def stream(self, s):
        return _StreamCtx(self, s)

    def current_stream(self):
        return self._cur

    def synchronize(self):
        """Replay completes before returning, so there is nothing to wait for."""

    # graphs
    def CUDAGraph(self, keep_graph=False):
        return SimGraph(self)

    def graph(self, g, pool=None, stream=None, capture_error_mode="global"):
        return _GraphCtx(self, g, pool, stream, capture_error_mode)

    def graph_pool_handle(self):
        return (0, next(self._pool_ids))

    def is_current_stream_capturing(self):
        return self._cap is not None and self._cur in self._cap.frontier

    def _capture_stream(self):
        if self._cap_stream is None:  # torch.cuda.graph.default_capture_stream
            self._cap_stream = SimStream(self, name="capture")
        return self._cap_stream

    # allocation
    def _alloc_like(self, meta, stream):
        """An arena tensor shaped like `meta`, allocated for `stream` by the caching allocator."""
        n = _extent(meta) + meta.storage_offset() * meta.element_size()
        if n == 0:
            return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
        addr, block = self.allocator.malloc(n, stream)
        t = self.arena.tensor(addr, n, meta.dtype, meta.shape, meta.stride(), _Freer(self.allocator, block))
        if meta.storage_offset():
            t = t.as_strided(meta.shape, meta.stride(), meta.storage_offset())
        return t

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
        self._rng = np.random.default_rng(seed)

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
