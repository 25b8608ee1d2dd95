"""nblib.core.phases: nested phases are exclusive and add up to the wall time, a phase's end
synchronizes except while capturing (and never per step), an unknown phase fails in one line, and a
finished results.json records the phases."""

import json

import pytest

from nblib.backends import device
from nblib.core import phases
from nblib.core.results import Results


def test_nested_phases_are_exclusive_and_add_up_to_the_wall_time():
    clock = phases.PhaseClock()
    with clock.phase("capture"):
        sum(range(200_000))
        with clock.phase("replays"):
            sum(range(200_000))
    wall = clock.wall()
    rows = {r.name: r for r in clock.times(wall)}
    assert set(rows) == {"capture", "replays", "other"}
    assert rows["capture"].calls == rows["replays"].calls == 1
    assert sum(r.seconds for r in rows.values()) == pytest.approx(wall, abs=5e-3)


def test_unknown_phase_fails_in_one_line():
    with pytest.raises(ValueError, match="unknown phase 'replay'"), phases.PhaseClock().phase("replay"):
        pass


def test_phase_end_synchronizes_except_while_capturing():
    calls = []
    capturing = [False]
    clock = phases.PhaseClock(sync=lambda: calls.append(1), capturing=lambda: capturing[0])
    with clock.phase("timing"):
        pass
    capturing[0] = True
    with clock.phase("capture"):
        pass
    assert calls == [1]


def test_per_step_phases_never_synchronize():
    calls = []
    clock = phases.PhaseClock(sync=lambda: calls.append(1), capturing=lambda: False)
    for name in phases.PER_STEP:
        with clock.phase(name):
            pass
    assert calls == []
    with clock.phase("setup"):
        pass
    assert calls == [1]


def test_results_finish_records_the_phases(tmp_path):
    dev = device.get("sim")
    clock = phases.start()
    with clock.phase("audit"):
        sum(range(100_000))
    res = Results("01_canary", tmp_path, dev, {})
    res.finish()
    data = json.loads((tmp_path / "01_canary.results.json").read_text())
    names = [p["name"] for p in data["phases"]]
    assert names == ["audit", "other"] and data["wall_seconds"] > 0
