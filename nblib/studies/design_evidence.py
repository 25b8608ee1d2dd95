"""Why an instrument moved the bug: each design's effect on the rate, and the mechanism that carries it.

An instrument can move a race's rate in four ways, and each leaves its own evidence in notebook 02's
measurements of the arm against the arm without instrument ("off"):

  layout          the aliasing pairs moved: the instrument's allocations changed which blocks the
                  allocator hands on across streams (the capture audit's pairs, per bucket)
  lifetime        the pairs moved and the instrument keeps blocks allocated past the capture's end
                  (bytes in blocks allocated in the capture and never freed in it, against off's)
  in-step timing  the same pairs, but in the buckets that carry the corruption a replayed step loses
                  the race more or less often (corrupted steps per step there; the branch times say
                  which way the window moved)
  batch dynamics  the same per-step rate there, but more or fewer steps land in those buckets: with
                  tool calls in time, an instrument's cost changes how many sessions decode together

Each test is Fisher's exact test against off at `alpha`. A design whose rate did not move has no
mechanism to name ("none"); one whose effect no evidence here accounts for reads "not separated".

    why = explain(result)          # result: nblib.studies.designs.Designs
    why.findings[0].mechanism, why.text, campaign_sentence(result, why)
"""

import statistics
from typing import Any

from pydantic import BaseModel
from scipy.stats import chi2_contingency

from nblib.core import stats
from nblib.instruments.gediff import DESIGNS

# an arm or result below is nblib.studies.designs' Arm or Designs, typed Any: that module imports this one

__all__ = [
    "CAMPAIGN",
    "MECHANISMS",
    "Explanation",
    "Finding",
    "campaign_sentence",
    "carrying",
    "explain",
    "finding",
    "racy",
    "verdict",
]

MECHANISMS = ("layout", "lifetime", "in-step timing", "batch dynamics")
CAMPAIGN = "campaign"


class Finding(BaseModel):
    """What one arm did to the rate, each mechanism's evidence, and the mechanism that carries it."""

    design: str
    effect: str  # raises | lowers | unchanged (Fisher's p against off, at alpha)
    layout: str
    timing: str
    why: str
    # None in results written before the four mechanisms were told apart
    mechanism: str | None = None  # one of MECHANISMS, "none" (the rate did not move), "not separated"
    lifetime: str | None = None
    in_step: str | None = None
    batch: str | None = None


class Explanation(BaseModel):
    findings: list[Finding]
    signature: list[str]  # designs that reproduce the campaign's signature: rate falls, zero divergence
    recommended: str | None  # a design that leaves the rate unchanged and catches a planted divergence
    text: str


class _Test(BaseModel):
    text: str
    sign: float  # > 0: the arm's share is higher than off's
    p: float


def racy(off: Any) -> list[int]:
    """The buckets where the arm without instrument has aliasing pairs: where the race can happen."""
    return [x.bucket for x in off.buckets if x.pairs] or [x.bucket for x in off.buckets]


def carrying(off: Any) -> list[int]:
    """The buckets whose replayed steps corrupted without instrument (else the racy ones)."""
    return [b.bucket for b in off.bucket_steps if b.corrupted_steps] or racy(off)


def _in(arm, buckets):
    """(corrupted steps, steps) of `arm` in `buckets`, pooled over its runs."""
    rows = [b for b in arm.bucket_steps if b.bucket in buckets]
    return sum(b.corrupted_steps for b in rows), sum(b.steps for b in rows)


def _share(k, n):
    return k / n if n else 0.0


def _layout(arm, off):
    moved = [b.bucket for b, o in zip(arm.buckets, off.buckets) if b.pairs != o.pairs]
    if not moved:
        return f"the same aliasing pairs as off in every bucket ({arm.pairs})", 0
    return (
        f"aliasing pairs {off.pairs} -> {arm.pairs} (changed in buckets {moved}); "
        f"hazards {off.hazards} -> {arm.hazards}",
        arm.pairs - off.pairs or (1 if arm.hazards > off.hazards else -1),
    )


def _lifetime(arm, off):
    extra = arm.kept_bytes - off.kept_bytes
    text = f"blocks kept at capture end {arm.kept_bytes} B against off's {off.kept_bytes} B ({extra:+d} B)"
    return text, extra


def _timing(arm, off, where):
    ds = [1e3 * (arm.side_ms[b] - off.side_ms[b]) for b in where]
    dm = [1e3 * (arm.main_ms[b] - off.main_ms[b]) for b in where]
    side, main = statistics.mean(ds), statistics.mean(dm)
    base = statistics.mean(1e3 * off.side_ms[b] for b in where)
    text = (
        f"side branch {side:+.1f} us ({100 * side / base:+.1f} %), main branch {main:+.1f} us, "
        f"mean over buckets {where}"
    )
    return text, side - main  # > 0: the side branch gained on the main branch (a wider window)


def _in_step(arm, off, where):
    (k0, n0), (k1, n1) = _in(off, where), _in(arm, where)
    p = stats.fisher(k0, n0, k1, n1)["p"] if n0 and n1 else 1.0
    return _Test(
        text=f"corrupted steps in buckets {where}: {k1}/{n1} against off's {k0}/{n0} (Fisher p = {p:.2g})",
        sign=_share(k1, n1) - _share(k0, n0),
        p=p,
    )


def _whole(arm, off):
    """Chi-square of homogeneity of the two arms' steps over every bucket."""
    buckets = sorted({b.bucket for b in arm.bucket_steps} | {b.bucket for b in off.bucket_steps})
    steps = [{b.bucket: b.steps for b in a.bucket_steps} for a in (off, arm)]
    rows = [[s.get(x, 0) for x in buckets] for s in steps]
    cols = [i for i in range(len(buckets)) if rows[0][i] + rows[1][i]]
    table = [[r[i] for i in cols] for r in rows]
    if len(cols) < 2 or not all(sum(r) for r in table):
        return 1.0
    return float(chi2_contingency(table, correction=False).pvalue)


def _batch(arm, off, where):
    (_, n0), (_, n1) = _in(off, where), _in(arm, where)
    p = stats.fisher(n0, off.steps, n1, arm.steps)["p"] if off.steps and arm.steps else 1.0
    return _Test(
        text=f"steps in buckets {where}: {n1}/{arm.steps} against off's {n0}/{off.steps} "
        f"(Fisher p = {p:.2g}); "
        f"steps over every bucket against off's, chi-square p = {_whole(arm, off):.2g}",
        sign=_share(n1, arm.steps) - _share(n0, off.steps),
        p=p,
    )


def _mechanism(effect, dl, extra, in_step, batch, alpha):
    if effect == "unchanged":
        return "none"
    up = effect == "raises"
    if dl and (dl > 0) == up:
        return "lifetime" if extra > 0 else "layout"
    if in_step.p < alpha and in_step.sign and (in_step.sign > 0) == up:
        return "in-step timing"
    if batch.p < alpha and batch.sign and (batch.sign > 0) == up:
        return "batch dynamics"
    return "not separated"


def _unchanged(arm, off, where, dl, dt):
    """No change detected: say so, with where the evidence leans (a shift under 1 % of the side
    branch, or no pair moved, is read as none), so a reader sees what a longer protocol would test."""
    p = "no change detected in the rate" + (f" (p = {arm.fisher_p:.2g})" if arm.fisher_p is not None else "")
    base = statistics.mean(1e3 * off.side_ms[b] for b in where)
    if dl:
        return f"{p}, although the aliasing pairs moved"
    if abs(dt) > 0.01 * base:
        way = "wider" if dt > 0 else "narrower"
        more = "up" if dt > 0 else "down"
        return (
            f"{p}; the evidence leans to timing: the side branch gains {dt:+.1f} us on the main branch "
            f"(a {way} window, the same blocks aliasing), which would move the rate {more}"
        )
    return f"{p}, and neither the aliasing pairs nor the branch times moved"


def _why(mechanism, effect, ev):
    more = "more" if effect == "raises" else "fewer"
    return {
        "layout": f"layout: {more} blocks handed on across streams, so {more} pairs can race "
        f"({ev['layout']}), "
        "no block kept past the capture",
        "lifetime": f"lifetime: it keeps blocks past the capture ({ev['lifetime']}), so the allocator hands "
        f"{more} of them on and {more} pairs can race ({ev['layout']})",
        "in-step timing": f"in-step timing: with the same pairs, a step in the buckets that carry the "
        f"corruption loses the race {'more' if effect == 'raises' else 'less'} often ({ev['in_step']}); "
        f"branch times: {ev['timing']}",
        "batch dynamics": "batch dynamics: the same per-step rate where the corruption lives, but "
        f"{more} steps "
        f"land there ({ev['batch']}): the instrument's cost moved how many sessions decode together",
        "not separated": "not separated: neither the pairs, the blocks kept, the per-step rate nor the "
        f"steps per bucket moved with it ({ev['in_step']}; {ev['batch']})",
    }[mechanism]


def _moves(effect):
    """'raises the rate', 'lowers the rate', 'leaves the rate unchanged'."""
    return "leaves the rate unchanged" if effect == "unchanged" else f"{effect} the rate"


def finding(arm: Any, off: Any, alpha: float = 0.05) -> Finding:
    """One arm's effect against off and each mechanism's evidence."""
    effect = "unchanged"
    if arm.fisher_p is not None and arm.fisher_p < alpha:
        effect = "raises" if arm.rate > off.rate else "lowers"
    where_race, where_bad = racy(off), carrying(off)
    layout, dl = _layout(arm, off)
    lifetime, extra = _lifetime(arm, off)
    timing, dt = _timing(arm, off, where_race)
    in_step, batch = _in_step(arm, off, where_bad), _batch(arm, off, where_bad)
    mechanism = _mechanism(effect, dl, extra, in_step, batch, alpha)
    ev = dict(layout=layout, lifetime=lifetime, timing=timing, in_step=in_step.text, batch=batch.text)
    why = _unchanged(arm, off, where_race, dl, dt) if mechanism == "none" else _why(mechanism, effect, ev)
    return Finding(design=arm.design, effect=effect, mechanism=mechanism, why=why, **ev)


def explain(result: Any, alpha: float = 0.05) -> Explanation:
    """Per arm: the effect on the rate, the evidence and the mechanism; the designs that reproduce
    the campaign's signature (the rate falls and no comparison diverges); the design to recommend (the
    rate unchanged, a planted divergence caught; the smallest side-branch cost among those)."""
    off = result.arm("off")
    findings = [finding(a, off, alpha) for a in result.arms if a.design != "off"]
    by = {f.design: f for f in findings}
    diffs = [a for a in result.arms if a.design in DESIGNS]
    signature = [a.design for a in diffs if by[a.design].effect == "lowers" and a.diverged == 0]
    fine = [a for a in diffs if by[a.design].effect == "unchanged" and a.planted_caught]
    where = racy(off)
    best = min(fine, key=lambda a: statistics.mean(a.side_ms[b] for b in where), default=None)
    lines = [
        f"{f.design}: {_moves(f.effect)} "
        f"({stats.fmt_rate(result.arm(f.design).corrupted_sessions, result.arm(f.design).sessions)} "
        f"against {stats.fmt_rate(off.corrupted_sessions, off.sessions)} off, "
        f"Fisher p = {result.arm(f.design).fisher_p:.2g}). Mechanism: {f.mechanism}. Why: {f.why}."
        for f in findings
    ]
    lines.append(
        "The campaign's signature (the rate falls, zero divergence): "
        + (", ".join(signature) if signature else "no design here")
        + ". Recommended: "
        + (
            f"{best.design} (the rate unchanged, a planted divergence caught)"
            if best
            else "none: no design both left the rate unchanged and caught the planted divergence"
        )
        + "."
    )
    return Explanation(
        findings=findings,
        signature=signature,
        recommended=best.design if best else None,
        text="\n".join(lines),
    )


def campaign_sentence(result: Any, why: Explanation) -> str | None:
    """Whether the campaign's design, run as the campaign ran it, reproduces the campaign's drop (the
    rate falls, no comparison diverges), and if not what the evidence shows instead; None without it."""
    f = next((x for x in why.findings if x.design == CAMPAIGN), None)
    if f is None:
        return None
    arm, off = result.arm(CAMPAIGN), result.arm("off")
    what = (
        f"The campaign's design, run as the campaign ran it, {_moves(f.effect)} "
        f"({arm.corrupted_sessions}/{arm.sessions} against {off.corrupted_sessions}/{off.sessions} "
        "without it, "
        f"Fisher p = {arm.fisher_p:.2g}) with {arm.diverged} of {arm.comparisons} comparisons diverged"
    )
    if f.effect == "lowers" and arm.diverged == 0:
        return f"{what}: it reproduces the campaign's drop. The mechanism, {f.why}."
    instead = f"The mechanism, {f.why}" if f.mechanism != "none" else f"Instead: {f.why}"
    return f"{what}: it does not reproduce the campaign's drop. {instead}."


def verdict(result: Any, why: Explanation) -> str:
    """One paragraph: each arm's effect against no instrument, the signature and the recommendation."""
    off = result.arm("off")
    effects = {f.design: f for f in why.findings}
    each = ", ".join(
        f"{a.design} {effects[a.design].effect} "
        f"({a.corrupted_sessions}/{a.sessions}, p = {a.fisher_p:.2g}"
        + (f", {a.diverged}/{a.comparisons} diverged" if a.comparisons else "")
        + (f", by {effects[a.design].mechanism}" if effects[a.design].mechanism != "none" else "")
        + ")"
        for a in result.arms
        if a.design != "off"
    )
    return (
        f"Without instrument {stats.fmt_rate(off.corrupted_sessions, off.sessions)} of sessions corrupted; "
        f"against it: {each}. {why.text.splitlines()[-1]}"
    )
