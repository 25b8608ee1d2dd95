"""Synthetic captures shaped like CUDA's for the graph matcher: ops on a few streams accessing a few
allocations (some freed and their bytes reused by later ones, some persistent), and a graph whose
nodes come as one run per op on the op's stream chain, with forks and joins, memset, empty and event
nodes, blind kernels, op-internal scratch on reused bytes and words that are no address."""

import random

from nblib.instruments.audit.graph_read import GraphNode, RawGraph
from nblib.instruments.audit.trace.records import Access, Alloc, Op

BASE, PERSISTENT = 0x7F00_0000_0000, 0x7E00_0000_0000
NOT_ADDRESSES = [0, 1, 4096, 0xFFFF_FFFF_FFFF_FFF0, BASE - 8]


class _Memory:
    """Allocations placed on a few slots of bytes: a freed one's slot takes the next allocation."""

    def __init__(self, rng, slots):
        self.rng, self.live, self.freed, self.ids = rng, {}, [], 0
        self.slots = [BASE + s * 0x10_0000 for s in range(slots)]

    def alloc(self, stream):
        free = [a for a in self.slots if a not in self.live]
        if not free:
            return None
        addr = self.rng.choice(free)
        self.ids += 1
        self.live[addr] = Alloc(self.ids, addr, self.rng.choice([256, 4096, 65536]), stream, [])
        return self.live[addr]

    def free(self):
        if self.live:
            a = self.live.pop(self.rng.choice(list(self.live)))
            a.freed = True
            self.freed.append(a)


def _access(rng, mem, stream):
    if rng.random() < 0.15:  # persistent memory (weights): no allocation
        return Access(PERSISTENT + rng.randrange(8) * 4096, 4096, rng.choice("rw"), "arg")
    a = mem.alloc(stream) if (rng.random() < 0.4 or not mem.live) else None
    a = a or rng.choice(list(mem.live.values()))
    lo = a.addr + rng.choice([0, 0, 64])
    nbytes = max(1, min(rng.choice([64, a.nbytes]), a.end - lo))
    return Access(lo, nbytes, rng.choice(["r", "w", "rw"]), "x", a)


def _ops(rng, m, streams, mem):
    ops = []
    for i in range(m):
        stream = rng.choice(streams)
        n_acc = rng.choice([0, 1, 1, 2, 2, 3, 4, 6]) if rng.random() > 0.01 else 70
        accesses = [_access(rng, mem, stream) for _ in range(n_acc)]
        opaque = not n_acc and rng.random() < 0.3  # a raw Triton launch declaring nothing
        ops.append(Op(100 + 3 * i, f"aten::op{i}", stream, [], accesses, opaque=opaque))
        if rng.random() < 0.3:
            mem.free()
    return ops


def _pointers(rng, op, ops, mem):
    """A node's parameter words: mostly its op's bytes, sometimes others' or reused or no address."""
    words = []
    for _ in range(rng.choice([0, 1, 2, 3, 4])):
        r = rng.random()
        if op.accesses and r < 0.6:
            a = rng.choice(op.accesses)
            words.append(a.addr + rng.randrange(a.nbytes))
        elif r < 0.72:
            other = rng.choice(ops)
            if other.accesses:
                words.append(rng.choice(other.accesses).addr)
        elif r < 0.82 and mem.freed:
            words.append(rng.choice(mem.freed).addr + 8)  # scratch on bytes another allocation held
        else:
            words.append(rng.choice(NOT_ADDRESSES))
    return words


def _node(rng, k, op, ops, mem):
    r = rng.random()
    if r < 0.08:
        return GraphNode(k, rng.choice(["empty", "event_record", "wait_event"]), "ev", [])
    if r < 0.16:
        return GraphNode(k, "kernel", "nvjet_blind", [], 0, "cuFuncGetParamInfo returned 1")
    kind = rng.choice(["kernel"] * 6 + ["memset", "memcpy"])
    return GraphNode(k, kind, f"{kind}_{op.name}", _pointers(rng, op, ops, mem), 4)


def _graph(rng, ops, streams, mem, runs):
    nodes, edges, last = [], [], {}
    for op in ops:
        run = rng.choice(runs) if (op.accesses or op.opaque) else rng.choice([0, 0, 1])
        for r in range(run):
            k = len(nodes)
            nodes.append(_node(rng, k, op, ops, mem))
            prev = k - 1 if r else last.get(op.stream)
            if prev is not None and rng.random() > 0.05:  # a chain edge, now and then lost
                edges.append((prev, k))
            if r == 0 and rng.random() < 0.2:  # a join: another stream's last node before this run
                other = rng.choice(streams)
                if last.get(other) is not None and last[other] != prev:
                    edges.append((last[other], k))
            if rng.random() < 0.03 and k > 2:  # an edge the matcher has no reason to expect
                edges.append((rng.randrange(k - 1), k))
            last[op.stream] = k
    return nodes, edges


RUNS = (0, 1, 1, 1, 2, 3, 5)  # nodes per op that touches bytes, drawn from
CUDA_RUNS = (0, 1, 1, 1, 1, 1, 1, 2, 3)  # ~1.2 nodes per op, as the H200's model captures


def random_case(seed, m=None, runs=RUNS):
    """(ops, RawGraph) of one synthetic capture; m ops (random when None)."""
    rng = random.Random(seed)
    streams = [f"stream{s}" for s in range(rng.choice([1, 2, 2, 3]))]
    mem = _Memory(rng, rng.choice([3, 5, 8]))
    ops = _ops(rng, rng.randrange(0, 25) if m is None else m, streams, mem)
    nodes, edges = _graph(rng, ops, streams, mem, runs)
    if rng.random() < 0.1:  # a side node with no op (a host-side memset, a graph's own)
        nodes.insert(rng.randrange(len(nodes) + 1), GraphNode(0, "memset", "side", [BASE + 4]))
        for k, nd in enumerate(nodes):
            nd.index = k
    return ops, RawGraph(nodes, edges, "CUDA driver (synthetic)")
