"""Statistics for corruption rates: the campaign eyeballed 3 runs of 40 sessions; we don't."""
import math


def wilson(k, n, z=1.959963984540054):
    """Wilson score interval for k successes in n trials (95% by default). (0, 1) when n == 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)   # exact ends: no rounding dust at 0 or n
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def rate(k, n):
    lo, hi = wilson(k, n)
    return dict(k=k, n=n, rate=(k / n if n else float("nan")), lo=lo, hi=hi)


def fmt_rate(k, n):
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{100 * lo:.1f}%, {100 * hi:.1f}%]"
