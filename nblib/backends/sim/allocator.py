"""The caching allocator's policy (c10/cuda/CUDACachingAllocator.cpp, default settings), over plain
integer addresses: rounding, small and large pools, best fit keyed by allocating stream, split and
merge, private graph pools, record_stream, and an allocation log. No memory lives here; the arena
(arena.py) puts CPU bytes behind the addresses."""

import bisect
import itertools

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
        return f"Block({self.addr:#x}, {self.size}, {state}, stream={stream_name(self.stream)})"


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
                    stream=stream_name(seg.stream),
                    segment_type="small" if seg.pool.is_small else "large",
                    segment_pool_id=seg.pool.pool_id,
                    blocks=blocks,
                )
            )
        trace = [dict(e, stream=stream_name(e["stream"]), frames=e["stack"] or []) for e in self.log]
        return dict(segments=segs, device_traces=[trace])


def stream_name(s):
    """A stream's readable name: SimStream.name, else str() (the allocator alone keys by anything)."""
    return getattr(s, "name", None) or str(s)
