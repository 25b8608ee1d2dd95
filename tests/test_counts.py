"""The protocol's statistics for counts a user brings (python -m nblib stats), against references
written here: Wilson's closed form, Pearson's chi-square by hand, Fisher's exact test from scipy, and
the sessions a fix needs from the power enumerated over both arms' binomial outcomes."""

import json
import math
import subprocess
import sys

import pytest
from scipy.stats import binom, chi2, fisher_exact

from nblib.studies import counts

RUNS = [(9, 40), (11, 40), (10, 40), (8, 40), (9, 40)]


def wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def pearson_p(runs):
    k, n = sum(a for a, _ in runs), sum(b for _, b in runs)
    p = k / n
    stat = sum((a - b * p) ** 2 / (b * p) + ((b - a) - b * (1 - p)) ** 2 / (b * (1 - p)) for a, b in runs)
    return chi2.sf(stat, len(runs) - 1)


def power(n, p0, alpha=0.05):
    """P(Fisher rejects) with n sessions an arm, one arm at rate p0 and the other at 0."""
    total = 0.0
    for k in range(n + 1):
        if fisher_exact([[k, n - k], [0, n]])[1] < alpha:
            total += binom.pmf(k, n, p0)
    return total


def test_each_figure_matches_its_reference():
    rep = counts.report(RUNS, baseline=(44, 200))
    assert [(r.corrupted, r.sessions) for r in rep.runs] == RUNS
    assert (rep.pooled.corrupted, rep.pooled.sessions) == (47, 200)
    assert (rep.pooled.lo, rep.pooled.hi) == pytest.approx(wilson(47, 200), abs=1e-9)
    assert rep.dispersion_p == pytest.approx(pearson_p(RUNS), rel=1e-9)
    assert rep.fisher_p == pytest.approx(fisher_exact([[44, 156], [47, 153]])[1], rel=1e-9)
    n = rep.sessions_needed
    assert power(n, 47 / 200) >= 0.8 > power(n - 1, 47 / 200)


def test_spread_runs_read_as_over_dispersed_and_a_clean_baseline_as_a_change():
    rep = counts.report([(24, 40), (16, 40), (16, 40), (0, 40), (11, 40)], baseline=(0, 200))
    assert rep.dispersion_p < 1e-5 and "differ more than one binomial" in rep.text
    assert rep.fisher_p < 1e-20 and "differs from it" in rep.text


def test_a_rate_of_zero_needs_no_sessions_and_one_run_has_no_spread():
    rep = counts.report([(0, 40)])
    assert rep.sessions_needed is None and rep.dispersion_p == 1.0 and rep.baseline is None


@pytest.mark.parametrize("bad", ["9", "9/0", "41/40", "-1/40", "a/40", "9/40/2"])
def test_a_bad_count_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="CORRUPTED/SESSIONS"):
        counts.parse(bad)


def test_the_command_prints_the_report_and_refuses_bad_input_in_one_line():
    cmd = [sys.executable, "-m", "nblib", "stats", *[f"{a}/{b}" for a, b in RUNS], "--baseline", "44/200"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["pooled"]["corrupted"] == 47
    bad = subprocess.run([*cmd[:4], "9/x"], check=False, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0 and "error:" in bad.stderr
