"""Cross-check the audit against the graph that was actually built.

    rep = audit.audit_capture(fn, device=dev, keep_graph=True)
    [cc] = audit_graph.check(rep, [rep.graph])          # one CrossCheck per audited capture
    cc.agree, cc.row(), cc.missed

    raw = audit_graph.read_graph(g)                     # CUDA (keep_graph=True) or the simulator
    cc = audit_graph.crosscheck(trace, hazards, raw)    # one capture's trace and its hazards

The audit orders ops with vector clocks computed from the syncs it saw; the graph orders its nodes
by the edges CUDA built. Each audited op is tied to the run of graph nodes it launched
(nblib.instruments.audit.graph_match: by the addresses in the nodes' parameters where they can be read,
by the op's place on its stream's chain of edges where they cannot), and the ordering of every pair
of ops that touch a common byte (one writing, on different streams) is read off the graph's
reachability:

  confirmed     a hazard the audit reports, and the graph has no path between the two ops' nodes;
                "by ordering; pointers unreadable" where a node's parameters could not show the
                bytes (a blind node: cuBLAS's nvjet kernels), so only the missing path is checked
  contradicted  a hazard the audit reports, but the graph orders the two ops (a path, named)
  undecidable   a hazard the audit reports on an op the graph has no node for: the graph cannot say
  missed        the graph leaves two such ops unordered, and the audit reported nothing
  lacking       audited ops that touch bytes and have no graph node in their place
  unclaimed     graph nodes pointing into recorded bytes that their op does not account for
  blind         kernel nodes whose parameters could not be read, each with the call that failed
  internal      kernel nodes read whole that touch no recorded byte (an op's own temporaries), or
                only bytes recorded for allocations not live at their op's place (temporaries the
                allocator put on reused bytes: top-k's scratch on blocks the next ops' outputs take)
  context       for each lacking op, or one matched by order with no blind node: the runs of the
                ops around it, each node with the ops whose recorded bytes its parameters point into

Reading the graph (CUDA's driver API through ctypes, or the simulator): nblib.instruments.audit.graph_read.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

from nblib.instruments import audit
from nblib.instruments.audit.byte_overlap import share_bytes
from nblib.instruments.audit.graph_match import OpNodes, match
from nblib.instruments.audit.graph_read import (  # noqa: F401  (part of this module's API)
    GraphNode,
    GraphReadError,
    RawGraph,
    from_cuda,
    from_sim,
    read_graph,
)

# ------------------------------------------------------------------------------------------------
# the cross-check
# ------------------------------------------------------------------------------------------------


@dataclass
class CrossCheck:
    source: str
    nodes: int
    confirmed: list = field(default_factory=list)
    contradicted: list = field(default_factory=list)
    undecidable: list = field(default_factory=list)
    missed: list = field(default_factory=list)
    lacking: list = field(default_factory=list)
    unclaimed: list = field(default_factory=list)
    blind: list = field(default_factory=list)  # kernel nodes whose parameters could not be read
    internal: list = field(default_factory=list)  # kernel nodes read, touching no recorded byte
    by_order: list = field(default_factory=list)  # ops matched by their place on the stream alone
    confirmed_by_order: list = field(default_factory=list)  # confirmed, pointers unreadable
    context: list = field(default_factory=list)  # runs around each lacking or by-order op (diagnosis)
    topological: bool = True  # the nodes came in an order every edge respects (capture order)

    @property
    def agree(self):
        """The graph decides every hazard and every op, and disagrees with none."""
        return not (self.contradicted or self.missed or self.lacking or self.undecidable)

    def row(self):
        return dict(
            source=self.source,
            nodes=self.nodes,
            confirmed=len(self.confirmed),
            confirmed_by_order=len(self.confirmed_by_order),
            contradicted=len(self.contradicted),
            undecidable=len(self.undecidable),
            missed=len(self.missed),
            lacking=len(self.lacking),
            unclaimed=len(self.unclaimed),
            blind=len(self.blind),
            internal=len(self.internal),
            by_order=len(self.by_order),
            topological=self.topological,
            agree=self.agree,
        )


DETAILS = dict(
    lacking_ops="lacking",
    undecidable_pairs="undecidable",
    contradicted_pairs="contradicted",
    missed_pairs="missed",
    confirmed_pairs="confirmed",
    blind_nodes="blind",
    internal_nodes="internal",
    by_order_ops="by_order",
    unclaimed_nodes="unclaimed",
    context="context",
)


def rows(report, graphs, most=16):
    """One dict per audited capture, in the traces' order: its hazard count, CrossCheck.row() and the
    first `most` entries of each list (DETAILS); or, where the driver will not hand the graph over,
    agree None and the error naming the refused call."""
    out = []
    for tr, g in zip(report.traces, graphs):
        hz = [h for h in report.hazards if h.label is tr.label]
        try:
            cc = crosscheck(tr, hz, read_graph(g))
        except GraphReadError as e:
            out.append(dict(agree=None, error=str(e)))
            continue
        details = {k: getattr(cc, a)[:most] for k, a in DETAILS.items()}
        out.append(dict(hazards=len(hz), **cc.row(), **details))
    return out


def check(report, graphs=None):
    """A CrossCheck per audited capture of an audit Report; `graphs` in the traces' order (the
    simulator's traces carry theirs; CUDA graphs must be made with keep_graph=True)."""
    graphs = graphs if graphs is not None else [t.graph for t in report.traces]
    out = []
    for tr, g in zip(report.traces, graphs):
        hz = [h for h in report.hazards if h.label is tr.label]
        out.append(crosscheck(tr, hz, read_graph(g)))
    return out


def crosscheck(trace, hazards, raw):
    """Compare one capture's audit (its trace and hazards) with the graph (a RawGraph)."""
    audit.happens_before(trace)
    ops = trace.ops
    got = match(ops, raw)
    anc = raw.ancestors()
    cc = CrossCheck(raw.source, len(raw.nodes), unclaimed=[_node(raw, k) for k in got.unclaimed])
    cc.topological = all(a < b for a, b in raw.edges)
    for n, inside in zip(raw.nodes, got.inside):
        if n.blind:
            cc.blind.append(f"{n.name} (node {n.index}): {n.unreadable or '0 params read'}")
        elif n.kind == "kernel" and not inside:  # no pointer into any recorded access's bytes
            cc.internal.append(f"{n.name} (node {n.index}, {n.params_read} params read)")
        elif n.kind == "kernel" and n.index in got.reused:
            cc.internal.append(f"{n.name} (node {n.index}, {n.params_read} params read, on reused bytes)")
    for i, op in enumerate(ops):
        on = got.ops.get(op.index, OpNodes((), "none"))
        if on.how == "none" and (op.accesses or op.opaque):
            cc.lacking.append(f"{_op(op)}: no graph node in its place on its stream")
        elif on.how == "order" and raw.source != "simulator":
            cc.by_order.append(f"{_op(op)} -> node {', '.join(map(str, on.nodes))} ({on.note})")
            if any(raw.nodes[k].blind for k in on.nodes):
                continue  # a blind node's place is the expected reason (cuBLAS's nvjet)
        else:
            continue
        cc.context.append(_context(ops, i, got, raw))
    flagged = {(h.first.index, h.second.index) for h in hazards}
    for c in _conflicts([op for op in ops if op.accesses]):
        na, nb = got.ops[c.first.index], got.ops[c.second.index]
        what = f"{c.kind}: {_op(c.first, na)} / {_op(c.second, nb)}"
        hazard = (c.first.index, c.second.index) in flagged
        if not na.nodes or not nb.nodes:
            if hazard:
                gone = c.first if not na.nodes else c.second
                cc.undecidable.append(f"{what}: undecidable, {gone.name} (op {gone.index}) has no graph node")
            continue
        path = _path(raw, anc, na.nodes[-1], nb.nodes[0]) or _path(raw, anc, nb.nodes[-1], na.nodes[0])
        if path:
            if hazard:
                cc.contradicted.append(f"{what}: ordered by {path}{_order_note(na, nb)}")
            continue
        unseen = _unseen(raw, na, c.first_access) + _unseen(raw, nb, c.second_access)
        note = f" [by ordering; pointers unreadable: {'; '.join(unseen)}]" if unseen else ""
        if hazard:
            cc.confirmed.append(what + note)
            if unseen:
                cc.confirmed_by_order.append(what + note)
        else:
            cc.missed.append(what + note)
    return cc


def _op(op, on=None):
    where = f", node {'/'.join(map(str, on.nodes))}" if on is not None and on.nodes else ""
    return f"{op.name} (op {op.index}, {op.stream}{where})"


def _context(ops, i, got, raw, around=2):
    """The runs of ops[i-around .. i+around]: each node with the ops whose recorded bytes it points
    into ('op 3 arg0'), so a report shows where an op's nodes went."""
    rows = []
    for op in ops[max(0, i - around) : i + around + 1]:
        on = got.ops.get(op.index, OpNodes((), "none"))
        nodes = []
        for k in on.nodes:
            n = raw.nodes[k]
            hits = sorted(
                {
                    f"op {o.index} {a.what}"
                    for p in n.pointers
                    for o in ops
                    for a in o.accesses
                    if a.addr <= p < a.addr + a.nbytes
                }
            )
            nodes.append(f"{k} {n.kind} {n.name[:48]} [{', '.join(hits[:6]) or '-'}]")
        rows.append(f"op {op.index} {op.name} ({op.stream}, {on.how}): {'; '.join(nodes) or 'no node'}")
    return " | ".join(rows)


def _node(raw, k):
    n = raw.nodes[k]
    return f"{n.name} (node {k})"


def _order_note(na, nb):
    by = [on for on in (na, nb) if on.how == "order"]
    return " (a node matched by its place on its stream, not by pointers)" if by else ""


def _unseen(raw, on, acc):
    """Why none of the op's nodes shows an address inside the access's bytes (empty: one does)."""
    lo, hi = acc.addr, acc.addr + acc.nbytes
    nodes = [raw.nodes[k] for k in on.nodes]
    if any(lo <= p < hi for n in nodes for p in n.pointers):
        return []
    why = [f"node {n.index} {n.unreadable or '0 params read'}" for n in nodes if n.blind]
    return why or [f"nodes {'/'.join(str(n.index) for n in nodes)} hold no address in {acc.what}'s bytes"]


def _path(raw, anc, src, dst):
    """'node a -> b -> c' when the graph has a path src -> dst, else ''."""
    if src not in anc[dst]:
        return ""
    succ = {}
    for a, b in raw.edges:
        succ.setdefault(a, []).append(b)
    prev, frontier = {src: None}, [src]
    while frontier and dst not in prev:
        nxt = []
        for a in frontier:
            for b in succ.get(a, []):
                if b not in prev:
                    prev[b] = a
                    nxt.append(b)
        frontier = nxt
    hops, k = [], dst
    while k is not None:
        hops.append(k)
        k = prev[k]
    return "path node " + " -> ".join(map(str, reversed(hops)))


class Conflict(NamedTuple):
    """Two ops (host order) on different streams sharing a byte, one of them writing."""

    first: object
    second: object
    kind: str
    first_access: object
    second_access: object


def _conflicts(ops):
    """Op pairs (host order) on different streams sharing a byte, one of them writing."""
    spans = sorted(
        ((acc.addr, acc.addr + acc.nbytes, op, acc) for op in ops for acc in op.accesses), key=lambda s: s[0]
    )
    seen, active = set(), []
    for lo, hi, op, acc in spans:
        active = [s for s in active if s[1] > lo]
        for _, _, op2, acc2 in active:
            if op2 is op or op2.stream == op.stream or not (acc.writes or acc2.writes):
                continue
            if not share_bytes(acc, acc2):
                continue
            (f, fa), (s, sa) = sorted(((op2, acc2), (op, acc)), key=lambda p: p[0].index)
            key = (f.index, s.index)
            if key not in seen:
                seen.add(key)
                yield Conflict(f, s, audit.kind_of(fa, sa), fa, sa)
        active.append((lo, hi, op, acc))
