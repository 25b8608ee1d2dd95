"""The cross-check of the audit against the graph as built, on graphs shaped like the H200's
(checks-acd46e6/audit-zoo): blind cuBLAS nodes (no parameter described), op-internal kernels,
memset nodes, a real path, an op with no node. CPU only: the simulator's graphs, read "as CUDA"
(matched through pointers and stream chains, not node i = op i), then altered."""

import ctypes

import pytest

from nblib.backends.device import get
from nblib.backends.sim import SimDevice
from nblib.instruments import audit, audit_graph, audit_zoo, graph_read
from nblib.instruments.graph_read import GraphNode, RawGraph
from nblib.studies import overlap

UNREADABLE = (
    "kernelParams set but no parameter described: cuFuncGetParamInfo returned 1 (CUDA_ERROR_INVALID_VALUE)"
)


def zoo_capture(name, race):
    """(trace, hazards, RawGraph as read from CUDA) of one zoo scenario on the simulator."""
    dev = SimDevice(seed=1)
    [case] = [c for c in audit_zoo.CASES if c.name == name]
    rep = audit.audit_capture(case.build(dev, race)[0], device=dev, keep_graph=True)
    sim = audit_graph.read_graph(rep.graph)
    return rep.traces[0], rep.hazards, RawGraph(sim.nodes, list(sim.edges), "CUDA driver (as read)")


def blind(node):
    node.pointers, node.params_read, node.unreadable = [], 0, UNREADABLE


def test_the_driver_call_that_leaves_a_kernel_blind_is_named():
    """_kernel_words on a fake driver: parameters are read through cuFuncGetParamInfo; where it
    describes none, the node keeps the refusal (call and CUresult) instead of '0 params'."""
    arg = ctypes.c_uint64(0x7F00_0000_1000)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    p = graph_read._Kernel()
    p.kernelParams = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))

    def described(name, func, k, off, size):
        if k.value > 0:
            raise graph_read.GraphReadError(f"{name} returned 1 (CUDA_ERROR_INVALID_VALUE)")
        size._obj.value = 8

    def refused(name, *a):
        raise graph_read.GraphReadError(f"{name} returned 1 (CUDA_ERROR_INVALID_VALUE)")

    assert graph_read._kernel_words(described, None, p) == ([0x7F00_0000_1000], 1, None)
    words, n, why = graph_read._kernel_words(refused, None, p)
    assert (words, n) == ([], 0) and "cuFuncGetParamInfo returned 1" in why and "parameter 0" in why
    assert GraphNode(0, "kernel", "nvjet", words, n, why).blind


def test_a_blind_node_is_matched_by_its_place_on_its_stream():
    tr, _, raw = zoo_capture("missing_wait", race=False)
    writer = next(n for n in raw.nodes if "fill_" in n.name)
    blind(writer)
    cc = audit_graph.crosscheck(tr, [], raw)
    assert cc.agree and not cc.lacking and not cc.undecidable
    assert cc.blind == [f"{writer.name} (node {writer.index}): {UNREADABLE}"]
    assert len(cc.by_order) == 1 and "aten::fill_" in cc.by_order[0] and UNREADABLE in cc.by_order[0]


def test_a_hazard_on_a_blind_node_is_confirmed_by_ordering():
    """No path between the two nodes: confirmed, marked 'by ordering; pointers unreadable'."""
    tr, hz, raw = zoo_capture("missing_wait", race=True)
    blind(next(n for n in raw.nodes if "fill_" in n.name))
    cc = audit_graph.crosscheck(tr, hz, raw)
    assert cc.agree and len(cc.confirmed) == 1 and cc.confirmed == cc.confirmed_by_order
    assert "by ordering; pointers unreadable" in cc.confirmed[0] and not cc.contradicted


def test_a_path_contradicts_a_hazard_even_through_a_blind_node():
    tr, hz, raw = zoo_capture("missing_wait", race=True)
    writer = next(n for n in raw.nodes if "fill_" in n.name)
    reader = next(n for n in raw.nodes if "mul" in n.name)
    blind(writer)
    raw.edges.append((writer.index, reader.index))
    cc = audit_graph.crosscheck(tr, hz, raw)
    assert not cc.agree and not cc.confirmed and len(cc.contradicted) == 1
    assert f"path node {writer.index} -> {reader.index}" in cc.contradicted[0]
    assert "matched by its place on its stream" in cc.contradicted[0]


def test_a_hazard_on_an_op_the_graph_lacks_is_undecidable():
    """The writer's node gone (as for an op that launched nothing the graph kept): neither confirmed
    nor contradicted, but undecidable, naming the op; the op is lacking."""
    tr, hz, raw = zoo_capture("missing_wait", race=True)
    [reader] = [n for n in raw.nodes if "mul" in n.name]
    raw = RawGraph([GraphNode(0, "kernel", reader.name, reader.pointers, 1)], [], raw.source)
    cc = audit_graph.crosscheck(tr, hz, raw)
    assert not cc.agree and not cc.confirmed and not cc.contradicted
    assert (
        len(cc.undecidable) == 1 and "undecidable, aten::fill_ (op 0) has no graph node" in cc.undecidable[0]
    )
    assert len(cc.lacking) == 1 and "aten::fill_" in cc.lacking[0]


def test_a_memset_node_is_its_ops_node():
    tr, hz, raw = zoo_capture("missing_wait", race=True)
    writer = next(n for n in raw.nodes if "fill_" in n.name)
    writer.kind, writer.name = "memset", "memset"
    cc = audit_graph.crosscheck(tr, hz, raw)
    assert cc.agree and len(cc.confirmed) == 1 and not cc.confirmed_by_order and not cc.by_order


def test_an_op_internal_kernel_is_neither_blind_nor_lacking():
    """A kernel on a temporary the recorder never saw (sort's arange) joins its op's run."""
    tr, hz, raw = zoo_capture("missing_wait", race=True)
    w = next(n.index for n in raw.nodes if "fill_" in n.name)
    r = next(n.index for n in raw.nodes if "mul" in n.name)
    nodes = [GraphNode(0, "kernel", "fill", raw.nodes[w].pointers, 1)]
    nodes += [
        GraphNode(1, "kernel", "arange", [0xDEAD_0000], 3),
        GraphNode(2, "kernel", "mul", raw.nodes[r].pointers, 1),
    ]
    cc = audit_graph.crosscheck(tr, hz, RawGraph(nodes, [(1, 2)], raw.source))
    assert cc.agree and len(cc.confirmed) == 1 and "node 1/2" in cc.confirmed[0]
    assert cc.internal == ["arange (node 1, 3 params read)"] and not cc.blind


# ------------------------------------------------------------------------------------------------
# the decode model's capture, shaped like the H200's graph (bucket 8, bf16, transient logits)
# ------------------------------------------------------------------------------------------------

TINY = dict(heads=4, dim=32, topk=16, max_ctx=1024, d_model=256, ffn=1024, num_pages=64, vocab=512)
TINY.update(trunk_layers=2, trunk_width=256, indexer_programs=1)


@pytest.fixture(scope="module")
def model_capture():
    dev = get("sim")
    rep, runner, _ = overlap.audit_model(dev, TINY, [8], "bf16", "on", "transient", keep_graph=True)
    [tr] = rep.traces
    return tr, rep.hazards, audit_graph.read_graph(runner.graphs[8][0])


def as_h200(tr, sim):
    """The simulator's graph as the H200 showed it: every aten::mm a cuBLAS nvjet node with no
    parameter described, and aten::sort preceded by an arange kernel on a temporary."""
    ops = {op.index: op for op in tr.ops}
    nodes, edges, span = [], [], {}
    for n in sim.nodes:
        op = ops[n.index]
        first = len(nodes)
        if op.name == "aten::sort":
            nodes.append(GraphNode(first, "kernel", "arange_cuda_out", [0xDEAD_0000], 3))
        k = len(nodes)
        if op.name == "aten::mm":
            nodes.append(GraphNode(k, "kernel", "nvjet_sm90_tst_64x8", [], 0, UNREADABLE))
        else:
            nodes.append(GraphNode(k, "kernel", n.name, list(n.pointers), 1))
        edges += [(first, k)] if first != k else []
        span[n.index] = (first, k)
    edges += [(span[a][1], span[b][0]) for a, b in sim.edges]
    return RawGraph(nodes, edges, "CUDA driver (as read)")


def test_the_model_capture_with_blind_cublas_nodes_agrees(model_capture):
    """Before: mm's nvjet nodes unreadable, each mm took its consumer's node and left silu/mm ops
    lacking (the H200's 'lacking 11'). Now each op gets its own node and every hazard is decided."""
    tr, hz, sim = model_capture
    raw = as_h200(tr, sim)
    cc = audit_graph.crosscheck(tr, hz, raw)
    pairs = {(h.first.index, h.second.index) for h in hz}
    assert pairs and not cc.lacking and not cc.contradicted and not cc.undecidable and not cc.missed
    assert len(cc.confirmed) == len(pairs) and cc.confirmed_by_order and cc.agree
    assert cc.by_order and all(x.startswith("aten::mm") for x in cc.by_order)
    assert cc.internal == [
        f"arange_cuda_out (node {n.index}, 3 params read)" for n in raw.nodes if n.name.startswith("arange")
    ]
    silu = [line for line in cc.confirmed if "aten::silu" in line]
    for line in silu:  # each silu on its own node (named by the simulator aten.silu...)
        k = int(line.split("aten::silu (op ")[1].split("node ")[1].split(")")[0])
        assert "silu" in raw.nodes[k].name


def test_a_real_join_in_the_model_graph_contradicts_with_its_path(model_capture):
    """An edge from the indexer's node to the first trunk layer norm: those hazards become
    contradicted, each naming the path; the pairs it does not order stay confirmed."""
    tr, hz, sim = model_capture
    raw = as_h200(tr, sim)
    idx = next(n.index for n in raw.nodes if "indexer_logits" in n.name)
    ln = next(n.index for n in raw.nodes if "layer_norm" in n.name)
    raw.edges.append((idx, ln))
    cc = audit_graph.crosscheck(tr, hz, raw)
    assert cc.contradicted and all("csi::indexer_logits_bf16" in x for x in cc.contradicted)
    assert all(f"path node {idx} -> {ln}" in x for x in cc.contradicted)
    assert any("aten::topk" in x for x in cc.confirmed) and not cc.agree
