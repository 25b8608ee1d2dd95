"""The matcher's dynamic programme (numpy, one (j, j2) matrix per op) against its plain-Python reference
(tests/graph_match_reference.py) on synthetic CUDA-shaped captures: the same runs per op, the same
unclaimed and reused nodes, to the last tie."""

import graph_match_reference as reference
import numpy as np
import pytest
from graph_match_cases import random_case

from nblib.instruments.audit import graph_match
from nblib.instruments.audit.trace.records import Access


@pytest.mark.parametrize("block", range(8))
def test_the_matcher_agrees_with_the_reference_on_random_captures(block):
    for seed in range(block * 50, block * 50 + 50):
        ops, raw = random_case(seed)
        assert graph_match.match(ops, raw) == reference.match(ops, raw), f"seed {seed}"


def test_a_cuda_sized_capture_agrees():
    ops, raw = random_case(7, m=120)
    assert graph_match.match(ops, raw) == reference.match(ops, raw)


def test_the_cases_exercise_ties_order_matches_and_leftovers():
    """The cases hold what could tell the two apart: runs matched by order, ops without nodes, unclaimed
    and reused nodes, and at least one case where the earliest of equal scores decides."""
    hows, unclaimed, reused = set(), 0, 0
    for seed in range(200):
        got = reference.match(*random_case(seed))
        hows |= {o.how for o in got.ops.values()}
        unclaimed, reused = unclaimed + len(got.unclaimed), reused + len(got.reused)
    assert hows == {"pointers", "order", "none"} and unclaimed and reused


def test_a_changed_tie_break_is_caught(monkeypatch):
    """Taking the last (not the first) j of equal scores changes some case's match."""
    first = np.argmax

    def last(a, axis):
        return a.shape[axis] - 1 - first(np.flip(a, axis), axis=axis)

    monkeypatch.setattr(graph_match.np, "argmax", last)
    assert any(graph_match.match(*random_case(s)) != reference.match(*random_case(s)) for s in range(200))


def test_recorded_bytes_wider_than_int64_agree():
    """Accesses from near 0 to near 2**64 (compared as Python ints, not int64) match as the reference."""
    for seed in range(40):
        ops, raw = random_case(seed)
        if ops and raw.nodes:
            ops[0].accesses.append(Access(0x10, 64, "r", "x"))
            ops[-1].accesses.append(Access(0xFFFF_FFFF_FFFF_FF00, 64, "r", "x"))
            raw.nodes[-1].pointers.append(0xFFFF_FFFF_FFFF_FF10)
            assert graph_match.match(ops, raw) == reference.match(ops, raw), f"seed {seed}"
