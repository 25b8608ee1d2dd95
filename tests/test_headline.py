"""The protocol's headline holds on seed blocks the sim profile was not tuned on.

params/sim.yaml's workload and bucket ladder were chosen on the seed blocks 0, 100 and 200
(outputs/probe/sim-buckets/). Here two other blocks, 300 and 400, five runs of the campaign's protocol
each, on the profile as it is: each block pooled 10-30 % of sessions, every run 5-50 %, no
over-dispersion (p >= 0.05), and at least two buckets whose replayed steps corrupted at a rate between
5 % and 95 %.

Block 300 meets all of it. Block 400 does not: its runs corrupt 24, 16, 16, 0 and 11 of 40 sessions
(pooled 33.5 %, one run with none, over-dispersed). A simulated run replays about 30 steps, some ten of
them in the buckets that race, so one run's count still swings with a few steps' timing draws; the
test keeps that block as a strict expected failure until the profile holds there too.
"""

import pytest
from scipy.stats import chi2_contingency

from nblib.backends.device import get
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.schema import params
from nblib.studies import protocol


def block(base):
    """The protocol's runs from `base` on the sim profile, captured afresh (each test on its own worker)."""
    profile = params.load("params/sim.yaml")
    m = build.model(get("sim"), profile["model"], index_dtype="bf16", overlap="on")
    runner = Runner(m, profile["buckets"]).capture()
    return protocol.run(
        runner, profile["workload"], protocol.seeds(base, profile["protocol_runs"]), progress=None
    )


UNMET = pytest.mark.xfail(
    strict=True, reason="block 400: runs 24, 16, 16, 0, 11 of 40 (a run with none; pooled 33.5 %)"
)


@pytest.mark.parametrize("base", [300, pytest.param(400, marks=UNMET)])
def test_the_headline_holds_on_an_untuned_seed_block(base):
    p = block(base)
    runs = [(r.corrupted_sessions, r.sessions) for r in p.runs]
    pooled = sum(k for k, _ in runs) / sum(n for _, n in runs)
    assert 0.10 <= pooled <= 0.30, runs
    assert all(0.05 <= k / n <= 0.50 for k, n in runs), runs
    # the dispersion test written out: Pearson's chi-square over the runs' corrupted and clean sessions
    table = [[k, n - k] for k, n in runs]
    assert chi2_contingency(table, correction=False).pvalue >= 0.05, runs
    racing = [b for b in p.bucket_steps if b.steps and 0.05 <= b.corrupted_steps / b.steps <= 0.95]
    assert len(racing) >= 2, [(b.bucket, b.corrupted_steps, b.steps) for b in p.bucket_steps]
