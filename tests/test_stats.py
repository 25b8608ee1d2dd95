"""nblib.core.stats against references written here: Wilson's score interval from its closed form,
published values of Fisher's exact test, the exact power by brute-force enumeration through scipy's
Fisher test, and the zero-failure bounds from their definitions."""

import math

import pytest
from scipy.stats import binom, fisher_exact

from nblib.core import stats

Z = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


def wilson_score(k, n, z=Z):
    """Wilson's score interval, the textbook closed form."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_known_values():
    lo, hi = stats.wilson(0, 40)
    assert lo == 0 and hi == pytest.approx(0.0876, abs=1e-3)
    lo, hi = stats.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-3), pytest.approx(0.7634, abs=1e-3))


@pytest.mark.parametrize("k, n", [(0, 10), (0, 40), (5, 10), (1, 3), (47, 200), (40, 40)])
def test_wilson_is_the_score_interval(k, n):
    assert stats.wilson(k, n) == pytest.approx(wilson_score(k, n), abs=1e-12)


def test_wilson_of_no_sessions_is_the_whole_range():
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_fisher_known_values():
    assert stats.fisher(8, 10, 1, 6)["p"] == pytest.approx(0.034965, abs=1e-5)
    assert stats.fisher(3, 4, 1, 4)["p"] == pytest.approx(0.485714, abs=1e-5)  # the lady tasting tea
    assert stats.fisher(1, 10, 11, 14)["p"] == pytest.approx(0.0027595, abs=1e-6)
    assert stats.fisher(0, 40, 0, 40)["p"] == 1.0


def test_fisher_refuses_more_corrupted_than_sessions():
    with pytest.raises(ValueError):
        stats.fisher(5, 4, 0, 4)


def test_sessions_needed_by_the_normal_approximation_is_the_textbook_count():
    assert stats.sessions_needed(0.15, method="normal") == 48  # the textbook formula, by hand: 47.2


def test_sessions_needed_by_fisher_reaches_the_power_the_normal_count_overstates():
    n = stats.sessions_needed(0.15)
    assert n >= 48 and stats.fisher_power(n, 0.15, 0) >= 0.8 > stats.fisher_power(n - 5, 0.15, 0)


def test_a_rarer_corruption_needs_more_sessions():
    assert stats.sessions_needed(0.5) < stats.sessions_needed(0.15) < stats.sessions_needed(0.05)


def test_exact_power_is_the_brute_force_enumeration_through_scipys_fisher_test():
    brute = sum(
        binom.pmf(a, 10, 0.3) * binom.pmf(b, 10, 0.05)
        for a in range(11)
        for b in range(11)
        if fisher_exact([[a, 10 - a], [b, 10 - b]], alternative="two-sided")[1] < 0.05
    )
    assert stats.fisher_power(10, 0.3, 0.05) == pytest.approx(brute, rel=1e-9)


def test_zero_failure_sessions_follow_the_rule_of_three():
    assert stats.zero_failure_sessions(0.01) == 299 and stats.zero_failure_sessions(0.1) == 29  # ~3/target
    assert wilson_score(0, stats.zero_failure_sessions(0.01))[1] < 0.0131


def test_zero_failure_sessions_by_wilson_are_the_fewest_whose_upper_bound_is_below_the_target():
    n = stats.zero_failure_sessions(0.01, method="wilson")
    assert wilson_score(0, n)[1] < 0.01 <= wilson_score(0, n - 1)[1]
