"""Which graph nodes each audited op launched: the recorder's ops (host order, each on its stream)
aligned with the graph's nodes (capture order) by what both sides know.

An op's kernels are created while the host is inside that op, so the nodes come as one run per op,
in the ops' order (an op may launch none, or several: sort's arange, copy and sort kernels; top-k's
memsets, radix passes, cub scans and gather). The alignment cuts the node list into those runs,
scoring each cut by:

  pointers   which of the op's accesses the run's nodes point into (+ per access covered, however
             many nodes point there, so a run of many kernels counts no more than one), and the
             addresses inside other ops' bytes that are live at the op's place (-: the bytes of an
             allocation from its first to its last use, or always for memory from outside the
             capture). An address inside bytes of an allocation not live there is an op-internal
             temporary the allocator placed on reused bytes (top-k's scratch on the blocks the next
             ops' outputs will take): neutral, like an address outside any recorded byte and like
             a blind node (parameters unreadable, e.g. cuBLAS's nvjet kernels)
  chains     capture puts an edge from a stream's previous node to its next one, so the nodes of one
             op follow each other by edges, and an op's first node has an edge from the last node
             of the previous op on its stream (a missing edge costs, it is not forbidden); a fork or
             a join happens between ops, so an edge from or to another stream sits at a run's end
             or start, not inside it (costs as much)
  presence   an op that touches bytes launches something (an empty run costs)
  tail       nodes after a run's last node with its op's bytes cost a little, so that an internal
             node between two ops goes with the op whose pointed-at node follows it (top-k's leading
             memsets), where no edge says otherwise

so a blind node between two matched ones is taken by the op its position on its stream says it is
(matched "by order"), instead of leaving that op lacking and letting it take the next op's node.
The simulator's graphs need none of this: node i is op i.

The alignment is a dynamic programme over (ops placed, nodes used): best[i][j] is the best score of
ops[:i] on nodes[:j], with each stream's last node. Per op it is evaluated as one (j, j2) matrix in
numpy, the run being nodes j..j2-1: a run's costs are prefix sums (the op's foreign addresses, the
in-run edge costs), its covered accesses are counted from each access's next covering node at or
after j, its tail from the last covering node before j2; the terms are summed in one fixed order, so
equal scores stay equal, and the earliest j wins a tie (numpy's first maximum). The containment of
the nodes' addresses in the recorded bytes is one boolean matrix (spans x addresses); per (op, node)
counts are matrix products of it.
"""

from typing import NamedTuple

import numpy as np

from nblib.instruments.audit.graph_read import MEMORY_KINDS

EXPLAINED, FOREIGN, EMPTY, NO_EDGE, TAIL = 2.0, 1.0, 1.5, 4.0, 0.01  # weights (see the docstring)


class OpNodes(NamedTuple):
    """One op's run of graph nodes and how it was matched."""

    nodes: tuple  # node indices, capture order
    how: str  # "pointers" (a node's addresses are this op's) | "order" (position alone) | "none"
    note: str = ""  # where matched by order: why the pointers could not decide


class Match(NamedTuple):
    ops: dict  # op index -> OpNodes
    unclaimed: list  # node indices pointing into bytes live at their op's place that it does not access
    reused: list = []  # kernel nodes pointing only at recorded bytes not live at their op's place
    inside: list = []  # per node (by index): its addresses inside some recorded access's bytes


class _Span(NamedTuple):
    lo: int
    hi: int
    first: int  # place (host order) of the first op touching its allocation; None: always live
    last: int


def _spans(ops):
    """Every recorded access's bytes with its allocation's life over the ops' places (op order, so
    each op's accesses are one contiguous block)."""
    life = {}
    for i, op in enumerate(ops):
        for a in op.accesses:
            if a.alloc is not None:
                f, _ = life.get(id(a.alloc), (i, i))
                life[id(a.alloc)] = (f, i)
    out = []
    for op in ops:
        for a in op.accesses:
            f, last = life[id(a.alloc)] if a.alloc is not None else (None, None)
            out.append(_Span(a.addr, a.addr + a.nbytes, f, last))
    return out


def _containment(spans, nodes):
    """(spans x addresses inside some span: which bytes hold each, the node of each address, per node
    its addresses inside recorded bytes)."""
    ptrs = [p for nd in nodes for p in nd.pointers]
    of = np.repeat(np.arange(len(nodes)), [len(nd.pointers) for nd in nodes]).astype(np.int64)
    if not spans or not ptrs:
        return np.zeros((len(spans), 0), bool), of[:0], [[] for _ in nodes]
    base, top = min(s.lo for s in spans), max(s.hi for s in spans)
    # addresses relative to the lowest recorded byte (those outside all spans as -1), so that 64-bit
    # addresses compare as int64; object arrays (exact, slow) where the recorded bytes span more
    dtype = np.int64 if top - base < 2**62 else object
    lo = np.array([s.lo - base for s in spans], dtype)
    hi = np.array([s.hi - base for s in spans], dtype)
    at = np.array([p - base if base <= p < top else -1 for p in ptrs], dtype)
    held = (lo[:, None] <= at[None, :]) & (at[None, :] < hi[:, None])
    hit = held.any(axis=0)
    rec = [[] for _ in nodes]
    for k, p, h in zip(of.tolist(), ptrs, hit.tolist()):
        if h:
            rec[k].append(p)
    return held[:, hit], of[hit], rec


class _Evidence:
    """Per node: its addresses inside recorded bytes; per (op, node): which of the op's accesses it
    points into, how many of its addresses are the op's, how many are in other bytes live at the op's
    place."""

    def __init__(self, ops, raw):
        spans = _spans(ops)
        held, of, self.rec = _containment(spans, raw.nodes)
        m, n, s = len(ops), len(raw.nodes), len(spans)
        self.place = {op.index: i for i, op in enumerate(ops)}
        self.block = np.cumsum([0] + [len(op.accesses) for op in ops])  # op i: spans block[i]:block[i+1]
        node = np.zeros((len(of), n))
        node[np.arange(len(of)), of] = 1.0  # address -> its node
        own = np.zeros((m, s))
        own[np.repeat(np.arange(m), np.diff(self.block)), np.arange(s)] = 1.0
        always = np.array([sp.first is None for sp in spans], bool)
        first = np.array([-1 if sp.first is None else sp.first for sp in spans], np.int64)
        last = np.array([-1 if sp.first is None else sp.last for sp in spans], np.int64)
        at = np.arange(m)
        live = always[None, :] | ((first[None, :] <= at[:, None]) & (at[:, None] <= last[None, :]))
        h = held.astype(float)
        mine = own @ h > 0  # ops x addresses: inside the op's bytes
        elsewhere = live.astype(float) @ h > 0  # ops x addresses: in bytes live at the op's place
        self._explained = (mine @ node).round().astype(np.int64)
        self._foreign = ((~mine & elsewhere) @ node).round().astype(np.int64)
        self.points = h @ node > 0  # spans x nodes: the node points into the access's bytes

    def explained(self, op, k):
        return int(self._explained[self.place[op.index], k])

    def foreign(self, op, k):
        """Node k's addresses outside the op's bytes, inside bytes live at the op's place."""
        return int(self._foreign[self.place[op.index], k])

    def foreign_at(self, i):
        """Per node: foreign(op, node) of the op at place i."""
        return self._foreign[i]

    def covers(self, i):
        """Accesses x nodes of the op at place i: the node points into the access's bytes."""
        return self.points[self.block[i] : self.block[i + 1]]


def _crossings(n, edges):
    """Per node: an edge into it from another node than the one before it (a join, an event wait),
    and an edge out of it to another node than the next (a fork, an event record)."""
    into, out = [False] * n, [False] * n
    for a, b in edges:
        if a != b - 1:
            into[b] = out[a] = True
    return into, out


class _Chains(NamedTuple):
    """What a run's cost needs of the graph alone."""

    edge: np.ndarray  # (n+1) x (n+1): an edge a -> b
    inner: np.ndarray  # [j, j2]: the edge costs inside the run j..j2-1 (its nodes after the first)
    memory: np.ndarray  # [t]: memory nodes among nodes 0..t-1 (n+1 entries)
    before: np.ndarray  # [j, j2]: j2 < j (no run)


def _chains(raw):
    n = len(raw.nodes)
    edge = np.zeros((n + 1, n + 1), bool)
    for a, b in set(raw.edges):
        if 0 <= a < n and 0 <= b < n:  # runs only ask about these
            edge[a, b] = True
    into, out_ = _crossings(n, raw.edges)
    inner = np.zeros(n + 1)
    for k in range(1, n):  # inside a run: one chain, no other stream's edge in or out
        inner[k] = NO_EDGE * ((not edge[k - 1, k]) + into[k] + out_[k - 1])
    memory = np.cumsum([0] + [nd.kind in MEMORY_KINDS for nd in raw.nodes])
    upto = np.concatenate([[0.0], np.cumsum(inner)])  # [t]: nodes 1..t-1
    before = np.tril(np.ones((n + 1, n + 1), bool), -1)
    return _Chains(edge, upto[None, :-1] - upto[1:, None], memory, before)


def _covered(cov):
    """[j, j2]: how many accesses (rows of cov, accesses x nodes) nodes j..j2-1 point into."""
    a, n = cov.shape
    if a == 0:
        return np.zeros((n + 1, n + 1), np.int64)
    nxt = np.where(cov, np.arange(n), n)  # per access, from each j on: the next node pointing into it
    nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    nxt = np.concatenate([nxt, np.full((a, 1), n)], axis=1)
    at = np.bincount((np.arange(n + 1) * (n + 1) + nxt).ravel(), minlength=(n + 1) ** 2)
    upto = np.cumsum(at.reshape(n + 1, n + 1), axis=1)  # [j, t]: accesses whose next node is <= t
    return np.concatenate([np.zeros((n + 1, 1), np.int64), upto[:, :-1]], axis=1)


def _tail(cov, memory):
    """[j, j2]: memory nodes after the run's last node pointing into the op's bytes (0 if none)."""
    n = cov.shape[1]
    hit = np.where(cov.any(axis=0), np.arange(n), -1)
    last = np.concatenate([[-1], np.maximum.accumulate(hit)]).astype(np.int64)  # [j2]: last one < j2
    j = np.arange(n + 1)
    return np.where(last[None, :] >= j[:, None], (memory - memory[last + 1])[None, :], 0)


def _scores(score, prev, cov, foreign, expects, ch):
    """[j, j2]: the score of the op on nodes j..j2-1 after the state best[i][j] (-inf: j2 < j)."""
    n = len(score) - 1
    j = np.arange(n + 1)
    first = np.where((prev >= 0) & ~ch.edge[np.maximum(prev, 0), j], NO_EDGE, 0.0)
    f = np.concatenate([[0.0], np.cumsum(foreign)])
    # integer-valued costs: exact in any order of summation
    cost = (f[None, :] - f[:, None]) + first[:, None] + ch.inner
    s = score[:, None] + EXPLAINED * _covered(cov) - cost - TAIL * _tail(cov, ch.memory)
    s[j, j] = score - (EMPTY if expects else 0.0)
    np.copyto(s, -np.inf, where=ch.before)
    return s


def _align(ops, raw, ev):
    """Per op, per j2: the j of the best run j..j2-1 (the backtrace); and the final score[n]."""
    n = len(raw.nodes)
    ch = _chains(raw)
    streams = {}
    for op in ops:
        streams.setdefault(op.stream, len(streams))
    score = np.full(n + 1, -np.inf)
    score[0] = 0.0
    lasts = np.full((len(streams), n + 1), -1)  # per stream, per state: its last node (-1: none)
    back, j2 = [], np.arange(n + 1)
    for i, op in enumerate(ops):
        sid = streams[op.stream]
        foreign = FOREIGN * ev.foreign_at(i).astype(float)
        s = _scores(score, lasts[sid], ev.covers(i), foreign, bool(op.accesses) or op.opaque, ch)
        win = np.argmax(s, axis=0)  # the first (lowest) j of equal best scores
        score = s[win, j2]
        if i + 1 == len(ops):
            score[:n] = -np.inf  # the last op's run ends at the last node
        lasts = lasts[:, win]
        ran = win < j2
        lasts[sid, ran] = j2[ran] - 1
        back.append(win)
    return back, score[n]


def match(ops, raw):
    """A Match for `ops` (a trace's ops, host order) on the RawGraph `raw`."""
    if raw.source == "simulator":
        inside = _containment(_spans(ops), raw.nodes)[2]
        return Match({op.index: OpNodes((op.index,), "pointers") for op in ops}, [], [], inside)
    n, m = len(raw.nodes), len(ops)
    ev = _Evidence(ops, raw)
    back, final = _align(ops, raw, ev)
    if final == -np.inf:  # no ops (or no nodes): nothing matched
        none = {op.index: OpNodes((), "none") for op in ops}
        return Match(none, [k for k in range(n) if ev.rec[k]], [], ev.rec)
    got, j = {}, n
    for i in range(m, 0, -1):
        pj = int(back[i - 1][j])
        got[ops[i - 1].index] = _classify(ops[i - 1], range(pj, j), raw, ev)
        j = pj
    return _match(ops, got, ev, n)


def _match(ops, got, ev, n):
    """The Match of the runs `got`: each node pointing into recorded bytes its op does not account
    for is unclaimed (live bytes of another op) or reused (bytes no op held there)."""
    owner = {k: op for op in ops for k in got[op.index].nodes}
    unclaimed, reused = [], []
    for k in range(n):
        op = owner.get(k)
        if not ev.rec[k] or (op is not None and ev.explained(op, k)):
            continue
        if op is None or ev.foreign(op, k):
            unclaimed.append(k)
        else:
            reused.append(k)
    return Match(got, unclaimed, reused, ev.rec)


def _classify(op, run, raw, ev):
    """Drop the run's nodes that move no bytes (empty, event nodes) and say how the rest was found."""
    nodes = tuple(k for k in run if raw.nodes[k].kind in MEMORY_KINDS)
    if not nodes:
        return OpNodes((), "none")
    if any(ev.explained(op, k) for k in nodes):
        return OpNodes(nodes, "pointers")
    why = []
    for k in nodes:
        nd = raw.nodes[k]
        if nd.blind:
            why.append(f"node {k} ({nd.name[:40]}) unreadable: {nd.unreadable or '0 params read'}")
        elif not ev.rec[k]:
            why.append(f"node {k} ({nd.name[:40]}) touches no recorded byte")
        elif not ev.foreign(op, k):
            why.append(f"node {k} ({nd.name[:40]}) touches only bytes other allocations held at other times")
        else:
            why.append(f"node {k} ({nd.name[:40]}) points at other ops' bytes only")
    return OpNodes(nodes, "order", "; ".join(why))
