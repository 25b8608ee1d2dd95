"""nblib.instruments.overhead: how many untimed replays come before the timed ones, the batches an
instrument's cost is timed on, and both canaries timed as notebook 02 times them."""

import pytest
from models import CANARY

from nblib.backends.sim import SimDevice
from nblib.instruments import overhead
from nblib.schema import params as P


class Cuda:
    name = "cuda"


def test_warm_up_replays_are_the_cuda_count_on_cuda_and_one_on_the_simulator_unless_given():
    """A simulator warm-up costs as much as a timed replay and settles nothing but the first
    call's allocations; CUDA keeps each timing's own count (clocks and caches settle)."""
    assert overhead.warmups(SimDevice(), None, cuda=10) == 1
    assert overhead.warmups(Cuda(), None, cuda=10) == 10 and overhead.warmups(Cuda(), None, cuda=3) == 3
    assert overhead.warmups(SimDevice(), 4, cuda=10) == 4 and overhead.warmups(Cuda(), 0, cuda=10) == 0


def test_an_instruments_cost_is_timed_on_batches_of_timing_ctx_entries_a_request():
    shapes = P.load(P.ROOT / "params" / "ci.yaml")["model"]
    cost = overhead.replay_times(SimDevice(), shapes, 2, replays=2, instruments=("neither",), ctx=320)
    assert [r["ctx"] for r in cost] == [320]


def test_notebook_02_times_both_canaries_and_refuses_a_bad_list():
    """overhead.replay_times times the eager and the graphed canary in notebook 02, and a bad list
    fails in one line before anything is built."""
    from nblib.backends import device
    from nblib.instruments import overhead

    made = []  # each canary replay_times builds, by kind

    class Eager(overhead.Canary):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(("canary", self))

    class Graphed(overhead.GraphedCanary):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(("canary_graphed", self))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(overhead, "Canary", Eager)
        mp.setattr(overhead, "GraphedCanary", Graphed)
        rows = overhead.replay_times(
            device.get("sim"), CANARY, 2, replays=2, warmup=1
        )  # as notebook 02 calls it
    by = {r["instrument"]: r for r in rows}
    assert rows[0]["instrument"] == "neither" and rows[0]["calls"] == 0 and rows[0]["ratio"] is None
    assert [kind for kind, _ in made] == ["canary", "canary_graphed"]
    for kind, inst in made:  # each canary checked every timed and warm-up replay, and its row says so
        assert by[kind]["calls"] == len(inst.records) == 2 + 1
        assert by[kind]["ratio"] == pytest.approx(by[kind]["median_ms"] / rows[0]["median_ms"])
    with pytest.raises(ValueError, match="instruments must start with 'neither'"):
        overhead.replay_times(None, {}, 2, instruments=("canary", "neither"))
    with pytest.raises(ValueError, match="instruments must start with 'neither'"):
        overhead.replay_times(None, {}, 2, instruments=("neither", "canry"))
