"""nblib.engine.workload: the scheduler admits, retires and brings sessions back (by steps or by a
tool call's duration), batches pad to buckets, each step's replay is wrapped in the instruments and
judged against its reference, the verdicts count sessions and steps, and a step's inputs reach the
device packed in one copy."""

import math
from types import SimpleNamespace

import pytest
import torch

from nblib.backends import device
from nblib.engine.runner import SCRATCH_SLOT, Runner, bucket_for
from nblib.engine.workload import (
    Replayed,
    Scheduler,
    WorkloadConfig,
    bad_rows,
    build_batch,
    in_bucket,
    inputs_to_device,
    pack,
    replay_step,
    run_sessions,
    unpack,
    verdicts,
)

W = dict(
    sessions=6,
    rounds=2,
    concurrency=4,
    ctx_min=64,
    ctx_max=600,
    turn_ctx=64,
    out_min=4,
    out_max=9,
    think_min=1,
    think_max=3,
)


class Perturbing(Runner):
    """Test double: corrupts one row of one chosen step, to see the verdicts count it."""

    def __init__(self, *a, bad_step, **k):
        super().__init__(*a, **k)
        self.bad_step, self.n = bad_step, 0

    def run(self, *args):
        out, topk, b = super().run(*args)
        if self.n == self.bad_step:
            topk = topk.clone()
            topk[0, 0] += 1
        self.n += 1
        return out, topk, b


def test_verdicts_count_a_diverged_step(tiny_model):
    clean = run_sessions(Runner(tiny_model, [1, 2, 4], "eager"), WorkloadConfig(**W))
    assert clean["corrupted_sessions"] == 0 and clean["corrupted_steps"] == 0 and clean["steps"] > 10
    bad = run_sessions(Perturbing(tiny_model, [1, 2, 4], "eager", bad_step=5), WorkloadConfig(**W))
    assert bad["corrupted_steps"] == 1 and bad["corrupted_sessions"] == 1
    assert bad["corrupted_ids"] == [bad["step_log"][5]["sessions"][0]]


def test_continuous_batching_pads_to_buckets(tiny_model):
    r = run_sessions(Runner(tiny_model, [1, 2, 4], "eager"), WorkloadConfig(**W))
    assert all(s["bs"] <= 4 and s["bucket"] == bucket_for(s["bs"], [1, 2, 4]) for s in r["step_log"])
    assert {s["bs"] for s in r["step_log"]} >= {1, 4}  # the batch really fills and drains
    served = {}
    for s in r["step_log"]:
        for sid in s["sessions"]:
            served[sid] = served.get(sid, 0) + 1
    assert sorted(served) == list(range(W["sessions"]))


def test_in_bucket_counts_only_the_steps_replayed_in_that_bucket():
    # a concurrency-8 run whose tail (2 sessions left) replays bucket 2, where the only bad row is
    log = [
        dict(bucket=8, sessions=[0, 1, 2], bad_rows=0, rows=[0, 0, 0]),
        dict(bucket=8, sessions=[0, 1, 2], bad_rows=0, rows=[0, 0, 0]),
        dict(bucket=2, sessions=[1, 2], bad_rows=1, rows=[0, 1]),
    ]
    r = dict(step_log=log)
    assert in_bucket(r, 8) == dict(
        sessions=3, corrupted_sessions=0, steps=2, corrupted_steps=0, tail_steps=1, tail_corrupted_steps=1
    )
    assert in_bucket(r, 2) == dict(
        sessions=2, corrupted_sessions=1, steps=1, corrupted_steps=1, tail_steps=2, tail_corrupted_steps=0
    )


def _stub_model(max_ctx=4096, num_pages=200):
    """What the scheduler and the batcher use of a model: its sizes and prefill (recorded)."""
    m = SimpleNamespace(prefilled=[], dev=SimpleNamespace(torch_device=torch.device("cpu")))
    m.cfg = SimpleNamespace(max_ctx=max_ctx, num_pages=num_pages, vocab=1000)
    m.prefill_entries = lambda slots, gen: m.prefilled.append(slots.tolist())
    return m


def test_scheduler_admits_up_to_concurrency_and_brings_sessions_back_after_thinking():
    w = WorkloadConfig(**{**W, "sessions": 3, "concurrency": 2, "think_min": 2, "think_max": 2})
    m = _stub_model()
    sched = Scheduler(m, 64, w, torch.Generator())
    batch = sched.next_batch()
    assert [s.sid for s in batch] == [0, 1] and [s.sid for s in sched.waiting] == [2]
    assert [len(p) for p in m.prefilled] == [s.first_ctx for s in batch]  # each first prompt prefilled
    assert all(sched.tables[s.sid, : len(s.pages)].tolist() == s.pages for s in batch)
    assert sched.live_pages() == {p for s in batch for p in s.pages}
    first = batch[0]
    for _ in range(first.outs[0]):  # decode session 0's whole first round (session 1 alongside)
        sched.retire([first])
    assert first not in sched.active and first in sched.thinking and first.round == 1
    assert [s.sid for s in sched.next_batch()] == [1, 2]  # its slot goes to the waiting session
    assert first in sched.thinking  # one of its two think steps left
    sched.next_batch()
    assert first in sched.waiting and len(m.prefilled) == 3  # back, waiting for a slot


def test_scheduler_gives_the_pages_back_after_the_last_round():
    w = WorkloadConfig(**{**W, "sessions": 1, "rounds": 1})
    sched = Scheduler(_stub_model(), 64, w, torch.Generator())
    free = len(sched.pool.free)
    (s,) = sched.next_batch()
    assert len(sched.pool.free) == free - len(s.pages) and s.pages
    for _ in range(s.outs[0]):
        sched.retire([s])
    assert not sched.busy() and s.pages == [] and len(sched.pool.free) == free
    assert not sched.tables.any()


def _timed_rounds(step_ms, think_ms=10.0, steps=60):
    """Two sessions, concurrency 2: A decodes 1 token a round and thinks think_ms between rounds,
    B decodes all along (the engine is never idle). Each step takes step_ms on the engine's clock.
    Returns the batch size of each step."""
    w = WorkloadConfig(
        sessions=2, rounds=1000, concurrency=2, ctx_min=64, ctx_max=64, turn_ctx=0, out_min=1, out_max=1,
        think_ms_min=think_ms, think_ms_max=think_ms,
    )  # fmt: skip
    sched = Scheduler(_stub_model(num_pages=4000), 4000, w, torch.Generator())
    a, b = sched.waiting[0], sched.waiting[1]
    b.outs = [10**6] * w.rounds  # B never leaves the batch
    sizes = []
    for _ in range(steps):
        batch = sched.next_batch()
        sizes.append(len(batch))
        sched.retire(batch, step_ms / 1e3)
    assert a.round > 0 and b.round == 0
    return sizes


@pytest.mark.parametrize("step_ms", [3.0, 6.0])
def test_a_timed_tool_call_comes_back_after_the_steps_its_duration_spans(step_ms):
    """A tool call of 10 ms comes back at the first step boundary at or after its end: after
    ceil(10 / 3) = 4 steps of 3 ms, after ceil(10 / 6) = 2 steps of 6 ms; so a session that decodes
    one token a round is in 1 step of 5, or of 3: the slower step makes more sessions decode
    together, by 1/3 - 1/5 of a session a step."""
    sizes = _timed_rounds(step_ms)
    sits_out = math.ceil(10.0 / step_ms)
    want = [2 if i % (sits_out + 1) == 0 else 1 for i in range(len(sizes))]
    assert sizes == want
    assert sum(sizes) / len(sizes) == pytest.approx(1 + 1 / (sits_out + 1), abs=0.02)


def test_when_every_session_is_out_on_a_tool_call_the_engine_idles_until_the_first_returns():
    w = WorkloadConfig(
        **{**W, "sessions": 2, "rounds": 2, "out_min": 2, "out_max": 2}, think_ms_min=5, think_ms_max=50
    )
    sched = Scheduler(_stub_model(), 64, w, torch.Generator())
    for _ in range(2):
        sched.retire(sched.next_batch(), 0.001)
    assert not sched.active and len(sched.thinking) == 2 and sched.now == pytest.approx(0.002)
    back = min(s.back_at for s in sched.thinking)
    batch = sched.next_batch()
    assert sched.now == back and len(batch) == 1  # the clock ran to the first return, not beyond
    assert back == pytest.approx(0.002 + min(s.think_s[1] for s in batch + sched.thinking))
    assert all(0.005 <= t <= 0.05 for s in batch + sched.thinking for t in s.think_s)


def test_a_timed_workload_draws_what_the_step_counted_one_does_and_its_durations_after():
    counted = Scheduler(_stub_model(), 64, WorkloadConfig(**W), torch.Generator())
    timed = Scheduler(
        _stub_model(), 64, WorkloadConfig(**W, think_ms_min=1, think_ms_max=9), torch.Generator()
    )
    for c, t in zip(counted.waiting, timed.waiting):
        assert (c.first_ctx, c.outs, c.thinks) == (t.first_ctx, t.outs, t.thinks)
    with pytest.raises(ValueError, match="need 0 <= think_ms_min <= think_ms_max"):
        WorkloadConfig(**W, think_ms_min=5, think_ms_max=2)


def test_on_the_simulator_each_timed_step_moves_the_clock_by_its_replays_span():
    """The step's time is the timing model's span of its graph's replay, which the clock's events
    read (the replay's own jittered schedule, the reference's replays left out), after the batch's
    inputs are copied into the graph's buffers: at most 8 small kernels, 4 copies and 4 fills."""
    from models import CANARY

    from nblib.engine import build

    model = build.model(device.get("sim"), CANARY, index_dtype="bf16", overlap="on")
    runner = Runner(model, [1, 2, 4]).capture()
    w = WorkloadConfig(**{**W, "concurrency": 4}, think_ms_min=0.01, think_ms_max=0.05)
    r = run_sessions(runner, w)
    secs = [st["seconds"] for st in r["step_log"]]
    assert all(x > 0 for x in secs)
    last = r["step_log"][-1]
    g = runner.graphs[last["bucket"]][0]
    inputs = secs[-1] - max(g.last_schedule.ends)
    assert 0 < inputs <= 8 * (runner.dev.timing.latency + 1e-9)


def test_build_batch_stores_every_fourth_token_and_takes_a_page_when_full():
    w = WorkloadConfig(**{**W, "sessions": 2, "ctx_min": 64, "ctx_max": 64})
    m = _stub_model()
    sched = Scheduler(m, 64, w, torch.Generator())
    batch = sched.next_batch()
    assert [len(s.pages) for s in batch] == [1, 1]  # 64 entries: one full page each
    for pos in range(1, 5):
        b = build_batch(m, sched.pool, sched.tables, batch)
        tokens, table, lens, stores = b.host
        assert b.sessions == [0, 1] and tokens.tolist() == [
            (sid * 7919 + pos * 104729) % 1000 for sid in (0, 1)
        ]
        if pos < 4:
            assert stores.tolist() == [SCRATCH_SLOT] * 2 and b.lens == [64, 64]
    # the fourth token: entry 64 starts a second page, and the page table row shows it
    assert [len(s.pages) for s in batch] == [2, 2] and b.lens == [65, 65] and lens.tolist() == [65, 65]
    assert stores.tolist() == [s.pages[1] * 64 for s in batch]
    assert table.tolist() == sched.tables[:2].tolist()


class _Recording:
    """Test double for a runner and its instruments: records the order of the calls."""

    def __init__(self):
        self.log, self.buckets, self.references = [], [1, 2, 4], None

    def run(self, *args):
        self.log.append("replay")
        return torch.zeros(len(args[0]), 2), torch.zeros(len(args[0]), 3, dtype=torch.int32), 4

    def reference(self, *args):
        self.log.append("reference")
        return torch.zeros(len(args[0]), 2), torch.zeros(len(args[0]), 3, dtype=torch.int32)

    def before(self, step):
        self.log.append(("before", step["index"], step["bs"], step["bucket"], step["live_pages"]))

    def after(self, step):
        self.log.append("after")


def test_replay_step_wraps_the_replay_in_the_instruments_and_replays_first():
    args = (torch.tensor([1, 2, 3]), torch.zeros(3, 4), torch.ones(3), torch.zeros(3))
    r = _Recording()
    out = replay_step(r, WorkloadConfig(), 7, args, args, [r], live_pages=lambda: {5, 6})
    assert r.log == [("before", 7, 3, 4, {5, 6}), "replay", "after", "reference"]
    assert out.bucket == 4 and out.topk.shape == (3, 3)
    r = _Recording()
    replay_step(r, WorkloadConfig(), 7, args, args, live_pages=lambda: pytest.fail("no instruments"))
    assert r.log == ["reference", "replay"]


def test_bad_rows_flags_a_topk_or_an_output_past_the_tolerance():
    ref_out = torch.tensor([[1.0, 2.0], [100.0, 0.0], [100.0, 0.0], [0.5, 0.0]])
    ref_topk = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])
    out = ref_out.clone()
    topk = ref_topk.clone()
    topk[0, 1] = 2  # another top-k set
    out[1, 0] += 2.0  # past 1e-2 of 100
    out[2, 0] += 0.5  # within 1e-2 of 100
    out[3, 1] += 0.02  # past 1e-2 of max(0.5, 1): the scale is at least 1
    r = Replayed(out, topk, 4, ref_out, ref_topk)
    assert bad_rows(r, 1e-2).tolist() == [1, 1, 0, 1]
    assert bad_rows(r._replace(out=ref_out, topk=ref_topk), 1e-2).tolist() == [0, 0, 0, 0]


def test_verdicts_split_the_flags_per_step_and_count_sessions():
    steps = [dict(bs=2, sessions=[0, 1]), dict(bs=3, sessions=[0, 1, 2]), dict(bs=1, sessions=[2])]
    pending = [torch.tensor([0, 0], dtype=torch.uint8), torch.tensor([0, 1, 0], dtype=torch.uint8)]
    pending.append(torch.tensor([1], dtype=torch.uint8))
    r = verdicts(5, steps, pending)
    assert [(st["rows"], st["bad_rows"]) for st in r["step_log"]] == [([0, 0], 0), ([0, 1, 0], 1), ([1], 1)]
    assert (r["sessions"], r["corrupted_sessions"], r["steps"], r["corrupted_steps"]) == (5, 2, 3, 2)
    assert r["corrupted_ids"] == [1, 2]
    assert verdicts(5, [], [])["corrupted_sessions"] == 0


def test_step_inputs_stay_themselves_on_the_cpu():
    from nblib.engine.workload import to_device

    x = torch.arange(6)
    assert to_device(x, torch.device("cpu")) is x


@pytest.mark.gpu
def test_step_inputs_reach_the_gpu_through_pinned_memory_without_waiting_for_queued_work():
    from nblib.engine.workload import to_device

    x = torch.arange(4096 * 40, dtype=torch.int32).view(40, 4096)
    busy = torch.randn(8192, 8192, device="cuda")
    for _ in range(20):  # queued work the copy must not wait for
        busy = busy @ busy / 8192
    y = to_device(x, torch.device("cuda"))
    queued = not torch.cuda.current_stream().query()  # the host ran ahead of the matmuls
    x.zero_()  # the host tensor changes after the call: the copy read its own pinned bytes
    assert queued and torch.equal(y.cpu(), torch.arange(4096 * 40, dtype=torch.int32).view(40, 4096))


def _step_inputs():
    # a step's inputs as build_batch makes them: int64 tokens and slots, an int32 table and lengths;
    # odd sizes, so a packed offset that ignored alignment would land off 16 bytes
    g = torch.Generator().manual_seed(0)
    return (
        torch.randint(0, 512, (3,), generator=g),
        torch.randint(0, 1200, (3, 5), generator=g, dtype=torch.int32),
        torch.randint(1, 900, (3,), generator=g, dtype=torch.int32),
        torch.randint(0, 9000, (3,), generator=g),
    )


def test_packed_inputs_come_back_with_their_values_dtypes_shapes_and_aligned():
    host = _step_inputs()
    buf, offsets = pack(host)
    views = unpack(buf.clone(), host, offsets)
    for x, v, o in zip(host, views, offsets):
        assert v.dtype == x.dtype and v.shape == x.shape and torch.equal(v, x)
        assert o % 16 == 0 and (v.data_ptr() - views[0].data_ptr()) % 16 == 0
    assert len(set(offsets)) == len(host)  # no two inputs share bytes


@pytest.mark.gpu
def test_inputs_reach_the_gpu_in_one_copy_with_their_values():
    host = _step_inputs()
    on = inputs_to_device(host, "cuda")
    assert len({v.untyped_storage().data_ptr() for v in on}) == 1  # one device buffer, one copy
    for x, v in zip(host, on):
        assert v.device.type == "cuda" and v.dtype == x.dtype and torch.equal(v.cpu(), x)


@pytest.mark.gpu
def test_on_cuda_each_timed_step_reads_its_replays_time_from_events():
    """CUDA events around the replay: every step's time is positive, under a second on this tiny
    model, and a replay of the bigger bucket takes no less than the smallest's fastest step."""
    from models import CANARY

    from nblib.engine import build

    # overlap off: with the race on, a step whose top-k input is overwritten between torch.topk's
    # select and gather passes can trip its device-side assert, and this test times steps only
    model = build.model(device.get("cuda"), CANARY, index_dtype="bf16", overlap="off")
    runner = Runner(model, [1, 2, 4]).capture()
    w = WorkloadConfig(**{**W, "concurrency": 4}, think_ms_min=0.05, think_ms_max=0.5)
    r = run_sessions(runner, w)
    secs = {b: [st["seconds"] for st in r["step_log"] if st["bucket"] == b] for b in (1, 4)}
    assert all(0 < x < 1 for xs in secs.values() for x in xs) and secs[4]
    assert min(secs[4]) >= 0.5 * min(secs[1] or secs[4])
