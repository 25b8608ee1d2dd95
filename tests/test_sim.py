"""The CPU simulator: allocator policy, capture, replay timing, and the race it must reproduce."""

import dataclasses
import glob
import json
import os
from typing import NamedTuple

import pytest
import torch
from miniature import N, reuse_race_step
from sim_steps import batches, sim_model

from kernels.indexer import PAGE
from nblib.backends.sim import MB, CachingAllocator, SimCaptureError, SimDevice, allocation_size, round_size
from nblib.backends.sim.timing import TopkGrid

A, B = "streamA", "streamB"  # the allocator used alone keys blocks by any hashable stream


# ------------------------------------------------------------------------------------------------
# allocator policy (CUDACachingAllocator defaults)
# ------------------------------------------------------------------------------------------------


def test_rounding_and_segment_sizes():
    assert [round_size(n) for n in (1, 511, 512, 513, 1000, 4096)] == [512, 512, 512, 1024, 1024, 4096]
    assert allocation_size(512) == 2 * MB and allocation_size(1 * MB) == 2 * MB  # small pool
    assert allocation_size(1 * MB + 512) == 20 * MB and allocation_size(10 * MB - 512) == 20 * MB
    assert allocation_size(10 * MB) == 10 * MB and allocation_size(11 * MB) == 12 * MB  # 2 MiB rounding


def test_small_and_large_pools_use_separate_segments():
    al = CachingAllocator()
    _, small = al.malloc(1 * MB, A)
    _, large = al.malloc(1 * MB + 1, A)
    assert small.pool.is_small and not large.pool.is_small
    assert small.segment is not large.segment
    assert [s.size for s in al.segments] == [2 * MB, 20 * MB]
    assert small.size == 1 * MB and large.size == 1 * MB + 512


def test_split_thresholds():
    al = CachingAllocator()
    _, b = al.malloc(1000, A)  # small: split when the rest is >= 512 bytes
    assert b.size == 1024 and b.next.size == 2 * MB - 1024 and not b.next.allocated
    _, c = al.malloc(19 * MB, A)  # large: 1 MiB left, not > 1 MiB: no split
    assert c.size == 20 * MB and c.next is None
    _, d = al.malloc(18 * MB + 512, A)  # 20 MiB segment, 2 MiB - 512 left: split
    assert d.size == 18 * MB + 512 and d.next.size == 2 * MB - 512
    _, e = al.malloc(12 * MB, A)  # >= 10 MiB: a segment of its own size
    assert e.size == 12 * MB and e.segment.size == 12 * MB


def test_best_fit_smallest_then_lowest_address():
    al = CachingAllocator()
    a = al.malloc(4096, A)[1]
    al.malloc(512, A)  # guards keep freed blocks from merging
    c = al.malloc(8192, A)[1]
    al.malloc(512, A)
    d = al.malloc(4096, A)[1]
    al.malloc(512, A)
    addrs = a.addr, c.addr, d.addr
    for blk in (c, d, a):
        al.free(blk)
    assert al.malloc(4000, A)[0] == addrs[0]  # two 4 KiB candidates: the lower address
    assert al.malloc(4096, A)[0] == addrs[2]
    assert al.malloc(5000, A)[0] == addrs[1]  # the only one left that fits (split, 3 KiB left)
    assert al.malloc(3072, A)[0] == addrs[1] + 5120


def test_free_blocks_are_keyed_by_allocation_stream():
    al = CachingAllocator()
    addr_a, blk = al.malloc(64 * 1024, A)
    al.free(blk)
    addr_b, _ = al.malloc(64 * 1024, B)  # B never sees A's free block: a segment of its own
    assert addr_b != addr_a and len(al.segments) == 2
    assert al.malloc(64 * 1024, A)[0] == addr_a


def test_free_merges_neighbours_back_into_the_segment():
    al = CachingAllocator()
    x, y, z = (al.malloc(4096, A)[1] for _ in range(3))
    seg = x.segment
    al.free(x)
    al.free(z)  # merges with the free tail
    assert [b.size for b in _blocks(seg)] == [4096, 4096, 2 * MB - 8192]
    al.free(y)  # merges with both neighbours
    assert [b.size for b in _blocks(seg)] == [2 * MB] and seg.head.addr == seg.addr
    assert al.malloc(3 * 4096, A)[0] == seg.addr


def _blocks(seg):
    b, out = seg.head, []
    while b is not None:
        out.append(b)
        b = b.next
    return out


def test_private_pool_is_shared_across_captures_and_kept_apart_from_others():
    al = CachingAllocator()
    al.begin_capture((0, 1))
    addr, blk = al.malloc(32 * 1024, A)
    al.free(blk)
    al.end_capture()
    assert al.malloc(32 * 1024, A)[0] != addr  # the default pool does not see private blocks
    al.begin_capture((0, 1))
    assert al.malloc(32 * 1024, A)[0] == addr  # the next capture into the same pool does
    al.end_capture()
    al.begin_capture((0, 2))
    assert al.malloc(32 * 1024, A)[0] != addr
    al.end_capture()


def test_record_stream_defers_the_free_until_capture_ends():
    al = CachingAllocator()
    al.begin_capture((0, 1))
    addr, blk = al.malloc(32 * 1024, A)
    al.record_stream(blk, B)
    al.free(blk)
    assert al.malloc(32 * 1024, A)[0] != addr  # not reusable while capturing
    al.end_capture()
    al.begin_capture((0, 1))
    assert al.malloc(32 * 1024, A)[0] == addr  # free once the capture is over
    al.end_capture()


def test_log_names_every_event():
    al = CachingAllocator()
    addr, blk = al.malloc(100, A)
    al.free(blk)
    acts = [(e["action"], e["addr"], e["size"], e["stream"]) for e in al.log]
    assert acts == [
        ("segment_alloc", addr, 2 * MB, A),
        ("alloc", addr, 100, A),
        ("free_requested", addr, 100, A),
        ("free_completed", addr, 100, A),
    ]


def replay_trace(events, pool=(0, 1)):
    """Feed a recorded (action, addr, size, stream) trace to a fresh allocator; returns
    {recorded addr of each alloc: simulated addr} per alloc, in order."""
    al = CachingAllocator()
    live, pairs = {}, []
    al.begin_capture(pool)
    for e in events:
        if e["action"] == "alloc":
            addr, blk = al.malloc(e["size"], e["stream"])
            live[e["addr"]] = blk
            pairs.append((e["addr"], addr))
        elif e["action"] == "free_requested":
            al.free(live.pop(e["addr"]))
    al.end_capture()
    return pairs


def _same_sharing(pairs):
    """Recorded and simulated addresses must agree on which allocations share bytes."""
    real = {}
    simd = {}
    for r, s in pairs:
        real.setdefault(r, set()).add(s)
        simd.setdefault(s, set()).add(r)
    return all(len(v) == 1 for v in real.values()) and all(len(v) == 1 for v in simd.values())


GPU_TRACES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "alloc_trace*.json")))


@pytest.mark.skipif(
    not GPU_TRACES,
    reason="no recorded CUDA allocator trace in tests/data (scripts/alloc_trace.py records one on a GPU)",
)
@pytest.mark.parametrize("path", GPU_TRACES)
def test_recorded_cuda_trace_replays_to_the_same_sharing(path):
    with open(path) as f:
        events = json.load(f)["events"]
    assert _same_sharing(replay_trace(events))


# ------------------------------------------------------------------------------------------------
# eager mode, streams, capture errors
# ------------------------------------------------------------------------------------------------


def test_eager_runs_in_program_order_as_plain_cpu_torch():
    dev = SimDevice()
    s = dev.Stream()
    x = torch.arange(6.0)
    with dev.stream(s):
        assert dev.current_stream() is s and not dev.is_current_stream_capturing()
        y = x * 2
        x.add_(1)  # after y: y still sees the old x
    dev.current_stream().wait_stream(s)
    assert dev.current_stream() is dev.default_stream
    assert torch.equal(y, torch.arange(6.0) * 2) and torch.equal(x, torch.arange(6.0) + 1)
    assert not dev.arena.chunks and not dev.allocator.log  # nothing went through the arena
    dev.synchronize()


def test_capture_runs_nothing_and_replay_writes_persistent_tensors():
    dev = SimDevice()
    cache = torch.zeros(4)
    src = torch.ones(4)
    g = dev.CUDAGraph()
    with dev.graph(g):
        assert dev.is_current_stream_capturing()
        cache.add_(src * 3)
    assert not dev.is_current_stream_capturing()
    assert torch.equal(cache, torch.zeros(4))  # real capture runs nothing
    g.replay()
    g.replay()
    assert torch.equal(cache, torch.full((4,), 6.0))


def test_a_raising_capture_leaves_nothing_half_finished():
    dev = SimDevice()
    before = dev.current_stream()
    x = torch.ones(3)
    g = dev.CUDAGraph()
    with pytest.raises(SimCaptureError, match="_local_scalar_dense"), dev.graph(g):
        if (x * 2).sum() > 0:  # a data-dependent branch: a host sync
            pass
    assert not dev.is_current_stream_capturing() and dev.current_stream() is before
    # torch._C._len_torch_dispatch_stack: private, no public API (tests/test_private_api.py)
    assert torch._C._len_torch_dispatch_stack() == 0  # the mode was popped
    assert torch.equal(x * 2, torch.full((3,), 2.0))  # no dispatch mode left behind
    with pytest.raises(RuntimeError, match="not captured"):
        g.replay()
    with pytest.raises(ValueError, match="boom"), dev.graph(dev.CUDAGraph()):
        raise ValueError("boom")
    assert not dev.is_capturing() and dev.current_stream() is before
    g2 = dev.CUDAGraph()  # and the next capture works
    with dev.graph(g2):
        y = x + 1
    g2.replay()
    assert torch.equal(y, torch.full((3,), 2.0))


def test_op_errors_name_the_op():
    dev = SimDevice()
    with pytest.raises(SimCaptureError, match="aten.mm"), dev.graph(dev.CUDAGraph()):
        torch.ones(2, 3) @ torch.ones(2, 3)


def test_streams_must_join_and_be_joined():
    dev = SimDevice()
    side = dev.Stream()
    x = torch.ones(8)
    with (
        pytest.raises(SimCaptureError, match="not part of the capture"),
        dev.graph(dev.CUDAGraph()),
        dev.stream(side),
    ):
        x * 2
    with pytest.raises(SimCaptureError, match="not joined"), dev.graph(dev.CUDAGraph()):
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            x * 2
    assert not dev.is_capturing()


def test_events_order_streams():
    dev = SimDevice()
    side = dev.Stream()
    x = torch.arange(4.0)
    g = dev.CUDAGraph()
    with dev.graph(g):
        main = dev.current_stream()
        y = x * 2
        e = main.record_event()
        side.wait_event(e)
        with dev.stream(side):
            z = y + 1
        e2 = dev.Event()
        e2.record(side)
        e2.wait(main)
        out = z * 1
    mul, add, out_node = g.nodes
    assert add.stream is side and add.deps == (mul.index,) and add.index in out_node.deps
    g.replay()
    assert torch.equal(out, x * 2 + 1)


def test_a_copy_streams_its_rows_in_order_over_its_run():
    """A 64-row copy of 64 MB on the side stream (about 48 us under the H200 calibration) and, unordered
    with it on the main stream, two writes of one row each into its source, ending 1.3 and 2.6 us in:
    the copy is done with row 0 at 0.75 us, before the first lands, and reads row 63 long after the
    second, so its row 0 holds the old bytes and its row 63 the new ones, replay after replay. A copy
    that read every row at its end would see both writes."""
    dev = SimDevice()
    side = dev.Stream()
    src = torch.zeros(64, 1 << 18)
    g = dev.CUDAGraph()
    with dev.graph(g):
        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            copy = src.clone()
        src[0].fill_(1.0)
        src[63].fill_(1.0)
        main.wait_stream(side)
        out = copy * 1
    for _ in range(20):
        src.zero_()
        g.replay()
        assert out[0].eq(0).all() and out[63].eq(1).all()


# ------------------------------------------------------------------------------------------------
# the race: a main-stream transient consumed on the side stream and freed before the join
# ------------------------------------------------------------------------------------------------


def race(dev, fix=None, replays=200, lead=2):
    """The engine's pattern in miniature. Returns (the two addresses, [side result correct?])."""
    side = dev.Stream()
    x = torch.linspace(-1, 1, N)
    g = dev.CUDAGraph()
    with dev.graph(g, pool=dev.graph_pool_handle()):
        r, t_addr, u = reuse_race_step(dev, side, x, fix, lead)
        out = r * 1
    expected = x * 2 + (x + 3).exp()
    ok = []
    for _ in range(replays):
        g.replay()
        ok.append(torch.equal(out, expected))
    return (t_addr, u.data_ptr()), ok


def test_race_aliases_and_corrupts_intermittently():
    # a main-stream lead as long as the side's work before its read: a tie the measured jitter decides
    (t_addr, u_addr), ok = race(SimDevice(seed=1))
    assert t_addr == u_addr  # the freed block went to the next main-stream tensor
    assert 0 < sum(ok) < len(ok), f"{sum(ok)}/{len(ok)} replays correct: expected some of each"


@pytest.mark.parametrize("lead,expect", [(0, "never"), (4, "always")])
def test_race_is_decided_by_the_main_streams_lead(lead, expect):
    """A kernel reads over its whole run: the side's read of the freed bytes ends after its second
    op. With no lead the main stream's write lands first every time; with a long one, never."""
    _, ok = race(SimDevice(seed=1), lead=lead)
    assert sum(ok) == (0 if expect == "never" else len(ok)), f"{sum(ok)}/{len(ok)} correct with lead {lead}"


@pytest.mark.parametrize("fix", ["join", "side_alloc", "record_stream"])
def test_race_fixes_are_always_right(fix):
    (t_addr, u_addr), ok = race(SimDevice(seed=1), fix)
    assert all(ok)
    if fix != "join":
        assert t_addr != u_addr


def test_same_seed_same_bits():
    def run(seed):
        dev = SimDevice(seed=seed)
        side = dev.Stream()
        x = torch.linspace(-1, 1, N)
        g = dev.CUDAGraph()
        with dev.graph(g):
            t = x * 2
            side.wait_stream(dev.current_stream())
            with dev.stream(side):
                r = t + (x + 3).exp()
            del t
            u = x.sin() * 7
            dev.current_stream().wait_stream(side)
            out = r + u.mean()
        res, sched = [], []
        for _ in range(30):
            g.replay()
            res.append(out.clone())
            sched.append(g.last_schedule)
        return torch.stack(res), sched

    (a, sa), (b, sb), (_, sc) = run(5), run(5), run(6)
    assert torch.equal(a, b) and sa == sb
    assert sa != sc  # the jitter follows the seed


def test_timeline_overlaps_concurrent_branches():
    dev = SimDevice()
    side = dev.Stream()
    x = torch.ones(1024)
    g = dev.CUDAGraph()
    with dev.graph(g):
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            a = x * 2
        b = x * 3
        dev.current_stream().wait_stream(side)
        _c = a + b
    g.replay()
    starts, ends = g.last_schedule
    assert starts[0] == starts[1] == 0.0 and starts[2] == max(ends[0], ends[1])


def _side_clone_schedule(**timing):
    dev = SimDevice()
    dev.timing = dataclasses.replace(dev.timing, **timing)
    side = dev.Stream()
    x = torch.ones(1 << 20)
    g = dev.CUDAGraph()
    with dev.graph(g):
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            _a = x.clone()  # node 0, side: 8 MB moved
        _b = x * 3  # node 1, main
        dev.current_stream().wait_stream(side)
    g.replay()
    return dev.timing, g.last_schedule


def test_a_probe_can_make_side_stream_clones_free_or_latency_only_and_nothing_else():
    tm, (starts, ends) = _side_clone_schedule()
    assert ends[0] - starts[0] > 8 * MB / tm.bandwidth * 0.5  # a copy of 8 MB, under some jitter
    _, (starts, ends) = _side_clone_schedule(free_side_ops=("aten.clone.default",))
    assert ends[0] == starts[0] and ends[1] > starts[1]  # the main stream's multiply keeps its time
    tm, (starts, ends) = _side_clone_schedule(free_side_ops=("aten.clone.default",), free_side_bytes=True)
    assert 0 < ends[0] - starts[0] < 2 * tm.latency


# ------------------------------------------------------------------------------------------------
# the decode model end to end
# ------------------------------------------------------------------------------------------------


def _divergent_steps(**knobs):
    from nblib.engine.runner import Runner

    gen = torch.Generator().manual_seed(0)
    m = sim_model(gen, **knobs)
    r = Runner(m, [1, 2, 4, 8]).capture()
    bad = {}
    for b in r.buckets:
        bad[b] = 0
        for args in batches(15, b, gen):
            ro, rk = r.reference(*args)
            o, k, _ = r.run(*args)
            bad[b] += int(not (torch.equal(o, ro) and torch.equal(k, rk)))
    return r, bad


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_model_replay_equals_eager_without_overlap(dtype):
    r, bad = _divergent_steps(index_dtype=dtype, overlap="off")
    assert sum(bad.values()) == 0, bad
    assert all(len(g.nodes) > 20 for g, _, _ in r.graphs.values())


def test_model_overlap_fp8_and_persistent_stay_clean():
    for knobs in (dict(index_dtype="fp8"), dict(logits_policy="persistent")):
        r, bad = _divergent_steps(overlap="on", **knobs)
        assert not r.aliases() and sum(bad.values()) == 0, (knobs, bad)


def test_model_overlap_bf16_transient_aliases_and_diverges():
    r, bad = _divergent_steps(overlap="on")
    assert {a["first"] for a in r.aliases()} == {"indexer.logits"}
    assert sum(bad.values()) > 0, bad


def _overlaps(spans):
    """Index pairs (i, j) of allocations whose byte ranges overlap (at any time in the trace)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    found, open_ = set(), []
    for i in order:
        lo, hi = spans[i]
        open_ = [j for j in open_ if spans[j][1] > lo]
        found.update((min(i, j), max(i, j)) for j in open_)
        open_.append(i)
    return found


@pytest.mark.skipif(not GPU_TRACES, reason="no recorded CUDA allocator trace in tests/data")
@pytest.mark.parametrize("path", GPU_TRACES)
def test_recorded_cuda_trace_same_overlapping_pairs_and_the_cross_stream_alias(path):
    with open(path) as f:
        trace = json.load(f)
    # torch.cuda.graph's own 8-byte RNG-state tensors are made before capture begins, in the
    # default pool, not the graph's: keep what the decode step itself allocated
    events, outside = [], set()
    for e in trace["events"]:
        if e["action"] == "alloc" and not any(f.startswith(("model.py", "indexer.py")) for f in e["frames"]):
            outside.add(e["addr"])
        elif e["addr"] in outside and e["action"] in ("free_requested", "free_completed"):
            if e["action"] == "free_completed":
                outside.discard(e["addr"])
        elif e["action"] != "segment_alloc":
            events.append(e)
    allocs = [e for e in events if e["action"] == "alloc"]
    pairs = replay_trace(events)
    real = _overlaps([(e["addr"], e["addr"] + e["size"]) for e in allocs])
    sim = _overlaps([(s, s + e["size"]) for (_, s), e in zip(pairs, allocs)])
    assert real == sim and len(real) > 100
    # the recorded capture has the alias the reproducer names: logits and the MLP share bytes
    assert {(a["bucket"], a["first"], a["second"]) for a in trace["aliases"]} >= {
        (64, "indexer.logits", "mlp.up")
    }


# ------------------------------------------------------------------------------------------------
# the timing model is the H200's, measured, and the indexer's duration follows this replay's contexts
# ------------------------------------------------------------------------------------------------


def test_the_simulator_times_replays_with_the_committed_h200_calibration():
    import json

    from nblib.backends.sim.timing import CALIBRATION, Timing
    from nblib.core.paths import ROOT

    assert CALIBRATION == ROOT / "params" / "calibration" / "h200.json"
    rec = json.loads(CALIBRATION.read_text())
    assert "H200" in rec["device"] and len(rec["commit"]) >= 7  # a measurement, with its provenance
    t = SimDevice().timing
    c = rec["timing"]
    assert (t.latency, t.bandwidth, t.program_bandwidth, t.sigma) == (
        c["latency_s"],
        c["bandwidth_Bps"],
        c["program_bandwidth_Bps"],
        c["sigma"],
    )
    assert t == Timing.calibrated() and t.source == str(CALIBRATION)


class PagedCall(NamedTuple):
    """An indexer call on two requests of one page each, captured on the simulator: replays read
    `lens`, so growing the second request shows what a longer context costs."""

    dev: object
    graph: object
    lens: torch.Tensor
    run: object  # captures the same call again, into a given graph


def _paged_call(op, cache, q, pages):
    dev = SimDevice()
    heads = q.shape[1]
    w = torch.rand(2, heads)
    table = torch.arange(pages, dtype=torch.int32).view(2, -1)
    lens = torch.tensor([64, 64], dtype=torch.int32)
    out = torch.empty(2, pages // 2 * PAGE)

    def run(g):
        with dev.graph(g):
            op(q, w, cache, table, lens, out, 1)
        return g

    return PagedCall(dev, run(dev.CUDAGraph()), lens, run)


def _longer_costs(call):
    """Simulated seconds the second request's growth from 64 to 1024 entries adds to a replay."""
    short = call.graph.expected_seconds()
    call.lens.copy_(torch.tensor([64, 1024], dtype=torch.int32))  # the static input a replay reads
    return call.graph.expected_seconds() - short


def test_the_indexers_simulated_time_follows_the_longest_request():
    from kernels import indexer as kx

    dim, pages = 128, 40
    cache = torch.randn(pages, kx.PAGE, dim).to(torch.bfloat16)
    q = torch.randn(2, 2, dim).to(torch.bfloat16)
    call = _paged_call(kx.indexer_logits_bf16, cache, q, pages)
    tm = call.dev.timing
    assert _longer_costs(call) == pytest.approx((1024 - 64) * dim * 2 / tm.program_bandwidth, rel=1e-9)


def test_the_simulator_times_paged_ops_by_their_registered_roles(monkeypatch):
    """The fp8 op's entry is D bytes + a 4-byte scale (kernels.ops.OP_ROLES says so, not its name);
    an op without roles is timed by the bytes it moves, like any other."""
    from kernels import indexer as kx
    from nblib.backends.sim import capture

    dim, pages = 128, 40
    kpages = kx.quantize_fp8_pages(torch.randn(pages, kx.PAGE, dim))
    q = torch.randn(2, 2, dim).to(torch.float8_e4m3fn)
    call = _paged_call(kx.indexer_logits_fp8, kpages, q, pages)
    (node,) = [n for n in call.graph.nodes if n.op.startswith("csi.")]
    bandwidth = call.dev.timing.program_bandwidth
    assert _longer_costs(call) == pytest.approx((1024 - 64) * (dim + 4) / bandwidth, rel=1e-9)
    assert node.cost is not None
    monkeypatch.setattr(capture, "_ROLES", {})
    g2 = call.run(call.dev.CUDAGraph())
    assert all(n.cost is None for n in g2.nodes)


def _topk_graph(dev, rows, cols, k):
    x = torch.randn(rows, cols)
    g = dev.CUDAGraph()
    with dev.graph(g):
        torch.topk(x, k, dim=-1)
    return g


def test_a_top_k_node_lasts_what_the_calibration_measured_for_its_shape_and_the_nearest_k():
    """torch.topk is several kernels on a GPU, so its node is timed by the measured grid of the nearest
    k (on a log scale), not by its bytes: at a measured shape, the measured seconds; between two
    measured row counts, on the straight line between them in log rows; beyond the grid, its edge.
    A call over fewer rows may last longer (as torch.topk's on an H200); with no grid, its bytes."""
    dev = SimDevice()
    k16 = TopkGrid(16, (1, 8, 32), (4096, 65536), ((90e-6, 300e-6), (40e-6, 120e-6), (60e-6, 150e-6)))
    k512 = TopkGrid(512, (1, 32), (4096,), ((200e-6,), (250e-6,)))
    dev.timing = dataclasses.replace(dev.timing, topk=(k16, k512))
    assert _topk_graph(dev, 8, 4096, 16).expected_seconds() == pytest.approx(40e-6)
    assert _topk_graph(dev, 1, 65536, 16).expected_seconds() == pytest.approx(300e-6)
    assert _topk_graph(dev, 1, 4096, 48).expected_seconds() == pytest.approx(90e-6)  # 48 is nearer 16
    assert _topk_graph(dev, 1, 4096, 300).expected_seconds() == pytest.approx(200e-6)
    # 16 rows: halfway between 8 and 32 on a log2 scale (3 -> 4 -> 5)
    assert _topk_graph(dev, 16, 4096, 16).expected_seconds() == pytest.approx(50e-6)
    assert _topk_graph(dev, 64, 1 << 20, 16).expected_seconds() == pytest.approx(150e-6)
    dev.timing = dataclasses.replace(dev.timing, topk=())
    nbytes = 8 * 4096 * 4
    moved = nbytes + 8 * 16 * (4 + 8)  # the input, the values and the int64 indices
    assert _topk_graph(dev, 8, 4096, 16).expected_seconds() == pytest.approx(
        dev.timing.latency + moved / dev.timing.bandwidth
    )


def test_an_eager_top_k_takes_its_stream_as_long_as_its_replayed_node():
    dev = SimDevice()
    dev.timing = dataclasses.replace(dev.timing, topk=(TopkGrid(16, (8,), (4096,), ((40e-6,),)),))
    x = torch.randn(8, 4096)
    with dev.eager_timing():
        t0 = dev.streams.latest()
        torch.topk(x, 16, dim=-1)
        assert dev.streams.latest() - t0 == pytest.approx(40e-6)
