"""The simulator's eager timing (nblib.backends.sim.eager_timing): under dev.eager_timing() each eager
kernel occupies its stream for latency + bytes moved / bandwidth, streams overlap unless a wait
orders them, and events read their stream's time. References below are the calibration's numbers
and the bytes each op moves, counted by hand."""

import pytest
import torch

from nblib.backends import device
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, run_sessions
from nblib.instruments.overhead import timer

N = 1 << 20  # fp32 elements: 4 MB a tensor


@pytest.fixture()
def dev():
    return device.get("sim")


def _copy_seconds(dev, nbytes_each):
    """y.copy_(x) reads x and writes y: two extents of nbytes_each."""
    t = dev.timing
    return t.latency + 2 * nbytes_each / t.bandwidth


def _elapsed(dev, work):
    """Seconds between events around `work`, its eager kernels timed (the instruments' timer)."""
    return timer(dev)[1](work) / 1e3


def test_eager_kernels_on_one_stream_add_up(dev):
    x, y = torch.ones(N), torch.empty(N)
    seconds = _elapsed(dev, lambda: [y.copy_(x) for _ in range(3)])
    assert seconds == pytest.approx(3 * _copy_seconds(dev, 4 * N))


def test_kernels_on_two_streams_overlap_and_a_wait_orders_them(dev):
    x, y, z = torch.ones(N), torch.empty(N), torch.empty(N)
    side = dev.Stream()
    one = _copy_seconds(dev, 4 * N)

    def fork(join_first):
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            z.copy_(x)
        if join_first:
            dev.current_stream().wait_stream(side)
        y.copy_(x)
        dev.current_stream().wait_stream(side)

    assert _elapsed(dev, lambda: fork(False)) == pytest.approx(one)  # side and main at once
    assert _elapsed(dev, lambda: fork(True)) == pytest.approx(2 * one)  # main waited for side


def test_views_and_bare_allocations_take_no_time_and_outside_the_block_nothing_is_timed(dev):
    x = torch.ones(N)
    assert _elapsed(dev, lambda: (x.view(2, -1), torch.empty(N))) == 0.0
    start, end = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
    start.record()
    torch.ones(N).add_(1)
    end.record()
    assert start.elapsed_time(end) == 0.0


def test_a_timed_workloads_eager_steps_batch_as_its_replays_do(dev):
    """Each step moves the engine's clock by its modelled time in both modes, so tool calls span
    about as many steps and about as many sessions decode together; with eager steps lasting no
    time, every session would decode on its own (one session a step)."""
    from models import CANARY

    from nblib.engine import build

    model = build.model(dev, CANARY, index_dtype="bf16", overlap="on")
    w = WorkloadConfig(
        sessions=8, rounds=3, ctx_min=64, ctx_max=256, turn_ctx=64, out_min=3, out_max=6,
        think_min=1, think_max=2, think_ms_min=0.01, think_ms_max=0.05, concurrency=4,
    )  # fmt: skip
    steps = {}
    for mode in ("graph", "eager"):
        r = run_sessions(Runner(model, [1, 2, 4], mode).capture(), w)
        steps[mode] = r["step_log"]
        assert all(st["seconds"] > 0 for st in r["step_log"])
    mean_bs = {m: sum(s["bs"] for s in log) / len(log) for m, log in steps.items()}
    assert mean_bs["eager"] > 1.5
    assert mean_bs["eager"] == pytest.approx(mean_bs["graph"], rel=0.35)


def test_the_instruments_timer_names_the_simulators_time_and_counts_its_eager_kernels(dev):
    """What notebooks 02 and 04 time on the simulator is labelled as simulated, never as a GPU's,
    and an instrument's eager work around a replay is part of it."""
    from nblib.publish import caveats

    method, measure = timer(dev)
    x, y = torch.ones(N), torch.empty(N)
    assert measure(lambda: y.copy_(x)) == pytest.approx(1e3 * _copy_seconds(dev, 4 * N))
    assert not caveats.gpu_time(method)
    assert caveats.timing_label(method).startswith("simulated")
