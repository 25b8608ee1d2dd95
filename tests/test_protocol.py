"""nblib.studies.protocol: the dispersion test over the runs, each bucket's steps pooled with their
rate and interval, seed blocks compared by their pooled counts (each against a reference computed
here), every session and step counted, and the configurations the protocol compares."""

import math

import pytest
from models import DIFFERENTIAL

from nblib.backends.device import get
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.studies import protocol
from nblib.studies.protocol import ProtocolRun


def _run(seed, k, n=40):
    return ProtocolRun(
        seed=seed,
        sessions=n,
        corrupted_sessions=k,
        steps=10,
        corrupted_steps=min(k, 10),
        rows=100,
        corrupted_rows=k,
        rows_per_corrupted_step=None,
        concurrency=n,
        buckets=[],
    )


def test_dispersion_p_is_pearsons_chi_square_over_the_runs():
    from scipy.stats import chi2

    runs = [_run(i, k) for i, k in enumerate([24, 15, 15, 0, 14])]
    pooled = sum(r.corrupted_sessions for r in runs) / 200
    stat = sum((r.corrupted_sessions - 40 * pooled) ** 2 / (40 * pooled * (1 - pooled)) for r in runs)
    assert protocol.dispersion_p(runs) == pytest.approx(chi2.sf(stat, 4), rel=1e-9)
    assert protocol.dispersion_p(runs) < 1e-4  # the over-dispersed runs the issue saw
    assert protocol.dispersion_p([_run(i, k) for i, k in enumerate([9, 7, 9, 7, 9])]) > 0.9
    assert protocol.dispersion_p([_run(i, 0) for i in range(5)]) == 1.0  # nothing to test


def test_each_buckets_steps_are_pooled_over_the_runs_with_their_rate_and_interval():
    from nblib.studies.protocol import BucketSteps

    a, b = _run(0, 3), _run(1, 5)
    a.buckets = [
        BucketSteps(bucket=8, steps=4, corrupted_steps=0),
        BucketSteps(bucket=24, steps=9, corrupted_steps=7),
    ]
    b.buckets = [
        BucketSteps(bucket=24, steps=11, corrupted_steps=9),
        BucketSteps(bucket=32, steps=5, corrupted_steps=1),
    ]
    p = protocol.summarise([a, b])
    assert [(x.bucket, x.steps, x.corrupted_steps) for x in p.bucket_steps] == [
        (8, 4, 0),
        (24, 20, 16),
        (32, 5, 1),
    ]
    (row,) = [r for r in protocol.bucket_rows(p) if r["bucket"] == 24]
    # Wilson's score interval for 16 of 20 at z = 1.96, from the textbook formula
    z, n, ph = 1.959963984540054, 20, 0.8
    mid, half = (ph + z * z / (2 * n)), z * ((ph * (1 - ph) / n + z * z / (4 * n * n)) ** 0.5)
    assert row["step_rate"] == 0.8
    assert (row["lo"], row["hi"]) == pytest.approx(
        ((mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n))
    )


def _seed_block(base, counts, n=40):
    runs = [
        protocol.ProtocolRun(
            seed=base + i,
            sessions=n,
            corrupted_sessions=k,
            steps=10,
            corrupted_steps=min(k, 10),
            rows=0,
            corrupted_rows=0,
            rows_per_corrupted_step=None,
            concurrency=8,
            buckets=[],
        )  # fmt: skip
        for i, k in enumerate(counts)
    ]
    return protocol.block(base, protocol.summarise(runs))


def test_seed_blocks_are_compared_with_each_other_by_their_pooled_counts():
    same = [_seed_block(0, [8, 10, 9]), _seed_block(100, [9, 8, 10])]
    apart = [_seed_block(0, [8, 10, 9]), _seed_block(100, [30, 28, 31])]
    # Pearson's chi-square for a 2x2 table, by hand: 27/120 against 89/120 corrupted
    a, b, c, d = 27, 93, 89, 31
    n = a + b + c + d
    chi2 = n * (a * d - b * c) ** 2 / ((a + b) * (c + d) * (a + c) * (b + d))
    assert protocol.between_blocks_p(apart) == pytest.approx(math.erfc(math.sqrt(chi2 / 2)))  # 1 dof
    assert protocol.between_blocks_p(same) > 0.5 and protocol.between_blocks_p(same[:1]) == 1.0
    said = protocol.blocks_verdict(apart)
    assert "0: 27/120" in said and "100: 89/120" in said
    assert "the blocks differ" in said and "runs 20%-25%" in said
    assert "differ no more than chance makes them differ" in protocol.blocks_verdict(same)
    rows = protocol.block_rows(apart)
    assert [(r["base_seed"], r["corrupted_sessions"], r["sessions"]) for r in rows] == [
        (0, 27, 120),
        (100, 89, 120),
    ]
    assert rows[1]["runs"] == "30/40 28/40 31/40"


def test_the_protocol_runs_every_session_together_and_counts_every_step():
    dev = get("sim")
    m = build.model(dev, DIFFERENTIAL, index_dtype="bf16", overlap="on")
    runner = Runner(m, [1, 2, 4]).capture()
    work = dict(sessions=6, rounds=2, ctx_min=64, ctx_max=1024, turn_ctx=256, out_min=3, out_max=5)
    p = protocol.run(runner, work, protocol.seeds(7, 2), progress=None)
    assert [r.seed for r in p.runs] == [7, 8] and all(r.concurrency == 4 for r in p.runs)
    for r in p.runs:  # every step is in some bucket; none is left out of the run's count
        assert sum(b.steps for b in r.buckets) == r.steps
        assert sum(b.corrupted_steps for b in r.buckets) == r.corrupted_steps
    assert sum(b.steps for b in p.bucket_steps) == p.steps
    assert p.pooled.sessions == 12 and p.steps == sum(r.steps for r in p.runs)
    with pytest.raises(ValueError, match="at least one run"):
        protocol.seeds(0, 0)


def test_configurations_are_the_corrupting_one_and_its_one_knob_changes():
    got = protocol.configurations(["bf16", "fp8"], ["graph", "eager"], ["on", "off"])
    assert got == [
        ("bf16", "graph", "on"),
        ("bf16", "graph", "off"),
        ("bf16", "eager", "on"),
        ("fp8", "graph", "on"),
    ]
