"""Which graph nodes each audited op launched: the recorder's ops (host order, each on its stream)
aligned with the graph's nodes (capture order) by what both sides know.

An op's kernels are created while the host is inside that op, so the nodes come as one run per op,
in the ops' order (an op may launch none, or several: sort's arange, copy and sort kernels). The
alignment cuts the node list into those runs, scoring each cut by:

  pointers   a node's parameters hold addresses inside the op's accessed bytes (+), or inside other
             recorded bytes only (-); a blind node (its parameters unreadable, e.g. cuBLAS's nvjet
             kernels) and a node touching only unrecorded memory (an op-internal temporary) are
             neutral: they say nothing about whose they are
  chains     capture puts an edge from a stream's previous node to its next one, so the nodes of one
             op follow each other by edges, and an op's first node has an edge from the last node
             of the previous op on its stream (a missing edge costs, it is not forbidden)
  presence   an op that touches bytes launches something (an empty run costs)

so a blind node between two matched ones is taken by the op its position on its stream says it is
(matched "by order"), instead of leaving that op lacking and letting it take the next op's node.
The simulator's graphs need none of this: node i is op i.
"""

from typing import NamedTuple

from nblib.instruments.graph_read import MEMORY_KINDS

EXPLAINED, FOREIGN, EMPTY, NO_EDGE = 2.0, 1.0, 1.5, 4.0  # score weights (see the docstring)


class OpNodes(NamedTuple):
    """One op's run of graph nodes and how it was matched."""

    nodes: tuple  # node indices, capture order
    how: str  # "pointers" (a node's addresses are this op's) | "order" (position alone) | "none"
    note: str = ""  # where matched by order: why the pointers could not decide


class Match(NamedTuple):
    ops: dict  # op index -> OpNodes
    unclaimed: list  # node indices touching recorded bytes that no op's run accounts for


def _ranges(op):
    return [(a.addr, a.addr + a.nbytes) for a in op.accesses]


def _inside(p, ranges):
    return any(lo <= p < hi for lo, hi in ranges)


class _Evidence:
    """Per node: its addresses inside recorded bytes; per (op, node): how many of those are the op's."""

    def __init__(self, ops, raw):
        known = [r for op in ops for r in _ranges(op)]
        self.rec = [[p for p in n.pointers if _inside(p, known)] for n in raw.nodes]
        self.ranges = {op.index: _ranges(op) for op in ops}

    def explained(self, op, k):
        return sum(_inside(p, self.ranges[op.index]) for p in self.rec[k])

    def score(self, op, k):
        e = self.explained(op, k)
        return EXPLAINED * e - FOREIGN * (len(self.rec[k]) - e)


class _State(NamedTuple):
    score: float
    lasts: dict  # stream -> the last node of that stream's latest run
    back: tuple  # (previous j, run start, run end) for the op just placed


def match(ops, raw):
    """A Match for `ops` (a trace's ops, host order) on the RawGraph `raw`."""
    if raw.source == "simulator":
        return Match({op.index: OpNodes((op.index,), "pointers") for op in ops}, [])
    n, m = len(raw.nodes), len(ops)
    ev = _Evidence(ops, raw)
    edges = set(raw.edges)
    scores = [[ev.score(op, k) for k in range(n)] for op in ops]
    # best[i][j]: ops[:i] placed on nodes[:j]
    best = [dict() for _ in range(m + 1)]
    best[0][0] = _State(0.0, {}, None)
    for i, op in enumerate(ops):
        expects = bool(op.accesses) or op.opaque
        for j, st in best[i].items():
            prev = st.lasts.get(op.stream)
            run = 0.0
            for j2 in range(j, n + 1):
                if j2 == j:
                    s = st.score - (EMPTY if expects else 0.0)
                    lasts = st.lasts
                else:
                    k = j2 - 1
                    run += scores[i][k]
                    if k == j:  # the run's first node: an edge from its stream's last node
                        run -= NO_EDGE if prev is not None and (prev, k) not in edges else 0.0
                    elif (k - 1, k) not in edges:  # inside a run: one chain
                        run -= NO_EDGE
                    s = st.score + run
                    lasts = {**st.lasts, op.stream: k}
                if i + 1 == m and j2 != n:
                    continue  # the last op's run ends at the last node
                old = best[i + 1].get(j2)
                if old is None or s > old.score:
                    best[i + 1][j2] = _State(s, lasts, (j, j, j2))
    out, j = {}, n
    if n not in best[m]:  # no ops (or no nodes): nothing matched
        return Match({op.index: OpNodes((), "none") for op in ops}, [k for k in range(n) if ev.rec[k]])
    for i in range(m, 0, -1):
        pj, a, b = best[i][j].back
        out[ops[i - 1].index] = _classify(ops[i - 1], range(a, b), raw, ev)
        j = pj
    owner = {k: op for op in ops for k in out[op.index].nodes}
    unclaimed = [k for k in range(n) if ev.rec[k] and not (k in owner and ev.explained(owner[k], k))]
    return Match(out, unclaimed)


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
        else:
            why.append(f"node {k} ({nd.name[:40]}) points at other ops' bytes only")
    return OpNodes(nodes, "order", "; ".join(why))
