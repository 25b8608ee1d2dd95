"""Where the race is intermittent on this GPU: the trunk depth at which the campaign's protocol
corrupts some sessions, not most and not none.

The race bites when the main branch's work before the MLP (the trunk, `trunk_layers` small layers)
lasts about as long as the side stream's indexer. How long each lasts is the GPU's own timing, so
the depth that params/gpu.yaml measured on an H200 lies elsewhere on another GPU; here it is
measured:

    found = window.search(dev, profile, window.Ask(depths=(8, 40)), source="params/gpu.yaml")
    found.choice.depth, found.points          # None when no depth gives an intermittent rate

`python -m nblib window` (nblib.run.window_command) parses the command line, prints each point and
writes the tuned profile (nblib.schema.tuned); this module only searches.

Every probed depth builds the model and captures its graphs once, then runs the protocol
(nblib.studies.protocol: every session decoding together, every step counted) for `runs` seeds,
fewer than the suite runs: enough to tell a rate above the band from one below it. The search:
 1. probes both ends of the depth range and places each rate above, inside or below the band;
 2. bisects between two neighbouring probed depths whose rates lie on opposite sides of the band.
    Where several pairs do, it takes one where the rate falls as the trunk deepens (the trunk just
    covering the side branch: the edge the gpu profile sits on), then the one nearest the input's depth;
 3. confirms a depth whose rate lies inside the band with the suite's own protocol (the profile's
    protocol_runs and seeds, what notebook 00 runs; seeds the search never used). The confirmed
    rate decides; one outside the band goes back into the bisection;
 4. where the rate jumps across the band between adjacent depths, confirms both before saying so;
 5. without any crossing, probes the middle of the range (a window between two ends on one side);
    when the range was not given it then widens it, deeper while every rate is above the band and
    shallower while every rate is below.
No depth inside the band is a finding, not an error: `choice.reason` says which case, and the
points are the evidence.
"""

import gc
import time
from collections.abc import Callable
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field, model_validator

from nblib.core import stats
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.studies import protocol

Side = Literal["above", "inside", "below"]
Kind = Literal["search", "confirm"]


class Band(BaseModel):
    """The intermittent rates: a share of sessions corrupted in [lo, hi]."""

    lo: float = 0.10
    hi: float = 0.40

    @model_validator(mode="after")
    def _ordered(self):
        if not 0 <= self.lo < self.hi <= 1:
            raise ValueError(f"the band must be LO:HI with 0 <= LO < HI <= 1, got {self.lo}:{self.hi}")
        return self

    def side(self, rate) -> Side:
        return "above" if rate > self.hi else "below" if rate < self.lo else "inside"

    def distance(self, rate):
        """How far a rate lies outside the band (0 inside)."""
        return max(self.lo - rate, rate - self.hi, 0.0)

    def text(self):
        return f"{100 * self.lo:.0f}%-{100 * self.hi:.0f}%"


class Ask(BaseModel):
    """What to search. depths: the range (None: around the profile's depth, widened while every
    rate lies on one side); runs: protocol runs per probed depth; confirm_runs: the confirming
    protocol's (the suite's protocol_runs); max_points: measurements at most, confirms included."""

    depths: tuple[int, int] | None = None
    band: Band = Band()
    runs: int = Field(2, ge=1)
    confirm_runs: int = Field(5, ge=1)
    max_points: int = Field(16, ge=3)


class Point(BaseModel):
    """One measurement: the protocol at one trunk depth, where its rate lies against the band,
    and what it cost (setup: building the model and capturing its graphs; 0 when reused)."""

    depth: int
    kind: Kind
    side: Side
    protocol: protocol.Protocol
    setup_s: float
    runs_s: float

    @property
    def k(self):
        return self.protocol.pooled.corrupted_sessions

    @property
    def n(self):
        return self.protocol.pooled.sessions

    @property
    def rate(self):
        return self.protocol.pooled.rate

    def seeds(self):
        s = [r.seed for r in self.protocol.runs]
        return f"seed {s[0]}" if len(s) == 1 else f"seeds {s[0]}-{s[-1]}"

    @classmethod
    def of(cls, depth, kind: Kind, p: protocol.Protocol, band: Band, setup_s=0.0, runs_s=0.0):
        side = band.side(p.pooled.rate)
        return cls(depth=depth, kind=kind, side=side, protocol=p, setup_s=setup_s, runs_s=runs_s)

    def line(self):
        return point_line(
            self.depth, self.k, self.n, self.side, self.kind, self.seeds(), self.setup_s + self.runs_s
        )


def point_line(depth, k, n, side, kind, seeds, seconds):
    """One measurement as the search reports it: 'depth  30: 61/200 sessions [24.5%, 37.2%], inside
    (confirm, seeds 0-4; 2.1 s)'."""
    return f"depth {depth:3d}: {sessions(k, n)}, {side:6s} ({kind}, {seeds}; {seconds:.1f} s)"


def sessions(k, n):
    """'17/80 sessions [13.7%, 31.4%]': the count and its Wilson 95% interval."""
    lo, hi = stats.wilson(k, n)
    return f"{k}/{n} sessions [{100 * lo:.1f}%, {100 * hi:.1f}%]"


class Choice(BaseModel):
    """The chosen depth (None: no depth gave an intermittent rate), how the rate moves as the
    trunk deepens around it, and why, in words."""

    depth: int | None
    direction: Literal["falls", "rises"] | None
    reason: str


class Search(BaseModel):
    """The whole probe: what was asked, every measurement in order, and the choice."""

    source: str
    device: str
    band: Band
    depths: tuple[int, int]
    widen_to: int | None
    runs: int
    confirm_runs: int
    points: list[Point]
    choice: Choice
    seconds: float

    @property
    def found(self):
        return self.choice.depth is not None


def check_profile(profile):
    """The search measures the race: bf16 + graph + overlap on with transient logits (the suite's
    headline). A profile without it has no window to find; say so before anything is built."""
    lists = (profile["index_dtypes"], profile["modes"], profile["overlaps"])
    if any(want not in have for want, have in zip(protocol.RACY, lists)):
        raise ValueError(
            "the window is the race's: the profile must list bf16 in index_dtypes, graph in modes and "
            '"on" in overlaps (the configuration that corrupts)'
        )
    if profile["logits_policy"] != "transient":
        raise ValueError(
            f"the profile's logits_policy is {profile['logits_policy']!r}, a fix: the race needs "
            "logits_policy transient"
        )
    if max(profile["buckets"]) < 2:
        raise ValueError("the race needs a bucket of at least 2 requests: add one to the profile's buckets")


def default_range(depth):
    """Around the profile's depth: half to twice it (at least 8 depths wide); widened up to
    max(4 x depth, 64) while every rate lies above the band."""
    lo = depth // 2
    return (lo, max(2 * depth, lo + 8)), max(4 * depth, 64)


class Seeds(NamedTuple):
    """The confirm's seeds are the suite's protocol's (notebook 00's: the profile's seed and
    protocol_runs); the search's follow them, so a confirm never repeats what the search saw."""

    search: list[int]
    confirm: list[int]

    @classmethod
    def of(cls, base, ask: Ask):
        return cls(protocol.seeds(base + ask.confirm_runs, ask.runs), protocol.seeds(base, ask.confirm_runs))


class Prober:
    """measure(depth, kind): the protocol at one depth. The model and its graphs are built once a
    depth and kept for the next call, so a confirm right after its search reuses them; the
    previous depth's are dropped before the next is built (one model's memory at a time).
    progress: called with each point as it is measured (None: nothing is reported)."""

    def __init__(self, dev, profile, ask: Ask, progress=None):
        self.dev, self.profile, self.band, self.progress = dev, profile, ask.band, progress
        self.seeds = Seeds.of(profile["seed"], ask)
        self._held = None  # (depth, runner)

    def __call__(self, depth, kind: Kind) -> Point:
        t0 = time.perf_counter()
        runner = self._runner(depth)
        t1 = time.perf_counter()
        p = protocol.run(runner, self.profile["workload"], getattr(self.seeds, kind), progress=None)
        point = Point.of(depth, kind, p, self.band, round(t1 - t0, 2), round(time.perf_counter() - t1, 2))
        if self.progress:
            self.progress(point)
        return point

    def _runner(self, depth):
        if self._held and self._held[0] == depth:
            return self._held[1]
        self.close()
        shapes = {**self.profile["model"], "trunk_layers": depth}
        m = build.model(
            self.dev, shapes, index_dtype="bf16", overlap="on", logits_policy=self.profile["logits_policy"]
        )
        self._held = (depth, Runner(m, self.profile["buckets"]).capture())
        return self._held[1]

    def close(self):
        self._held = None
        gc.collect()  # the graphs and the model hold cycles; free their blocks before the next build


class Plan(NamedTuple):
    depth: int
    kind: Kind


def crossings(latest):
    """Neighbouring probed depths (in depth order) whose rates lie on opposite sides of the band."""
    pts = [latest[d] for d in sorted(latest)]
    return [(a, b) for a, b in zip(pts, pts[1:]) if {a.side, b.side} == {"above", "below"}]


def _nearest(points, near):
    return min(points, key=lambda p: (abs(p.depth - near), -p.depth))


def _preferred(pairs, near):
    """Falling crossings first (the trunk covering the side branch), then the nearest the input's depth."""
    return min(pairs, key=lambda ab: (ab[0].rate <= ab[1].rate, abs(ab[0].depth + ab[1].depth - 2 * near)))


def plan_next(latest, lo, hi, band, near, widen_to=None):
    """The next measurement, from the latest one at each depth; None when there is nothing left
    that could give an intermittent rate (the module docstring's steps)."""
    for d in (lo, hi):
        if d not in latest:
            return Plan(d, "search")
    inside = [p for p in latest.values() if p.side == "inside" and p.kind == "search"]
    if inside:
        return Plan(_nearest(inside, near).depth, "confirm")
    pairs = crossings(latest)
    open_ = [(a, b) for a, b in pairs if b.depth - a.depth > 1]
    if open_:
        a, b = _preferred(open_, near)
        return Plan((a.depth + b.depth) // 2, "search")
    unconfirmed = [p for ab in pairs for p in ab if p.kind == "search"]
    if unconfirmed:
        return Plan(min(unconfirmed, key=lambda p: band.distance(p.rate)).depth, "confirm")
    if pairs:
        return None
    if (lo + hi) // 2 not in latest:
        return Plan((lo + hi) // 2, "search")
    sides = {p.side for p in latest.values()}
    deepest, shallowest = max(latest), min(latest)
    if widen_to is not None and sides == {"above"} and deepest < widen_to:
        return Plan(min(widen_to, max(2 * deepest, deepest + 4)), "search")
    if widen_to is not None and sides == {"below"} and shallowest > 0:
        return Plan(shallowest // 2, "search")
    return None


def run_search(measure: Callable[[int, Kind], Point], lo, hi, band, near, widen_to=None, max_points=16):
    """Measure until a confirmed depth lies inside the band, nothing is left to try, or max_points;
    returns (every point in order, the choice)."""
    points, latest = [], {}
    while True:
        done = [p for p in latest.values() if p.kind == "confirm" and p.side == "inside"]
        if done:
            return points, chosen(done[0], latest, band)
        plan = None if len(points) >= max_points else plan_next(latest, lo, hi, band, near, widen_to)
        if plan is None:
            return points, no_window(latest, band, stopped=len(points) >= max_points)
        p = measure(plan.depth, plan.kind)
        points.append(p)
        latest[p.depth] = p


def _fmt(p):
    return f"{p.depth}: {p.k}/{p.n}"


def direction(p, latest):
    """How the rate moves as the trunk deepens around p (from its nearest probed neighbours, one
    each side), and those points."""
    shallower = [latest[d] for d in sorted(latest) if d < p.depth][-1:]
    deeper = [latest[d] for d in sorted(latest) if d > p.depth][:1]
    around = [*shallower, p, *deeper]
    if around[0].rate == around[-1].rate:
        return None, around
    return ("falls" if around[0].rate > around[-1].rate else "rises"), around


def chosen(p, latest, band):
    how, around = direction(p, latest)
    lo, hi = stats.wilson(p.k, p.n)
    reason = (
        f"trunk_layers {p.depth}: the suite's protocol ({len(p.protocol.runs)} runs, {p.seeds()}) "
        f"corrupted {sessions(p.k, p.n)}, inside the band {band.text()}"
    )
    if how:
        reason += f"; the rate {how} as the trunk deepens ({', '.join(_fmt(q) for q in around)})"
    if lo < band.lo or hi > band.hi:
        reason += "; its interval reaches past the band (more runs would narrow it)"
    if p.protocol.dispersion_p < 0.05:
        p_ = p.protocol.dispersion_p
        reason += f"; the runs differ more than a binomial's would (dispersion p = {p_:.2g})"
    return Choice(depth=p.depth, direction=how, reason=reason + ".")


def no_window(latest, band, stopped=False):
    pts = [latest[d] for d in sorted(latest)]
    every = ", ".join(_fmt(p) for p in pts)
    jumps = crossings(latest)
    if stopped:
        why = f"stopped after the most measurements allowed, none confirmed inside the band ({every})"
    elif jumps:
        steps = "; ".join(f"{_fmt(a)} {a.side}, {_fmt(b)} {b.side} (both confirmed)" for a, b in jumps)
        why = (
            f"the rate jumps across the band between adjacent depths ({steps}): one layer is too "
            "coarse a step for this GPU; a narrower trunk_width makes each layer shorter"
        )
    elif all(p.side == "above" for p in pts):
        why = (
            f"every depth probed corrupts more than {100 * band.hi:.0f}% of sessions ({every}): the "
            "trunk never outlasts the side branch there; probe deeper (--depths). A rate that does not "
            "fall with depth says the trunk does not decide the race in this profile"
        )
    else:
        why = (
            f"every depth probed corrupts fewer than {100 * band.lo:.0f}% of sessions ({every}): the "
            "side branch ends first there; probe shallower (--depths), or check that the race forms "
            "in this profile (notebook 00)"
        )
    return Choice(depth=None, direction=None, reason=f"no depth gives an intermittent rate: {why}.")


def search(dev, profile, ask: Ask, source="", progress=None):
    """The search on `dev` for a loaded profile (nblib.schema.params.load); see the module docstring.
    progress: called with each Point as it is measured."""
    check_profile(profile)
    near = profile["model"]["trunk_layers"]
    (lo, hi), widen_to = (ask.depths, None) if ask.depths else default_range(near)
    t0 = time.perf_counter()
    measure = Prober(dev, profile, ask, progress)
    try:
        points, choice = run_search(measure, lo, hi, ask.band, near, widen_to, ask.max_points)
    finally:
        measure.close()
    return Search(
        source=str(source),
        device=dev.device_name(),
        band=ask.band,
        depths=(lo, hi),
        widen_to=widen_to,
        runs=ask.runs,
        confirm_runs=ask.confirm_runs,
        points=points,
        choice=choice,
        seconds=round(time.perf_counter() - t0, 1),
    )
