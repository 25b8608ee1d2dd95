"""The capture audit: every race kind across streams, the reuse race, no false alarm on synchronised
code, clean failure, and the decode model's configurations (hazard iff bf16 + transient + overlap on)."""

import pytest
import torch
from miniature import N, reuse_race_step
from models import TINY

from nblib.backends.sim import SimCaptureError, SimDevice
from nblib.engine.model import DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.instruments import audit
from nblib.instruments.audit import trace


def _kinds(rep):
    return sorted((h.kind, h.first.name, h.first.stream, h.second.name, h.second.stream) for h in rep.hazards)


# ------------------------------------------------------------------------------------------------
# the three hazard kinds, on persistent memory (no allocator involved), and their synchronised twins
# ------------------------------------------------------------------------------------------------


def _pattern(dev, order, sync):
    """Two ops on bytes of x, one per stream; order: which runs first on the host and what it does."""
    side = dev.Stream()
    x = torch.zeros(N)

    def fn():
        main = dev.current_stream()
        side.wait_stream(main)
        first, second, lead = order
        for i, (stream, what) in enumerate(
            ((main, first), (side, second)) if lead == "main" else ((side, first), (main, second))
        ):
            with dev.stream(stream):
                if what == "w":
                    x.fill_(float(i + 1))
                else:
                    y = x * 2  # noqa: F841  reads x
            if i == 0 and sync:
                _sync(dev, sync, stream, side if stream is main else main)
        main.wait_stream(side)

    return fn


def _sync(dev, how, done, waiter):
    """Order `waiter`'s later work after `done`'s work so far."""
    if how == "wait_stream":
        waiter.wait_stream(done)
    elif how == "event":
        ev = dev.Event()
        ev.record(done)
        ev.wait(waiter)
    elif how == "record_event":
        waiter.wait_event(done.record_event())


@pytest.mark.parametrize("first_stream", ["main", "side"])
@pytest.mark.parametrize(
    "order,kind",
    [(("w", "r"), "read-after-write"), (("r", "w"), "write-after-read"), (("w", "w"), "write-after-write")],
)
def test_each_race_kind_across_streams_is_reported(order, kind, first_stream):
    dev = SimDevice()
    rep = audit.audit_capture(_pattern(dev, order + (first_stream,), None), device=dev)
    assert not rep.ok and len(rep.hazards) == 1, str(rep)
    h = rep.hazards[0]
    assert h.kind == kind and h.first.stream == first_stream and h.second.stream != first_stream
    assert h.nbytes == N * 4 and not h.reused and h.first_access.alloc is None  # persistent x
    assert "fill_" in (h.first.name + h.second.name)
    assert any("x.fill_" in fr_line for fr_line in [trace.site(op.stack) for op in (h.first, h.second)])


@pytest.mark.parametrize("sync", ["wait_stream", "event", "record_event"])
@pytest.mark.parametrize("order", [("w", "r", "main"), ("r", "w", "side"), ("w", "w", "side")])
def test_synchronised_accesses_are_not_reported(order, sync):
    dev = SimDevice()
    rep = audit.audit_capture(_pattern(dev, order, sync), device=dev)
    assert rep.ok, str(rep)
    assert rep.ops >= 2 and str(rep).endswith("no cross-stream race")


def test_reads_on_two_streams_do_not_race():
    dev = SimDevice()
    rep = audit.audit_capture(_pattern(dev, ("r", "r", "main"), None), device=dev)
    assert rep.ok


def test_sync_on_the_wrong_pair_of_streams_does_not_hide_a_race():
    dev = SimDevice()
    side, other = dev.Stream(), dev.Stream()
    x = torch.zeros(N)

    def fn():
        main = dev.current_stream()
        side.wait_stream(main)
        other.wait_stream(main)
        with dev.stream(side):
            x.fill_(1.0)
        other.wait_stream(side)  # other is ordered after side, main is not
        y = x * 2  # noqa: F841
        main.wait_stream(side)
        main.wait_stream(other)

    rep = audit.audit_capture(fn, device=dev)
    assert [h.kind for h in rep.hazards] == ["read-after-write"]


# ------------------------------------------------------------------------------------------------
# the reuse race: allocated on main, used on side, freed before the join, reused on main
# ------------------------------------------------------------------------------------------------


def race(dev, fix=None):
    side = dev.Stream()
    x = torch.linspace(-1, 1, N)

    def fn():
        r, _, _ = reuse_race_step(dev, side, x, fix)
        return r * 1

    if fix == "persistent":
        buf = torch.empty(N)  # made before capture, outside the graph pool

        def fn():  # noqa: F811
            main = dev.current_stream()
            side.wait_stream(main)
            torch.mul(x, 2, out=buf)
            side.wait_stream(main)
            with dev.stream(side):
                r = buf + (x + 3).exp()
            u = torch.empty(N)
            u.fill_(-100.0)
            main.wait_stream(side)
            return r * 1

    return fn


def test_reuse_race_names_both_allocations_with_their_sites():
    dev = SimDevice(seed=1)
    rep = audit.audit_capture(race(dev), device=dev)
    assert len(rep.hazards) == 1, str(rep)
    h = rep.hazards[0]
    assert h.kind == "write-after-read" and h.reused
    assert (h.first.name, h.first.stream, h.second.name, h.second.stream) == (
        "aten::add",
        "side",
        "aten::fill_",
        "main",
    )
    r = h.row()
    assert r["first_tensor"].startswith("t (") and r["second_tensor"].startswith("u (")
    assert "t = x * 2" in r["first_alloc"] and "del t" in r["first_free"]
    assert "u = torch.empty(N)" in r["second_alloc"]
    assert h.first_access.alloc.stream == "main" and h.first_access.alloc.op == "aten::mul"
    text = str(rep)
    assert "freed, then reused" in text and "del t" in text and "r = t + pre" in text
    assert rep.rows() == [r] and rep.rows("tensors")[0]["first_tensor"] == r["first_tensor"]


@pytest.mark.parametrize("fix", ["join", "side_alloc", "record_stream", "persistent"])
def test_reuse_race_fixes_are_clean(fix):
    dev = SimDevice(seed=1)
    rep = audit.audit_capture(race(dev, fix), device=dev)
    assert rep.ok, str(rep)


def test_the_audit_does_not_perturb_the_capture():
    """Same seed, with and without the recorder: the same nodes, bytes and replay results."""

    def run(audited):
        dev = SimDevice(seed=3)
        fn = race(dev)
        if audited:
            rep = audit.audit_capture(fn, device=dev)
            g, out = rep.graph, rep.result
        else:
            g = dev.CUDAGraph()
            with dev.graph(g):
                out = fn()
        ids = {}  # addresses by first appearance: the same sharing of bytes
        nodes = [
            (
                n.op,
                n.stream.name,
                n.deps,
                [(ids.setdefault(a.addr, len(ids)), a.nbytes, a.kind) for a in n.accesses],
            )
            for n in g.nodes
        ]
        res = []
        for _ in range(40):
            g.replay()
            res.append(out.clone())
        return nodes, torch.stack(res)

    (n1, r1), (n2, r2) = run(False), run(True)
    assert n1 == n2 and torch.equal(r1, r2)


def test_vector_clocks_agree_with_graph_reachability():
    dev = SimDevice()
    m = DecodeModel(ModelConfig(**TINY, index_dtype="bf16", overlap="on"), dev)
    with audit.recording(dev) as rec:
        Runner(m, [2], "graph").capture(record=rec)
    tr = rec.captures[0]
    audit.happens_before(tr)
    nodes = tr.graph.nodes
    reach = []
    for n in nodes:
        r = {n.index}
        for d in n.deps:
            r |= reach[d]
        reach.append(r)
    ops = tr.ops
    assert {op.stream for op in ops} == {"main", "side"}
    for a in ops:
        for b in ops:
            if a.index < b.index:
                assert audit.ordered(a, b) == (a.index in reach[b.index]), (a, b)


# ------------------------------------------------------------------------------------------------
# failure: nothing half-finished, the error names the op
# ------------------------------------------------------------------------------------------------


def test_a_raising_capture_leaves_nothing_behind_and_names_the_op():
    dev = SimDevice()
    before = dev.current_stream()
    side = dev.Stream()

    def bad():
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            torch.ones(2, 3) @ torch.ones(2, 3)

    with pytest.raises(audit.AuditCaptureError, match=r"capturing .*bad failed.*aten\.mm"):
        audit.audit_capture(bad, device=dev)
    assert not dev.is_capturing() and dev.current_stream() is before
    # torch._C._len_torch_dispatch_stack: private, no public API (tests/test_private_api.py)
    assert torch._C._len_torch_dispatch_stack() == 0
    assert dev.capture_hooks == []

    def boom():
        torch.ones(3) * 2
        raise ValueError("boom")

    with pytest.raises(
        audit.AuditCaptureError, match=r"boom failed at test_audit.py:\d+ in boom: ValueError: boom"
    ):
        audit.audit_capture(boom, device=dev)
    assert not dev.is_capturing() and dev.current_stream() is before
    rep = audit.audit_capture(race(dev, "join"), device=dev)  # the next capture works
    assert rep.ok and rep.ops > 0


def test_a_failed_capture_inside_a_recording_is_skipped_and_counted():
    dev = SimDevice()
    with audit.recording(dev) as rec:
        with pytest.raises(SimCaptureError), dev.graph(dev.CUDAGraph()):
            torch.ones(2, 3) @ torch.ones(2, 3)
        with dev.graph(dev.CUDAGraph()):
            torch.ones(3) * 2
    rep = rec.report()
    assert rep.ok and len(rep.traces) == 1 and rep.incomplete == 1 and "not audited" in rep.summary()


# ------------------------------------------------------------------------------------------------
# the decode model: hazard iff bf16 + transient + overlap on
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("overlap", ["on", "off"])
@pytest.mark.parametrize("policy", ["transient", "persistent"])
def test_model_configurations(dtype, overlap, policy):
    dev = SimDevice()
    m = DecodeModel(ModelConfig(**TINY, index_dtype=dtype, overlap=overlap, logits_policy=policy), dev)
    with audit.recording(dev) as rec:
        Runner(m, [2, 8], "graph").capture(record=rec)
    rep = rec.report(names=m.captures)
    assert [t.label["bucket"] for t in rep.traces] == [8, 2]
    racy = dtype == "bf16" and policy == "transient" and overlap == "on"
    assert rep.ok != racy, str(rep)
    if racy:
        for b, hz in rep.by("bucket").items():
            rows = audit.Report(rep.traces, hz, 0).rows("tensors")
            assert rows, f"bucket {b}: no hazard"
            for r in rows:
                assert r["first_tensor"] == "indexer.logits" and r["first_stream"] == "side"
                assert r["second_stream"] == "main" and r["second_tensor"].startswith("mlp.")
                assert "_logits_buffer" in r["first_alloc"] and "del logits" in r["first_free"]
                assert "in mlp" in r["second_alloc"] and r["reused"]
            assert {h.first.name for h in hz} >= {"csi::indexer_logits_bf16", "aten::topk"}


def test_auditing_the_largest_ci_capture_names_the_race():
    from nblib.schema import params as P

    prof = P.load(P.ROOT / "params" / "ci.yaml")
    dev = SimDevice()
    m = DecodeModel(ModelConfig(**prof["model"]), dev)
    with audit.recording(dev) as rec:
        Runner(m, [max(prof["buckets"])], "graph").capture(record=rec)
    rep = rec.report(names=m.captures)
    # the capture plus its audit is timed by notebook 03 (a figure it prints), not asserted here
    assert not rep.ok, str(rep)
    # every hazard is the race: the indexer's kernel (its write) and top-k (its read) on the side
    # stream against main-stream ops whose tensors got the freed logits' bytes
    assert {(h.first.name, h.first.stream, h.second.stream) for h in rep.hazards} == {
        ("csi::indexer_logits_bf16", "side", "main"),
        ("aten::topk", "side", "main"),
    }
    kinds = {(h.first.name, h.kind) for h in rep.hazards}
    assert {k for op, k in kinds if op == "aten::topk"} == {"write-after-read"}  # top-k only reads
    assert {k for op, k in kinds if op != "aten::topk"} == {"write-after-write", "read-after-write"}
    assert all(h.reused and h.bucket == max(prof["buckets"]) for h in rep.hazards)
    rows = rep.rows("tensors")
    assert {r["first_tensor"] for r in rows} == {"indexer.logits"}
    # made by the model, freed where the transient dies before the join
    assert all(r["first_alloc"].startswith("model.py:") and "del logits" in r["first_free"] for r in rows)
    assert "mlp.up" in {r["second_tensor"] for r in rows}  # the MLP's transient, as in the campaign


# ------------------------------------------------------------------------------------------------
# the CUDA path: its pure-Python parts here, the rest on a GPU
# ------------------------------------------------------------------------------------------------


def test_triton_launch_tensors_come_from_the_documented_launch_metadata():
    """Raw Triton launches: tensors only from Triton's launch metadata (what a kernel's
    launch_metadata function returns), never from Triton's frames."""
    # LazyDict: Triton-internal, the launch hook's argument type (tests/test_private_api.py)
    from triton.compiler.compiler import LazyDict

    t, u, v = torch.ones(3), torch.zeros(2), torch.ones(1)
    md = LazyDict({"name": "k", "function": 0, "stream": 7})
    assert trace.cuda.launch_tensors(md.get()) == []  # declares nothing: the audit says so
    md.add(
        lambda grid, meta, args: {"x": args["x"], "ys": [args["y"], 3], "n": args["n"]},
        ((1,), {}, dict(x=t, y=u, n=5)),
    )
    got = trace.cuda.launch_tensors(md.get())
    assert len(got) == 2 and got[0] is t and got[1] is u and not any(x is v for x in got)


def _cuda_race(fix=None):
    side = torch.cuda.Stream()
    x = torch.linspace(-1, 1, 1 << 20, device="cuda")
    torch.cuda.synchronize()

    def fn():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        t = x * 2
        side.wait_stream(main)
        with torch.cuda.stream(side):
            r = t + (x + 3).exp()
        if fix == "record_stream":
            t.record_stream(side)
        if fix == "join":
            main.wait_stream(side)
        del t
        u = torch.empty_like(x)
        u.fill_(-100.0)
        main.wait_stream(side)
        return r * 1, u

    return fn


@pytest.mark.gpu
def test_cuda_reuse_race_is_named():
    from nblib.backends.device import get

    dev = get("cuda")
    rep = audit.audit_capture(_cuda_race(), device=dev)
    assert any(h.reused and h.first.stream == "side" and h.second.stream == "main" for h in rep.hazards), str(
        rep
    )
    r = next(h for h in rep.hazards if h.reused).row()
    assert "t = x * 2" in r["first_alloc"] and "del t" in r["first_free"]


@pytest.mark.gpu
@pytest.mark.parametrize("fix", ["join", "record_stream"])
def test_cuda_fixes_are_clean(fix):
    from nblib.backends.device import get

    dev = get("cuda")
    rep = audit.audit_capture(_cuda_race(fix), device=dev)
    assert rep.ok, str(rep)


# TINY with the MLP's first transient (bs x ffn, bf16) exactly as large as the logits (bs x max_ctx,
# fp32): freed on the main stream right before it, the logits' block is the caching allocator's best
# fit for it in every bucket, so the alias forms by construction (the simulator's allocator agrees)
ALIASING = dict(TINY, ffn=2 * TINY["max_ctx"])


@pytest.mark.gpu
def test_cuda_model_configurations():
    from nblib.backends.device import get

    dev = get("cuda")
    for dtype, overlap, policy in [
        ("bf16", "on", "transient"),
        ("bf16", "off", "transient"),
        ("bf16", "on", "persistent"),
        ("bf16", "on", "record_stream"),
        ("fp8", "on", "transient"),
    ]:
        cfg = ModelConfig(**ALIASING, index_dtype=dtype, overlap=overlap, logits_policy=policy)
        runner = Runner(DecodeModel(cfg, dev), [2, 8], "graph")
        with audit.recording(dev) as rec:
            runner.capture(record=rec)
        rep = rec.report(names=runner.model.captures)
        if dtype == "bf16" and policy == "transient" and overlap == "on":
            # the alias formed in both buckets, and the audit names the race in both
            formed = {(a["bucket"], a["first"], a["second"]) for a in runner.aliases()}
            assert {(2, "indexer.logits", "mlp.up"), (8, "indexer.logits", "mlp.up")} <= formed, formed
            assert sorted(rep.by("bucket")) == [2, 8], str(rep)
            # the rows name the block by the tensor that reused it (on the H200 both sides read
            # "mlp.up": the CUDA recorder names bytes by their latest allocation); the aliases
            # above name the freed logits, from the model's own address notes
            assert {r["second_tensor"] for r in rep.rows("tensors")} == {"mlp.up"}, str(rep)
        else:
            assert rep.ok, (dtype, overlap, policy, str(rep))
        # torch._C._len_torch_dispatch_stack: private, no public API (tests/test_private_api.py)
        assert torch._C._len_torch_dispatch_stack() == 0


def test_the_aliasing_model_forms_its_alias_on_the_simulator():
    """ALIASING's premise, on the simulator's caching allocator: the MLP's first transient takes the
    freed logits' block whole, in every bucket."""
    runner = Runner(DecodeModel(ModelConfig(**ALIASING), SimDevice()), [2, 8], "graph")
    runner.capture()
    got = sorted((a["bucket"], a["first"], a["second"], a["shared_bytes"]) for a in runner.aliases())
    assert got == [
        (2, "indexer.logits", "mlp.up", 2 * 4 * 1024),
        (8, "indexer.logits", "mlp.up", 8 * 4 * 1024),
    ]


def test_the_triton_topk_in_the_model_gives_the_same_step_and_the_same_race():
    """topk_kernel "triton" calls csi::topk_indices (the Triton kernel on CUDA, its reference here):
    the step's output and indices equal torch.topk's, and the race is still named (the freed logits
    block is read by the new top-k node instead of aten::topk)."""
    from nblib.engine.build import full_batch

    outs, reps = {}, {}
    for kernel in ("torch", "triton"):
        dev = SimDevice()
        m = DecodeModel(ModelConfig(**TINY, topk_kernel=kernel), dev)
        tok, table, lens, stores = full_batch(m, 2, ctx=300)
        outs[kernel] = m.step(tok, table, lens, stores)
        with audit.recording(dev) as rec:
            Runner(m, [2], "graph").capture(record=rec)
        reps[kernel] = rec.report(names=m.captures)
    assert all(torch.equal(a, b) for a, b in zip(outs["torch"], outs["triton"]))
    assert not reps["torch"].ok and not reps["triton"].ok
    assert "csi::topk_indices" in {h.first.name for h in reps["triton"].hazards}
    with pytest.raises(ValueError, match="unknown topk kernel 'cub': choose one of torch, triton"):
        ModelConfig(**TINY, topk_kernel="cub")


@pytest.mark.gpu
def test_cuda_model_with_the_triton_topk_replays_what_torch_topk_computes():
    """On CUDA, csi::topk_indices is the Triton kernel: captured in the decode graph (overlap off,
    so no race can interfere), its replay gives the indices torch.topk gives eagerly."""
    from nblib.backends.device import get
    from nblib.engine.build import full_batch

    dev = get("cuda")
    got = {}
    for kernel, mode in (("torch", "eager"), ("triton", "graph")):
        m = DecodeModel(ModelConfig(**TINY, topk_kernel=kernel, overlap="off"), dev)
        batch = full_batch(m, 8, ctx=700)
        runner = Runner(m, [8], mode)
        if mode == "graph":
            runner.capture()
        got[kernel] = runner.run(*batch)[1].cpu()
    assert torch.equal(got["torch"], got["triton"])
