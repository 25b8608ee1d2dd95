"""Cross-check the audit against the graph that was actually built.

    rep = audit.audit_capture(fn, device=dev, keep_graph=True)
    [cc] = audit_graph.check(rep, [rep.graph])          # one CrossCheck per audited capture
    cc.agree, cc.row(), cc.missed

    raw = audit_graph.read_graph(g)                     # CUDA (keep_graph=True) or the simulator
    cc = audit_graph.crosscheck(trace, hazards, raw)    # one capture's trace and its hazards

The audit orders ops with vector clocks computed from the syncs it saw; the graph orders its nodes
by the edges CUDA built. Here each audited op is tied to its graph node(s) through the device
addresses in the node's parameters, and the ordering of every pair of ops that touch a common
byte (one writing, on different streams) is read off the graph's reachability:

  confirmed     a hazard the audit reports, and the graph has no path between the two ops' nodes
  contradicted  a hazard the audit reports, but the graph orders the two ops
  missed        the graph leaves two such ops unordered, and the audit reported nothing
  lacking       audited ops with no graph node touching their bytes
  unclaimed     graph nodes touching recorded bytes that no audited op accounts for

On CUDA the graph is read through the driver API with ctypes on libcuda (cuGraphGetNodes,
cuGraphGetEdges, cuGraphNodeGetType, cuGraphKernelNodeGetParams, cuFuncGetParamInfo,
cuGraphMemsetNodeGetParams, cuGraphMemcpyNodeGetParams): each kernel parameter is scanned word by
word for addresses inside the recorded allocations (pointers also hide in structs, as in
TensorIterator's arguments). Nodes come in capture order; ops are matched to them in host order.
On the simulator, each graph node is an audited op. A call the driver refuses raises GraphReadError
naming the call and its CUresult.
"""

import ctypes
import struct
from dataclasses import dataclass, field

from nblib.instruments import audit

# CUgraphNodeType
_KINDS = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "graph",
    5: "empty",
    6: "wait_event",
    7: "event_record",
}


@dataclass
class GraphNode:
    index: int
    kind: str  # kernel | memcpy | memset | empty | event_record | ...
    name: str
    pointers: list  # device addresses found in its parameters
    params_read: int = -1  # kernels: parameters the driver described (0: cuFuncGetParamInfo gave none)


@dataclass
class RawGraph:
    nodes: list
    edges: list  # (from index, to index)
    source: str

    def ancestors(self):
        """For each node, the set of nodes with a path to it."""
        preds = [[] for _ in self.nodes]
        for a, b in self.edges:
            preds[b].append(a)
        memo = [None] * len(self.nodes)
        for i in _topo(len(self.nodes), self.edges):
            s = set()
            for p in preds[i]:
                s.add(p)
                s |= memo[p]
            memo[i] = s
        return memo


def _topo(n, edges):
    succ, indeg = [[] for _ in range(n)], [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    order, ready = [], [i for i in range(n) if indeg[i] == 0]
    while ready:
        i = ready.pop()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return order


# ------------------------------------------------------------------------------------------------
# reading a graph
# ------------------------------------------------------------------------------------------------


def from_sim(g):
    """A SimGraph as a RawGraph: a node per op, its accesses' addresses, edges from its deps."""
    nodes = [GraphNode(n.index, "kernel", str(n.op), [a.addr for a in n.accesses]) for n in g.nodes]
    edges = [(d, n.index) for n in g.nodes for d in n.deps]
    return RawGraph(nodes, edges, "simulator")


class GraphReadError(RuntimeError):
    """The driver refused a call needed to read the graph; the message names the call."""


class _Kernel(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("kernelParams", ctypes.POINTER(ctypes.c_void_p)),
        ("extra", ctypes.POINTER(ctypes.c_void_p)),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


class _Memset(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [
        ("dst", ctypes.c_uint64),
        ("pitch", ctypes.c_size_t),
        ("value", ctypes.c_uint),
        ("elementSize", ctypes.c_uint),
        ("width", ctypes.c_size_t),
        ("height", ctypes.c_size_t),
    ]


def _side(p):
    return [
        (f"{p}XInBytes", ctypes.c_size_t),
        (f"{p}Y", ctypes.c_size_t),
        (f"{p}Z", ctypes.c_size_t),
        (f"{p}LOD", ctypes.c_size_t),
        (f"{p}MemoryType", ctypes.c_int),
        (f"{p}Host", ctypes.c_void_p),
        (f"{p}Device", ctypes.c_uint64),
        (f"{p}Array", ctypes.c_void_p),
        (f"{p}reserved", ctypes.c_void_p),
        (f"{p}Pitch", ctypes.c_size_t),
        (f"{p}Height", ctypes.c_size_t),
    ]


class _Memcpy(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [
        *_side("src"),
        *_side("dst"),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
        ("Depth", ctypes.c_size_t),
    ]


class _Driver:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise GraphReadError(f"libcuda.so.1 cannot be loaded ({e}): no CUDA driver here") from e

    def __call__(self, name, *args):
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise GraphReadError(f"{name} is not in this driver's libcuda (needs a newer driver)")
        rc = fn(*args)
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(s))
            raise GraphReadError(f"{name} returned {rc} ({(s.value or b'?').decode()})")


def _pointer(handle):
    """A cudaGraph_t as torch hands it over: an int, or a PyCapsule."""
    if isinstance(handle, int):
        return handle
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(handle, None)


def from_cuda(handle):
    """The graph behind a cudaGraph_t (torch: CUDAGraph(keep_graph=True).raw_cuda_graph())."""
    cu = _Driver()
    graph = ctypes.c_void_p(_pointer(handle))
    n = ctypes.c_size_t(0)
    cu("cuGraphGetNodes", graph, None, ctypes.byref(n))
    handles = (ctypes.c_void_p * n.value)()
    cu("cuGraphGetNodes", graph, handles, ctypes.byref(n))
    index = {h: i for i, h in enumerate(handles)}
    nodes = [_read_node(cu, i, ctypes.c_void_p(h)) for i, h in enumerate(handles)]
    edges = [(index[a], index[b]) for a, b in _edges(cu, graph)]
    return RawGraph(nodes, edges, "CUDA driver (libcuda via ctypes)")


def _edges(cu, graph):
    """cuGraphGetEdges; where it refuses (edges with data: CUDA_ERROR_LOSSY_QUERY), its _v2. A graph
    with no edge (two unordered kernels, the simplest race) is answered by the count alone: the
    driver refuses a fill call for zero edges with CUDA_ERROR_INVALID_VALUE (measured on the H200)."""
    errors = []
    for name, extra in (("cuGraphGetEdges", ()), ("cuGraphGetEdges_v2", (None,))):
        try:
            m = ctypes.c_size_t(0)
            cu(name, graph, None, None, *extra, ctypes.byref(m))
            if m.value == 0:
                return []
            src, dst = (ctypes.c_void_p * m.value)(), (ctypes.c_void_p * m.value)()
            data = ((ctypes.c_uint8 * 8 * m.value)(),) if extra else ()  # _v2: CUgraphEdgeData each
            cu(name, graph, src, dst, *data, ctypes.byref(m))
            return list(zip(src, dst))
        except GraphReadError as e:
            errors.append(str(e))
    raise GraphReadError("; ".join(errors))


def _read_node(cu, i, h):
    t = ctypes.c_int(-1)
    cu("cuGraphNodeGetType", h, ctypes.byref(t))
    kind = _KINDS.get(t.value, f"type {t.value}")
    if kind == "kernel":
        p = _Kernel()
        cu("cuGraphKernelNodeGetParams_v2", h, ctypes.byref(p))
        func = ctypes.c_void_p(p.func)
        if not p.func and p.kern:  # a library kernel: its function in this context
            cu("cuKernelGetFunction", ctypes.byref(func), ctypes.c_void_p(p.kern))
        name = ctypes.c_char_p()
        try:
            cu("cuFuncGetName", ctypes.byref(name), func)
        except GraphReadError:
            name = ctypes.c_char_p(b"?")
        words, nparams = _kernel_words(cu, func, p)
        return GraphNode(i, kind, (name.value or b"?").decode(), words, nparams)
    if kind == "memset":
        p = _Memset()
        cu("cuGraphMemsetNodeGetParams", h, ctypes.byref(p))
        return GraphNode(i, kind, "memset", [p.dst])
    if kind == "memcpy":
        p = _Memcpy()
        cu("cuGraphMemcpyNodeGetParams", h, ctypes.byref(p))
        return GraphNode(i, kind, "memcpy", [p.srcDevice, p.dstDevice])
    return GraphNode(i, kind, kind, [])


def _kernel_words(cu, func, p):
    """Every 8-byte word of every kernel parameter (candidate device addresses), and how many
    parameters the driver described."""
    blobs = []
    if p.kernelParams:
        k = 0
        while True:
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            try:
                cu("cuFuncGetParamInfo", func, ctypes.c_size_t(k), ctypes.byref(off), ctypes.byref(size))
            except GraphReadError as e:
                if "INVALID_VALUE" in str(e):  # past the last parameter
                    break
                raise
            blobs.append(ctypes.string_at(p.kernelParams[k], size.value))
            k += 1
    elif p.extra:  # CU_LAUNCH_PARAM_BUFFER_POINTER (1), buffer, CU_LAUNCH_PARAM_BUFFER_SIZE (2), &size
        e = p.extra
        if e[0] == 1 and e[2] == 2:
            size = ctypes.cast(e[3], ctypes.POINTER(ctypes.c_size_t))[0]
            blobs.append(ctypes.string_at(e[1], size))
    words = []
    for b in blobs:
        words += [struct.unpack_from("<Q", b, o)[0] for o in range(0, len(b) - 7, 8)]
    return words, len(blobs)


def read_graph(g):
    """The RawGraph of a captured graph: a SimGraph, or a torch CUDAGraph made with keep_graph=True."""
    if hasattr(g, "raw_cuda_graph"):
        return from_cuda(g.raw_cuda_graph())
    return from_sim(g)


# ------------------------------------------------------------------------------------------------
# the cross-check
# ------------------------------------------------------------------------------------------------


@dataclass
class CrossCheck:
    source: str
    nodes: int
    confirmed: list = field(default_factory=list)
    contradicted: list = field(default_factory=list)
    missed: list = field(default_factory=list)
    lacking: list = field(default_factory=list)
    unclaimed: list = field(default_factory=list)
    blind: list = field(default_factory=list)  # kernel nodes touching no recorded byte, as far as read
    topological: bool = True  # the nodes came in an order every edge respects (capture order)

    @property
    def agree(self):
        return not (self.contradicted or self.missed or self.lacking)

    def row(self):
        return dict(
            source=self.source,
            nodes=self.nodes,
            confirmed=len(self.confirmed),
            contradicted=len(self.contradicted),
            missed=len(self.missed),
            lacking=len(self.lacking),
            unclaimed=len(self.unclaimed),
            blind=len(self.blind),
            topological=self.topological,
            agree=self.agree,
        )


def rows(report, graphs, most=8):
    """One dict per audited capture, in the traces' order: its hazard count, CrossCheck.row() and the
    first `most` lacking ops, blind nodes, missed and contradicted pairs; or, where the driver will not
    hand the graph over, agree None and the error naming the refused call."""
    out = []
    for tr, g in zip(report.traces, graphs):
        hz = [h for h in report.hazards if h.label is tr.label]
        try:
            cc = crosscheck(tr, hz, read_graph(g))
        except GraphReadError as e:
            out.append(dict(agree=None, error=str(e)))
            continue
        details = dict(lacking_ops=cc.lacking, blind_nodes=cc.blind, missed_pairs=cc.missed)
        details["contradicted_pairs"] = cc.contradicted
        out.append(dict(hazards=len(hz), **cc.row(), **{k: v[:most] for k, v in details.items()}))
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


def _touches(node, op):
    return any(a.addr <= p < a.addr + a.nbytes for p in node.pointers for a in op.accesses)


def _explained(node, op):
    """How many of the node's pointers fall in the op's accesses."""
    return sum(any(a.addr <= p < a.addr + a.nbytes for a in op.accesses) for p in node.pointers)


def match(ops, raw):
    """Each op's graph nodes. The simulator: node i is op i. CUDA: nodes in capture order, each op
    takes the next node touching its bytes (and the following ones that touch its bytes and not the
    next op's), unless the next op accounts for more of that node's pointers: then the node is the
    next op's and this op's own node was one whose pointers could not be read (it stays lacking,
    rather than shifting every later op by one). Nodes touching no recorded byte are skipped."""
    if raw.source == "simulator":
        return {op.index: [op.index] for op in ops}, []
    known = [a for op in ops for a in op.accesses]
    relevant = [
        n for n in raw.nodes if any(a.addr <= p < a.addr + a.nbytes for p in n.pointers for a in known)
    ]
    out, j = {}, 0
    for k, op in enumerate(ops):
        nxt = ops[k + 1] if k + 1 < len(ops) else None
        mine = []
        n = relevant[j] if j < len(relevant) else None
        if n is not None and _touches(n, op) and not (nxt and _explained(n, nxt) > _explained(n, op)):
            mine.append(n.index)
            j += 1
            while (
                j < len(relevant) and _touches(relevant[j], op) and not (nxt and _touches(relevant[j], nxt))
            ):
                mine.append(relevant[j].index)
                j += 1
        out[op.index] = mine
    skipped = [n.index for n in relevant[j:]]
    return out, skipped


def crosscheck(trace, hazards, raw):
    """Compare one capture's audit (its trace and hazards) with the graph (a RawGraph)."""
    audit.happens_before(trace)
    ops = [op for op in trace.ops if op.accesses]
    nodes_of, unclaimed = match(ops, raw)
    anc = raw.ancestors()
    cc = CrossCheck(raw.source, len(raw.nodes), unclaimed=unclaimed)
    cc.topological = all(a < b for a, b in raw.edges)
    cc.lacking = [f"{op.name} (op {op.index}) on {op.stream}" for op in ops if not nodes_of.get(op.index)]
    # where an op lacks its node: kernel nodes no recorded byte was found in, and how many of their
    # parameters the driver described (0: no parameter info, so their pointers cannot be read)
    known = [a for op in ops for a in op.accesses]
    cc.blind = [
        f"{n.name} (node {n.index}, {n.params_read} params read)"
        for n in raw.nodes
        if n.kind == "kernel" and not any(a.addr <= p < a.addr + a.nbytes for p in n.pointers for a in known)
    ]
    flagged = {(h.first.index, h.second.index) for h in hazards}
    for a, b, kind in _conflicts(ops):
        na, nb = nodes_of.get(a.index), nodes_of.get(b.index)
        if not na or not nb:
            continue
        graph_ordered = na[-1] in anc[nb[0]]
        what = f"{kind}: {a.name} (op {a.index}, {a.stream}) / {b.name} (op {b.index}, {b.stream})"
        if (a.index, b.index) in flagged:
            (cc.contradicted if graph_ordered else cc.confirmed).append(what)
        elif not graph_ordered:
            cc.missed.append(what)
    return cc


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
            if not audit.share_bytes(acc, acc2):
                continue
            (f, fa), (s, sa) = sorted(((op2, acc2), (op, acc)), key=lambda p: p[0].index)
            key = (f.index, s.index)
            if key not in seen:
                seen.add(key)
                yield f, s, audit._kind(fa, sa)
        active.append((lo, hi, op, acc))
