"""The suite's lane plan: a notebook that reads another's results runs after it, in the same lane."""

import pytest

from nblib.run import suite

NOTEBOOKS = list(suite.NOTEBOOKS)


def _lane_of(plan, name):
    [lane] = [lane for lane in plan if name in lane]
    return lane


@pytest.mark.parametrize("lanes", [2, 3, 8])
def test_03_runs_after_00_in_the_same_lane(lanes):
    lane = _lane_of(suite.lane_plan(NOTEBOOKS, lanes), "03_stream_overlap")
    assert lane.index("00_reproduce") < lane.index("03_stream_overlap")


def test_the_plan_names_what_03_reads():
    assert suite.NEEDS == {"03": "00"}


def test_each_needer_follows_its_need_in_the_lane_that_holds_the_need():
    lanes = (("a", "c"), ("b",))
    assert suite.with_needs(lanes, {"x": "a", "y": "b"}) == (("a", "x", "c"), ("b", "y"))


def test_lanes_without_needs_stay_as_given():
    assert suite.with_needs((("a", "b"), ("c",)), {}) == (("a", "b"), ("c",))
