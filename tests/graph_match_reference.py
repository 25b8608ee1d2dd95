"""The matcher in plain Python (O(ops x nodes^2) steps, a state per step): the reference that
nblib.instruments.audit.graph_match must agree with exactly (tests/test_graph_match.py,
scripts/bench_graph_match.py). The run's classification and the leftover nodes come from the module
itself (_classify, _match): they read the evidence the same way in both, and what is compared is
the evidence and the alignment."""

from typing import NamedTuple

from nblib.instruments.audit.graph_match import (
    EMPTY,
    EXPLAINED,
    FOREIGN,
    NO_EDGE,
    TAIL,
    Match,
    OpNodes,
    _classify,
    _match,
    _spans,
)
from nblib.instruments.audit.graph_read import MEMORY_KINDS


def _ranges(op):
    return [(a.addr, a.addr + a.nbytes) for a in op.accesses]


def _inside(p, ranges):
    return any(lo <= p < hi for lo, hi in ranges)


class _Evidence:
    """Per node: its addresses inside recorded bytes, each with the lives of the bytes it hits; per
    (op, node): the op's accesses it covers (a bit mask) and its addresses in other live bytes."""

    def __init__(self, ops, raw):
        spans = _spans(ops)
        self.rec, self.lives = [], []
        for n in raw.nodes:
            hits = [(p, [s for s in spans if s.lo <= p < s.hi]) for p in n.pointers]
            hits = [(p, ss) for p, ss in hits if ss]
            self.rec.append([p for p, _ in hits])
            self.lives.append([ss for _, ss in hits])
        self.ranges = {op.index: _ranges(op) for op in ops}
        self.place = {op.index: i for i, op in enumerate(ops)}

    def explained(self, op, k):
        return sum(_inside(p, self.ranges[op.index]) for p in self.rec[k])

    def covers(self, op, k):
        """Bit mask of the op's accesses that node k points into."""
        return sum(
            1 << b
            for b, (lo, hi) in enumerate(self.ranges[op.index])
            if any(lo <= p < hi for p in self.rec[k])
        )

    def foreign(self, op, k):
        """Node k's addresses outside the op's bytes, inside bytes live at the op's place."""
        i, mine = self.place[op.index], self.ranges[op.index]
        return sum(
            1
            for p, ss in zip(self.rec[k], self.lives[k])
            if not _inside(p, mine) and any(s.first is None or s.first <= i <= s.last for s in ss)
        )


class _State(NamedTuple):
    score: float
    lasts: dict  # stream -> the last node of that stream's latest run
    back: tuple  # (previous j, run start, run end) for the op just placed


def _crossings(n, edges):
    """Per node: an edge into it from another node than the one before it (a join, an event wait),
    and an edge out of it to another node than the next (a fork, an event record)."""
    into, out = [False] * n, [False] * n
    for a, b in edges:
        if a != b - 1:
            into[b] = out[a] = True
    return into, out


def match(ops, raw):
    """A Match for `ops` (a trace's ops, host order) on the RawGraph `raw`."""
    if raw.source == "simulator":
        known = [r for op in ops for r in _ranges(op)]
        inside = [[p for p in nd.pointers if _inside(p, known)] for nd in raw.nodes]
        return Match({op.index: OpNodes((op.index,), "pointers") for op in ops}, [], [], inside)
    n, m = len(raw.nodes), len(ops)
    ev = _Evidence(ops, raw)
    edges = set(raw.edges)
    into, out_ = _crossings(n, raw.edges)
    memory = [nd.kind in MEMORY_KINDS for nd in raw.nodes]
    covers = [[ev.covers(op, k) for k in range(n)] for op in ops]
    foreign = [[FOREIGN * ev.foreign(op, k) for k in range(n)] for op in ops]
    # best[i][j]: ops[:i] placed on nodes[:j]
    best = [dict() for _ in range(m + 1)]
    best[0][0] = _State(0.0, {}, None)
    for i, op in enumerate(ops):
        expects = bool(op.accesses) or op.opaque
        cov_i, foreign_i = covers[i], foreign[i]
        for j, st in best[i].items():
            prev = st.lasts.get(op.stream)
            cov, cost, tail = 0, 0.0, 0
            for j2 in range(j, n + 1):
                if j2 == j:
                    s = st.score - (EMPTY if expects else 0.0)
                    lasts = st.lasts
                else:
                    k = j2 - 1
                    cost += foreign_i[k]
                    if k == j:  # the run's first node: an edge from its stream's last node
                        cost += NO_EDGE if prev is not None and (prev, k) not in edges else 0.0
                    else:  # inside a run: one chain, no other stream's edge in or out
                        cost += NO_EDGE * (((k - 1, k) not in edges) + into[k] + out_[k - 1])
                    if cov_i[k]:
                        cov, tail = cov | cov_i[k], 0
                    elif cov and memory[k]:
                        tail += 1
                    s = st.score + EXPLAINED * cov.bit_count() - cost - TAIL * tail
                    lasts = {**st.lasts, op.stream: k}
                if i + 1 == m and j2 != n:
                    continue  # the last op's run ends at the last node
                old = best[i + 1].get(j2)
                if old is None or s > old.score:
                    best[i + 1][j2] = _State(s, lasts, (j, j, j2))
    if n not in best[m]:  # no ops (or no nodes): nothing matched
        none = {op.index: OpNodes((), "none") for op in ops}
        return Match(none, [k for k in range(n) if ev.rec[k]], [], ev.rec)
    got, j = {}, n
    for i in range(m, 0, -1):
        pj, a, b = best[i][j].back
        got[ops[i - 1].index] = _classify(ops[i - 1], range(a, b), raw, ev)
        j = pj
    return _match(ops, got, ev, n)
