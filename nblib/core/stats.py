"""Statistics for corruption rates: the campaign eyeballed 3 runs of 40 sessions; we don't."""

import math

import numpy as np
from scipy.stats import binom, binomtest, fisher_exact, hypergeom, norm

__all__ = [
    "fisher",
    "fisher_power",
    "fmt_rate",
    "rate",
    "sessions_needed",
    "wilson",
    "zero_failure_sessions",
]


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (scipy's binomtest), (0, 1) when n == 0."""
    if n == 0:
        return 0.0, 1.0
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def rate(k: int, n: int) -> dict[str, float]:
    lo, hi = wilson(k, n)
    return dict(k=k, n=n, rate=(k / n if n else float("nan")), lo=lo, hi=hi)


def fmt_rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{100 * lo:.1f}%, {100 * hi:.1f}%]"


def fisher(k1: int, n1: int, k2: int, n2: int) -> dict[str, float]:
    """Fisher's exact test (two-sided) of k1/n1 against k2/n2: dict(p, odds_ratio).
    The question it answers: could both arms share one corruption rate?"""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"need 0 <= k <= n in both arms, got {k1}/{n1} and {k2}/{n2}")
    odds, p = fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="two-sided")
    return dict(p=float(p), odds_ratio=float(odds))


def _z(q):
    return float(norm.ppf(q))


def sessions_needed(
    p0: float, p1: float = 0.0, alpha: float = 0.05, power: float = 0.8, method: str = "fisher"
) -> int:
    """Sessions per arm to tell a baseline corruption rate p0 from a fixed rate p1 (default 0),
    two-sided, at `alpha` with `power`.

    method "normal": the textbook normal approximation for two proportions (pooled variance under
    the null); "fisher": the smallest n from there on whose exact power, by enumerating both arms'
    binomial outcomes through Fisher's exact test, reaches `power` (Fisher is conservative, so it
    asks for more). Example: p0 = 0.15 (the campaign), p1 = 0 -> normal 48, Fisher 52 per arm."""
    if not (0 <= p1 < p0 <= 1):
        raise ValueError(f"need 0 <= p1 < p0 <= 1, got p0={p0}, p1={p1}")
    za, zb = _z(1 - alpha / 2), _z(power)
    pbar = (p0 + p1) / 2
    n = (za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p0 * (1 - p0) + p1 * (1 - p1))) ** 2 / (
        p0 - p1
    ) ** 2
    n = math.ceil(n)
    if method == "normal":
        return n
    if method != "fisher":
        raise ValueError(f"unknown method {method!r}: choose one of normal, fisher")
    n = max(2, int(0.8 * n))
    while fisher_power(n, p0, p1, alpha) < power:
        n += 1
    return n


def fisher_power(n: int, p0: float, p1: float, alpha: float = 0.05) -> float:
    """Exact power of the two-sided Fisher test with n sessions per arm: for each total K of
    corrupted sessions, the hypergeometric null gives every split's p-value (scipy's rule: the sum
    of the splits no likelier than it), and the rejected splits are weighted by their binomial
    probability under (p0, p1). Ours because scipy (and statsmodels) offer no exact power for
    Fisher's test, only normal approximations, which overstate it at the rates studied here."""
    f0, f1 = binom.pmf(np.arange(n + 1), n, p0), binom.pmf(np.arange(n + 1), n, p1)
    total = 0.0
    for K in range(2 * n + 1):
        x = np.arange(max(0, K - n), min(n, K) + 1)  # arm 0's share of the K
        null = hypergeom.pmf(x, 2 * n, K, n)
        order = np.sort(null)
        pvals = np.cumsum(order)[np.searchsorted(order, null * (1 + 1e-7), side="right") - 1]
        rej = x[pvals < alpha]
        total += float((f0[rej] * f1[K - rej]).sum())
    return total


def zero_failure_sessions(target: float, confidence: float = 0.95, method: str = "exact") -> int:
    """Clean sessions needed, with zero failures, for the upper bound on the rate to fall below
    `target`. method "exact": the one-sided binomial bound ((1 - target)^n <= 1 - confidence), about
    3 / target at 95 % (the rule of three; 1 % -> 299). method "wilson": the upper end of the
    two-sided Wilson interval this package reports everywhere, z^2 / (n + z^2) < target (1 % -> 381)."""
    if not 0 < target < 1:
        raise ValueError(f"target must be a rate in (0, 1), got {target}")
    if method == "wilson":
        z2 = _z(1 - (1 - confidence) / 2) ** 2
        return math.floor(z2 * (1 - target) / target) + 1
    if method != "exact":
        raise ValueError(f"unknown method {method!r}: use 'exact' or 'wilson'")
    return math.ceil(math.log(1 - confidence) / math.log(1 - target))
