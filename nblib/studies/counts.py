"""The protocol's statistics for counts you bring from your own engine.

Your runs of a protocol (sessions corrupted out of sessions run, one pair a run), and optionally a
baseline's pooled count (the same protocol without your change or instrument), read the way notebooks
00 and 02 read theirs: each run's rate and the pooled rate with Wilson 95% intervals, the dispersion
test over the runs (Pearson's chi-square of homogeneity: a small p says the runs differ more than one
binomial rate gives), Fisher's exact test against the baseline, and the sessions per arm a fix would
need for a rate at the pooled one to be told from zero (Fisher, at `alpha` with `power`).

    python -m nblib stats 9/40 11/40 10/40 8/40 9/40 --baseline 44/200
    report = counts.report([(9, 40), (11, 40)], baseline=(44, 200))
"""

from collections.abc import Sequence

from pydantic import BaseModel

from nblib.core import stats
from nblib.studies.protocol import homogeneity_p

__all__ = ["CountsReport", "Rate", "parse", "report"]


class Rate(BaseModel):
    """k of n sessions corrupted, with the rate and its Wilson 95% interval."""

    corrupted: int
    sessions: int
    rate: float
    lo: float
    hi: float


class CountsReport(BaseModel):
    runs: list[Rate]
    pooled: Rate
    dispersion_p: float  # 1.0 where there is no spread to test (one run, all clean or all corrupted)
    baseline: Rate | None
    fisher_p: float | None  # the pooled runs against the baseline; None without one
    sessions_needed: int | None  # per arm, to tell the pooled rate from zero; None at a rate of 0 or 1
    text: str


def parse(spec: str) -> tuple[int, int]:
    """'9/40' -> (9, 40); a one-line error for anything else."""
    k, sep, n = spec.partition("/")
    try:
        got = int(k), int(n)
    except ValueError:
        got = None
    if not sep or got is None or not 0 <= got[0] <= got[1] or got[1] == 0:
        raise ValueError(
            "a count reads CORRUPTED/SESSIONS, 0 <= CORRUPTED <= SESSIONS and SESSIONS > 0, "
            f"e.g. 9/40; got {spec!r}"
        )
    return got


def _rate(k, n):
    r = stats.rate(k, n)
    return Rate(corrupted=k, sessions=n, rate=r["rate"], lo=r["lo"], hi=r["hi"])


def report(
    runs: Sequence[tuple[int, int]],
    baseline: tuple[int, int] | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> CountsReport:
    """The statistics of `runs` ((corrupted, sessions) pairs), against `baseline` (one pair) if given."""
    if not runs:
        raise ValueError("give at least one run's count, e.g. 9/40")
    k, n = sum(r[0] for r in runs), sum(r[1] for r in runs)
    pooled = _rate(k, n)
    dispersion = homogeneity_p(list(runs))
    base = _rate(*baseline) if baseline else None
    fisher_p = stats.fisher(baseline[0], baseline[1], k, n)["p"] if baseline else None
    needed = stats.sessions_needed(pooled.rate, alpha=alpha, power=power) if 0 < pooled.rate < 1 else None
    lines = [
        "runs: " + ", ".join(f"{a}/{b}" for a, b in runs),
        f"pooled: {stats.fmt_rate(k, n)}",
        f"dispersion: chi-square p = {dispersion:.2g}"
        + (" (the runs differ more than one binomial rate gives)" if dispersion < alpha else ""),
    ]
    if baseline and fisher_p is not None:  # with a baseline (base and fisher_p then exist)
        way = "differs from" if fisher_p < alpha else "no change detected against"
        lines.append(f"baseline: {stats.fmt_rate(*baseline)}; {way} it (Fisher p = {fisher_p:.2g})")
    if needed is not None:
        lines.append(
            f"sessions per arm to tell {100 * pooled.rate:.1f} % from zero (Fisher, alpha {alpha}, "
            f"power {power}): {needed}"
        )
    return CountsReport(
        runs=[_rate(a, b) for a, b in runs],
        pooled=pooled,
        dispersion_p=dispersion,
        baseline=base,
        fisher_p=fisher_p,
        sessions_needed=needed,
        text="\n".join(lines),
    )
