"""A reference model of one audited capture, for tests/test_audit_oracle.py: what a step program
does to the streams and to the caching allocator, and which of its op pairs race.

It is written apart from nblib (nothing of nblib's allocator, recorder or audit is imported), so
that a disagreement between the two points at one of them rather than at a shared mistake.

A program is data: `Program(streams, events, code)`, `code` a tuple of instructions (tuples).
Streams are numbered, 0 being the stream the capture began on ("main"); tensors are float32 and
named by strings: "p0", "p1" are persistent (made before the capture, never freed), "t<N>" are
made inside it. Instructions:

    ("empty", v, s, n)            v = torch.empty(n) on stream s (an allocation, no kernel)
    ("view", v, src, start, n, k) v = src[start : start + (n - 1) * k + 1 : k] (no kernel)
    ("free", v)                   del v: the block is freed when no name holds its storage
    ("fill", s, v)                v.fill_(1) on s                         writes v
    ("add_self", s, v)            v.add_(v) on s (one tensor object)      writes v
    ("add_", s, d, x)             d[:m].add_(x[:m]) on s, m = min(len)    writes d, reads x
    ("copy_", s, d, x)            d[:m].copy_(x[:m]) on s                 writes d, reads x
    ("zeros", v, s, n)            v = torch.zeros(n) on s                 allocates v, writes it
    ("add_out", s, c, a, b)       torch.add(a[:m], b[:m], out=c[:m])      reads a, b; writes c
    ("add", v, s, a, b)           v = a[:m] + b[:m] on s                  reads a, b; allocates v
    ("neg", v, s, a)              v = -a on s                             reads a; allocates v
    ("frexp", v, s, a)            v = torch.frexp(a)[0] on s: reads a, allocates and writes v and
                                  the exponents (int32), which die as the op returns
    ("empty_strided", v, s, n, k) v = torch.empty_strided((n,), (k,)): an allocation with gaps
    ("view2d", v, src, start, rows, row_len, c0, cols, t)
                                  v = src[start : start + rows * row_len].view(rows, row_len)
                                  [:, c0 : c0 + cols], transposed if t; a 2-D name is only
                                  filled, negated, frexp'ed, freed or record_stream'ed
    ("wait_stream", s, o)         stream s waits for all work queued on o so far
    ("record", e, s, form)        event e recorded on s: e.record(s) (form 0), s.record_event(e)
                                  (1), e replaced by a new event s.record_event() (2), or
                                  e.record() with s current (3)
    ("wait", s, e, form)          s waits on e's latest record: s.wait_event(e) (0), e.wait(s) (1),
                                  e.wait() with s current (2); an event not yet recorded orders
                                  nothing
    ("record_stream", v, s)       record_stream(v, s): v's block is not reused before capture end

A stream takes part in the capture once it waits on one that does (or on an event recorded in
the capture); work, allocations and event records happen only on such streams, and the step ends
with the capture stream waiting on every stream that took part (`joined`), as a capture requires.

Happens-before: each op carries the set (a bit mask) of ops that happen before it: the ops before
it on its stream, and whatever a wait brought in (a wait_stream the waited stream's set, an event
wait the set its stream had at the event's record). The sets are closed under transitivity by
construction, so "a happens before b" is one bit test.

Races: two ops on different streams, neither before the other, with an access each touching a
common byte, at least one writing. An in-place op's destination counts as one writing access (as
the audit documents: a read-and-write access is a write); its source as a read. The kind is named
from the host order: both write -> write-after-write, the first writes -> read-after-write, else
write-after-read. Each hazard is (first op, second op, kind, first allocation, second allocation),
an allocation being its ordinal among the capture's allocations, None for persistent memory.

The allocator model follows PyTorch's CUDACachingAllocator with default settings, as
nblib/backends/sim/allocator.py describes it: requests round up to 512 bytes; a rounded size up
to 1 MiB comes from the small pool (new segments of 2 MiB), a larger one from the large pool (new
segments of 20 MiB below 10 MiB, else the size rounded up to 2 MiB); the free block chosen is the
smallest of the allocating stream's blocks in that pool that fits (the lowest address among
equals); the rest of a block is split off when at least 512 bytes remain (small) or more than
1 MiB (large); a freed block merges with free neighbours of its segment; a block that
record_stream marked with another stream is held, when freed, until the capture ends. Where a new
segment lands is the device's choice: the model takes its base from the recording and checks
only that it does not fall inside a segment the model already has.
"""

from dataclasses import dataclass

ITEM = 4  # float32
MIB = 1 << 20
PERSISTENT = ("p0", "p1")
PERSISTENT_LEN = 4096


@dataclass(frozen=True)
class Program:
    streams: int  # 2..4; stream 0 is the capture stream
    events: int  # event slots
    code: tuple  # instructions, as the module docstring lists them


@dataclass(frozen=True)
class Ref:
    """What a name refers to: `root` (an allocation ordinal, or a persistent name) and the elements
    of the root it covers: start + r * row_step + i * step, for r < rows and i < n. A 1-D tensor
    has one row; a 2-D view has more (its order, transposed or not, does not change the set)."""

    root: object
    start: int
    n: int
    step: int
    rows: int = 1
    row_step: int = 0

    def prefix(self, m):
        return Ref(self.root, self.start, m, self.step)

    def view(self, start, n, step):
        return Ref(self.root, self.start + start * self.step, n, self.step * step)

    def view2d(self, start, rows, row_len, c0, cols):
        """src[start : start + rows * row_len].view(rows, row_len)[:, c0 : c0 + cols]"""
        first = self.start + (start + c0) * self.step
        return Ref(self.root, first, cols, self.step, rows, row_len * self.step)

    @property
    def numel(self):
        return self.rows * self.n


@dataclass(frozen=True)
class Access:
    ref: Ref
    writes: bool


@dataclass
class Op:
    index: int
    stream: int
    accesses: list
    before: int  # bit mask of the ops that happen before this one


@dataclass
class Allocation:
    ordinal: int
    stream: int  # the allocating stream
    nbytes: int


@dataclass
class Run:
    """The model's account of a program: ops with happens-before, allocations, and the allocator
    events in program order: ("alloc", ordinal), ("free", ordinal), ("record_stream", ordinal, s)."""

    ops: list
    allocations: list
    events: list
    joined: list  # side streams the step joins at its end


# ------------------------------------------------------------------------------------------------
# the program, step by step
# ------------------------------------------------------------------------------------------------


def run(program):
    """Walk the program: names, allocations and frees (by counting the names that hold each
    allocation), ops and their accesses, happens-before."""
    names = {p: Ref(p, 0, PERSISTENT_LEN, 1) for p in PERSISTENT}
    holders = {}  # allocation ordinal -> names that hold it
    allocations, ops, events = [], [], []
    frontier = {0: 0}  # stream -> mask of ops its next op comes after; absent: not in the capture
    recorded = {}  # event slot -> mask at its latest record

    def allocate(v, s, n):
        a = Allocation(len(allocations), s, n * ITEM)
        allocations.append(a)
        events.append(("alloc", a.ordinal))
        bind(v, Ref(a.ordinal, 0, n, 1))

    def bind(v, ref):
        names[v] = ref
        if not isinstance(ref.root, str):
            holders.setdefault(ref.root, set()).add(v)

    def drop(v):
        ref = names.pop(v)
        if isinstance(ref.root, str):
            return
        holders[ref.root].discard(v)
        if not holders[ref.root]:
            events.append(("free", ref.root))

    def op(s, *accesses):
        i = len(ops)
        ops.append(Op(i, s, list(accesses), frontier[s]))
        frontier[s] |= 1 << i

    for ins in program.code:
        kind = ins[0]
        if kind == "empty":
            _, v, s, n = ins
            allocate(v, s, n)
        elif kind == "view":
            _, v, src, start, n, step = ins
            bind(v, names[src].view(start, n, step))
        elif kind == "free":
            drop(ins[1])
        elif kind == "fill":
            _, s, v = ins
            op(s, Access(names[v], True))
        elif kind == "add_self":
            _, s, v = ins
            op(s, Access(names[v], True))  # v.add_(v): one tensor, read and written: a write
        elif kind in ("add_", "copy_"):
            _, s, d, x = ins
            m = min(names[d].n, names[x].n)
            op(s, Access(names[d].prefix(m), True), Access(names[x].prefix(m), False))
        elif kind == "zeros":
            _, v, s, n = ins
            allocate(v, s, n)
            op(s, Access(names[v], True))
        elif kind == "add_out":
            _, s, c, a, b = ins
            m = min(names[c].n, names[a].n, names[b].n)
            op(s, *(Access(names[x].prefix(m), False) for x in (a, b)), Access(names[c].prefix(m), True))
        elif kind == "add":
            _, v, s, a, b = ins
            m = min(names[a].n, names[b].n)
            ra, rb = names[a].prefix(m), names[b].prefix(m)
            allocate(v, s, m)
            op(s, Access(ra, False), Access(rb, False), Access(names[v], True))
        elif kind == "neg":
            _, v, s, a = ins
            ra = names[a]
            allocate(v, s, ra.numel)
            op(s, Access(ra, False), Access(names[v], True))
        elif kind == "frexp":
            _, v, s, a = ins
            ra = names[a]
            allocate(v, s, ra.numel)
            allocate("exponent", s, ra.numel)  # int32, as wide as float32
            op(s, Access(ra, False), Access(names[v], True), Access(names["exponent"], True))
            drop("exponent")
        elif kind == "empty_strided":
            _, v, s, n, step = ins
            allocate(v, s, (n - 1) * step + 1)
            names[v] = Ref(names[v].root, 0, n, step)
        elif kind == "view2d":
            _, v, src, start, rows, row_len, c0, cols, _transposed = ins
            bind(v, names[src].view2d(start, rows, row_len, c0, cols))
        elif kind == "wait_stream":
            _, s, o = ins
            frontier[s] = frontier.get(s, 0) | frontier[o]
        elif kind == "record":
            _, e, s, _form = ins
            recorded[e] = frontier[s]
        elif kind == "wait":
            _, s, e, _form = ins
            if e in recorded:
                frontier[s] = frontier.get(s, 0) | recorded[e]
        elif kind == "record_stream":
            _, v, s = ins
            events.append(("record_stream", names[v].root, s))
        else:
            raise ValueError(f"unknown instruction {ins!r}")
    joined = sorted(s for s in frontier if s != 0)
    return Run(ops, allocations, events, joined)


# ------------------------------------------------------------------------------------------------
# bytes: which accesses share one
# ------------------------------------------------------------------------------------------------


def _egcd(a, b):
    """(g, x, y) with a*x + b*y = g = gcd(a, b)."""
    if b == 0:
        return a, 1, 0
    g, x, y = _egcd(b, a % b)
    return g, y, x - (a // b) * y


def _ceil_div(a, b):
    return -((-a) // b)


def progressions_meet(p, u, n, q, v, m):
    """Whether {p + i*u : 0 <= i < n} and {q + j*v : 0 <= j < m} share a value (u, v >= 1).

    i*u - j*v = q - p has integer solutions iff gcd(u, v) divides q - p; they are
    i = i0 + t*(v/g), j = j0 + t*(u/g), and a t must put both i and j in range."""
    if p + (n - 1) * u < q or q + (m - 1) * v < p:
        return False
    g, x, y = _egcd(u, v)
    d = q - p
    if d % g:
        return False
    i0, j0 = x * (d // g), -y * (d // g)
    si, sj = v // g, u // g
    lo = max(_ceil_div(-i0, si), _ceil_div(-j0, sj))
    hi = min((n - 1 - i0) // si, (m - 1 - j0) // sj)
    return lo <= hi


def share_a_byte(a, b, base):
    """Whether two element sets (Refs) share a byte; `base(root)` gives the memory a root lives in
    and its first byte there. All elements are ITEM bytes at ITEM-aligned addresses, so two
    elements share a byte exactly when they start at the same address: row by row, two
    arithmetic progressions of addresses (in elements) meet."""
    ma, pa = base(a.root)
    mb, pb = base(b.root)
    if ma != mb:
        return False
    if pa % ITEM or pb % ITEM:
        raise ValueError("elements not aligned to their size")
    pa, pb = pa // ITEM + a.start, pb // ITEM + b.start
    return any(
        progressions_meet(pa + r * a.row_step, a.step, a.n, pb + q * b.row_step, b.step, b.n)
        for r in range(a.rows)
        for q in range(b.rows)
    )


# ------------------------------------------------------------------------------------------------
# races
# ------------------------------------------------------------------------------------------------


def kind_of(first_writes, second_writes):
    if first_writes and second_writes:
        return "write-after-write"
    return "read-after-write" if first_writes else "write-after-read"


def hazards(r, addrs):
    """The race set of a Run, given each allocation's address (ordinal -> byte address):
    {(first op, second op, kind, first allocation or None, second allocation or None)}."""

    def base(root):
        if isinstance(root, str):
            return root, 0  # a persistent tensor is memory of its own
        return "pool", addrs[root]

    def owner(ref):
        return None if isinstance(ref.root, str) else ref.root

    out = set()
    for j, b in enumerate(r.ops):
        for i in range(j):
            a = r.ops[i]
            if a.stream == b.stream or b.before >> i & 1:
                continue
            for x in a.accesses:
                for y in b.accesses:
                    if (x.writes or y.writes) and share_a_byte(x.ref, y.ref, base):
                        out.add((i, j, kind_of(x.writes, y.writes), owner(x.ref), owner(y.ref)))
    return out


# ------------------------------------------------------------------------------------------------
# the caching allocator
# ------------------------------------------------------------------------------------------------


def rounded(nbytes):
    return max(512, (nbytes + 511) // 512 * 512)


def is_small(size):
    return size <= MIB


def segment_size(size):
    if is_small(size):
        return 2 * MIB
    if size < 10 * MIB:
        return 20 * MIB
    return (size + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


@dataclass
class _Block:
    addr: int
    size: int
    state: str  # "free" | "used" | "held" (freed, kept until the capture ends)


@dataclass
class _Segment:
    base: int
    size: int
    stream: int
    small: bool
    blocks: list  # _Block list, by address, covering [base, base + size)


class AllocatorModel:
    """The caching allocator over one capture's private pool (empty at the capture's start)."""

    def __init__(self):
        self.segments = []
        self.block_of = {}  # allocation ordinal -> (segment, block)
        self.uses = {}  # allocation ordinal -> streams record_stream named

    def owns(self, addr):
        return any(g.base <= addr < g.base + g.size for g in self.segments)

    def malloc(self, ordinal, stream, nbytes, new_base):
        """The address for an allocation; `new_base()` is asked where a new segment lands."""
        size = rounded(nbytes)
        small = is_small(size)
        best = None
        for g in self.segments:
            if g.stream != stream or g.small != small:
                continue
            for b in g.blocks:
                if b.state == "free" and b.size >= size and (best is None or (b.size, b.addr) < best[2]):
                    best = (g, b, (b.size, b.addr))
        if best is None:
            g = _Segment(new_base(), segment_size(size), stream, small, [])
            g.blocks.append(_Block(g.base, g.size, "free"))
            self.segments.append(g)
            b = g.blocks[0]
        else:
            g, b, _ = best
        rest = b.size - size
        if (rest >= 512) if small else (rest > MIB):
            k = g.blocks.index(b)
            g.blocks.insert(k + 1, _Block(b.addr + size, rest, "free"))
            b.size = size
        b.state = "used"
        self.block_of[ordinal] = (g, b)
        return b.addr

    def record_stream(self, ordinal, stream):
        self.uses.setdefault(ordinal, set()).add(stream)

    def free(self, ordinal):
        g, b = self.block_of.pop(ordinal)
        if self.uses.pop(ordinal, None):
            b.state = "held"
            return
        b.state = "free"
        k = g.blocks.index(b)
        if k + 1 < len(g.blocks) and g.blocks[k + 1].state == "free":
            b.size += g.blocks.pop(k + 1).size
        if k > 0 and g.blocks[k - 1].state == "free":
            prev = g.blocks[k - 1]
            prev.size += b.size
            g.blocks.pop(k)


def predict_addresses(r, recorded):
    """Replay the Run's allocator events through AllocatorModel. `recorded[k]` is the address the
    recording gave allocation k; it is read only where the model opens a new segment. Returns the
    predicted addresses and the disagreements: (ordinal, predicted, recorded, why)."""
    model = AllocatorModel()
    predicted, wrong = [], []
    for ev in r.events:
        if ev[0] == "alloc":
            k = ev[1]
            a = r.allocations[k]
            opened = []

            def new_base(k=k, opened=opened):
                opened.append(True)
                if model.owns(recorded[k]):  # the device reused cached memory the model has no fit in
                    return -(len(model.segments) + 1) << 40  # an address nothing records
                return recorded[k]

            addr = model.malloc(k, a.stream, a.nbytes, new_base)
            predicted.append(addr)
            if addr != recorded[k]:
                wrong.append((k, addr, recorded[k], "a new segment" if opened else "a cached block"))
        elif ev[0] == "free":
            model.free(ev[1])
        elif ev[0] == "record_stream":
            _, k, s = ev
            if s != r.allocations[k].stream:
                model.record_stream(k, s)
    return predicted, wrong
