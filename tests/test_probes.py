"""Named probe points (nblib.instruments.probes) on the simulator: probe() does nothing outside a
differential; inside one, every design compares each replay's probes with one eager run from the
same state, catches a side stream's read that main's write overtook, stays equal on the fixed form,
and leaves the user's state as it was. The references here are written by hand: the eager value of
a probe is x * 2 computed in the test, not read from the library."""

import sys

import pytest
import torch

from nblib.backends.sim import SimDevice
from nblib.core.paths import ROOT
from nblib.instruments.probes import DESIGNS, Differential, probe

N = 4096


def war(dev, racy=True):
    """The side stream reads x while main refills it; racy: main does not wait for the read first.
    Each replay starts from x = 1, so the side's y = 2 * x is 2 everywhere when the read wins."""
    x, y, side = torch.ones(N), torch.zeros(N), dev.Stream()

    def step():
        x.fill_(1.0)
        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            y.copy_(probe("side.read", x) * 2)
        if not racy:
            main.wait_stream(side)
        x.fill_(5.0)
        main.wait_stream(side)

    step.x, step.y = x, y
    return step


def test_probe_is_the_identity_and_records_nothing_outside_a_differential():
    t = torch.arange(4.0)
    assert probe("anything", t) is t


@pytest.mark.parametrize("design", DESIGNS)
def test_each_design_catches_the_natural_race_at_its_probe_and_the_fix_stays_equal(design):
    dev = SimDevice(seed=3)
    rep = Differential(dev, design).run(war(dev), replays=20)
    (p,) = rep.probes
    assert p.name == "side.read" and rep.hazards >= 1
    if design == "refs":  # the graph's own x: read after the replay, it holds main's 5, never 1
        assert p.differing == 20
    else:  # some replays read x after main's fill: 5 where eager read 1. The probe's copy is a kernel
        # of its own, before the multiply on the side stream: when it reads 5, so does the multiply
        assert 0 < p.differing <= rep.output.differing and p.max_abs == 4.0
    fixed = Differential(dev, design).run(war(dev, racy=False), replays=20)
    assert fixed.hazards == 0 and fixed.output.differing == 0
    if design != "refs":
        assert fixed.probes[0].differing == 0


def test_the_users_state_is_left_as_it_was():
    dev = SimDevice()
    step = war(dev)
    step.y.fill_(7.0)
    Differential(dev).run(step, replays=3)
    assert torch.equal(step.y, torch.full((N,), 7.0))


def test_a_bad_design_or_replay_count_is_one_line():
    with pytest.raises(ValueError, match="unknown probe design 'clone'"):
        Differential(SimDevice(), "clone")
    with pytest.raises(ValueError, match="replays must be at least 1"):
        Differential(SimDevice()).run(lambda: None, replays=0)


def test_the_moe_targets_probe_the_shared_experts_input_in_every_layer():
    sys.path.insert(0, str(ROOT / "examples" / "audit"))
    try:
        import hf_moe
    finally:
        sys.path.remove(str(ROOT / "examples" / "audit"))
    dev = SimDevice()
    rep = Differential(dev).run(hf_moe.qwen2_moe_record_stream(dev), replays=3)
    assert [p.name for p in rep.probes] == ["layer0.shared_expert.in", "layer1.shared_expert.in"]
    assert rep.hazards == 0 and all(p.differing == 0 for p in rep.probes) and rep.output.differing == 0
