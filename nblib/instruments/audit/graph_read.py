"""Reading a captured graph back: its nodes (kind, name, the device addresses in their parameters)
and edges, from the simulator's SimGraph or from CUDA's driver (libcuda via ctypes: cuGraphGetNodes,
cuGraphGetEdges, cuGraphNodeGetType, cuGraphKernelNodeGetParams_v2, cuFuncGetParamInfo,
cuGraphMemsetNodeGetParams, cuGraphMemcpyNodeGetParams). Each kernel parameter is scanned word by
word for candidate addresses (pointers also hide in structs, as in TensorIterator's arguments). A
kernel whose parameters cannot be read keeps the reason (GraphNode.unreadable): which call failed
and how, or which launch form it used. A call the driver refuses outright raises GraphReadError
naming the call and its CUresult. Nodes come in capture order (creation order).
"""

import ctypes
import struct
from dataclasses import dataclass

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
    8: "ext_semas_signal",
    9: "ext_semas_wait",
    10: "mem_alloc",
    11: "mem_free",
    12: "batch_mem_op",
    13: "conditional",
}
# node kinds that move bytes; the others (empty, events, ...) only order
MEMORY_KINDS = ("kernel", "memcpy", "memset")


@dataclass
class GraphNode:
    index: int
    kind: str  # kernel | memcpy | memset | empty | event_record | ...
    name: str
    pointers: list  # device addresses found in its parameters
    params_read: int = -1  # kernels: parameters the driver described (0: cuFuncGetParamInfo gave none)
    unreadable: str = None  # kernels whose parameters could not be read: the call that failed and how

    @property
    def blind(self):
        """A kernel whose pointers are unknown (not: known to touch nothing recorded)."""
        return self.kind == "kernel" and (self.unreadable is not None or self.params_read == 0)


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
        words, nparams, why = _kernel_words(cu, func, p)
        return GraphNode(i, kind, (name.value or b"?").decode(), words, nparams, why)
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
    """Every 8-byte word of every kernel parameter (candidate device addresses), how many parameters
    were read, and why none could be (None when read). kernelParams: each parameter's size from
    cuFuncGetParamInfo (where the context function has no parameter info, cuKernelGetParamInfo on the
    library kernel); extra: the CU_LAUNCH_PARAM_BUFFER_POINTER buffer, its size from
    CU_LAUNCH_PARAM_BUFFER_SIZE."""
    blobs, why = [], None
    if p.kernelParams:
        getters = [("cuFuncGetParamInfo", func)]
        if p.kern:  # a library kernel: its own parameter info, where the function has none
            getters.append(("cuKernelGetParamInfo", ctypes.c_void_p(p.kern)))
        errors = []
        for call, handle in getters:
            k = 0
            while True:
                off, size = ctypes.c_size_t(), ctypes.c_size_t()
                try:
                    cu(call, handle, ctypes.c_size_t(k), ctypes.byref(off), ctypes.byref(size))
                except GraphReadError as e:
                    if "INVALID_VALUE" not in str(e) and "is not in this driver" not in str(e):
                        raise
                    if k == 0:  # no parameter info at all (or no parameter): say which call, how
                        errors.append(f"{e} for parameter 0")
                    break  # else: past the last parameter
                blobs.append(ctypes.string_at(p.kernelParams[k], size.value))
                k += 1
            if blobs:
                break
        if not blobs:
            why = "kernelParams set but no parameter described: " + "; ".join(errors)
    elif p.extra:
        buf, size, e, i = None, None, p.extra, 0
        while i < 16 and e[i]:  # (key, value) pairs up to CU_LAUNCH_PARAM_END (0)
            if e[i] == 1:  # CU_LAUNCH_PARAM_BUFFER_POINTER
                buf = e[i + 1]
            elif e[i] == 2:  # CU_LAUNCH_PARAM_BUFFER_SIZE: a pointer to the size
                size = ctypes.cast(e[i + 1], ctypes.POINTER(ctypes.c_size_t))[0]
            i += 2
        if buf and size:
            blobs.append(ctypes.string_at(buf, size))
        else:
            why = f"launched with `extra` but no parameter buffer and size in it (keys read: {i // 2})"
    else:
        why = "neither kernelParams nor extra in its node parameters"
    words = []
    for b in blobs:
        words += [struct.unpack_from("<Q", b, o)[0] for o in range(0, len(b) - 7, 8)]
    return words, len(blobs), why


def read_graph(g):
    """The RawGraph of a captured graph: a SimGraph, or a torch CUDAGraph made with keep_graph=True."""
    if hasattr(g, "raw_cuda_graph"):
        return from_cuda(g.raw_cuda_graph())
    return from_sim(g)
