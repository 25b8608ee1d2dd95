"""The campaign's protocol: N sessions x R rounds decoding together, every step counted.

The production campaign ran its 40 agentic sessions x 3 rounds all at once and counted the sessions
that came back corrupted, run after run. Here, as there: every session starts together (up to the
largest captured bucket, the engine's batch limit), the batch shrinks and grows as sessions think
(tool calls) and return, each step is replayed in the smallest captured bucket that holds it (the
engine's padding), and every step of the run is compared with the eager reference. The session rate
is the run's, whatever buckets its steps landed in.

Several runs (seeds: a new workload and a new replay-timing draw each) give each run's rate, the
pooled rate with its Wilson interval, and a test of the run-to-run spread: Pearson's chi-square of
homogeneity over the runs' corrupted/clean sessions (scipy.stats.chi2_contingency), which is the
binomial dispersion test. A small p says the runs differ more than a binomial at the pooled rate
would: over-dispersion, as when a few steps corrupt many sessions at once.

    proto = protocol.run(runner, workload, seeds=protocol.seeds(0, 5))
    proto.pooled.rate, proto.dispersion_p
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict
from scipy.stats import chi2_contingency

from nblib.core import stats
from nblib.engine.runner import Runner
from nblib.engine.workload import Instrument, WorkloadConfig, run_sessions

__all__ = [
    "RACY",
    "Block",
    "BucketSteps",
    "ConfigProtocol",
    "Pooled",
    "Protocol",
    "ProtocolRun",
    "between_blocks_p",
    "block",
    "block_rows",
    "blocks_verdict",
    "bucket_rows",
    "concurrency",
    "configurations",
    "describe",
    "dispersion_p",
    "fingerprint_rows",
    "headline",
    "homogeneity_p",
    "pool",
    "pool_buckets",
    "run",
    "seeds",
    "summarise",
    "verdict",
]


class BucketSteps(BaseModel):
    """The steps of one run that one bucket's graph replayed, and how many of them corrupted."""

    bucket: int
    steps: int
    corrupted_steps: int


class ProtocolRun(BaseModel):
    """One run of the protocol. rows: the (step, session) pairs decoded; corrupted_rows: those that
    diverged; rows_per_corrupted_step: how many sessions one corrupted step hit, on average."""

    seed: int
    sessions: int
    corrupted_sessions: int
    steps: int
    corrupted_steps: int
    rows: int
    corrupted_rows: int
    rows_per_corrupted_step: float | None
    concurrency: int
    buckets: list[BucketSteps]

    @property
    def rate(self) -> float:
        return self.corrupted_sessions / self.sessions if self.sessions else 0.0


class Pooled(BaseModel):
    """Sessions pooled over the runs, with the Wilson 95% interval."""

    corrupted_sessions: int
    sessions: int
    rate: float
    lo: float
    hi: float


class Block(BaseModel):
    """The protocol's runs from one base seed (a seed block): seeds base_seed, base_seed + 1, ..."""

    model_config = ConfigDict(extra="forbid")
    base_seed: int
    runs: list[ProtocolRun]
    pooled: Pooled
    dispersion_p: float
    bucket_steps: list[BucketSteps] = []


class Protocol(BaseModel):
    """Every run, the pooled rate, and the dispersion test's p-value (1.0 when it cannot reject:
    every run clean, every run fully corrupted, or a single run); bucket_steps: each bucket's steps
    and corrupted steps pooled over the runs (empty in results written before it was recorded)."""

    runs: list[ProtocolRun]
    pooled: Pooled
    dispersion_p: float
    steps: int
    corrupted_steps: int
    bucket_steps: list[BucketSteps] = []
    blocks: list[Block] = []  # the same protocol from other base seeds (seed_blocks), this one's first


def seeds(base: int, n: int) -> list[int]:
    """n run seeds from `base`: each is the workload's seed and the replay-timing seed of one run."""
    if n < 1:
        raise ValueError(f"the protocol needs at least one run, got {n}")
    return [base + i for i in range(n)]


def concurrency(workload: Mapping[str, Any], buckets: Iterable[int]) -> int:
    """Every session decodes together, up to the largest captured bucket (the engine's batch limit)."""
    return min(workload["sessions"], max(buckets))


def _one(runner, workload, seed, instruments):
    runner.dev.manual_seed(seed)
    w = WorkloadConfig(**{**workload, "seed": seed, "concurrency": concurrency(workload, runner.buckets)})
    r = run_sessions(runner, w, instruments)
    log = r["step_log"]
    bad_steps = [st for st in log if st["bad_rows"]]
    per_bucket = [
        BucketSteps(
            bucket=b,
            steps=sum(1 for st in log if st["bucket"] == b),
            corrupted_steps=sum(1 for st in bad_steps if st["bucket"] == b),
        )
        for b in sorted({st["bucket"] for st in log})
    ]
    bad_rows = sum(st["bad_rows"] for st in log)
    return ProtocolRun(
        seed=seed,
        sessions=r["sessions"],
        corrupted_sessions=r["corrupted_sessions"],
        steps=r["steps"],
        corrupted_steps=r["corrupted_steps"],
        rows=sum(st["bs"] for st in log),
        corrupted_rows=bad_rows,
        rows_per_corrupted_step=bad_rows / len(bad_steps) if bad_steps else None,
        concurrency=w.concurrency,
        buckets=per_bucket,
    )


def homogeneity_p(counts: Iterable[tuple[int, int]]) -> float:
    """Pearson's chi-square test that every (corrupted, total) pair of `counts` shares one rate
    (scipy.stats.chi2_contingency, no continuity correction); 1.0 where there is no spread to test."""
    table = [[k, n - k] for k, n in counts]
    k = sum(row[0] for row in table)
    n = sum(sum(row) for row in table)
    if len(table) < 2 or k in (0, n):
        return 1.0
    return float(chi2_contingency(table, correction=False).pvalue)


def dispersion_p(runs: Iterable[ProtocolRun]) -> float:
    """The binomial dispersion test over the runs: homogeneity_p of their corrupted sessions."""
    return homogeneity_p([(r.corrupted_sessions, r.sessions) for r in runs])


def pool(runs: Sequence[ProtocolRun]) -> Pooled:
    k, n = sum(r.corrupted_sessions for r in runs), sum(r.sessions for r in runs)
    rate = stats.rate(k, n)
    return Pooled(
        corrupted_sessions=k, sessions=n, rate=rate["rate"] if n else 0.0, lo=rate["lo"], hi=rate["hi"]
    )


def pool_buckets(runs: Iterable[ProtocolRun]) -> list[BucketSteps]:
    """Each bucket's steps and corrupted steps, summed over the runs, by bucket."""
    steps: dict[int, int] = {}
    bad: dict[int, int] = {}
    for r in runs:
        for b in r.buckets:
            steps[b.bucket] = steps.get(b.bucket, 0) + b.steps
            bad[b.bucket] = bad.get(b.bucket, 0) + b.corrupted_steps
    return [BucketSteps(bucket=b, steps=steps[b], corrupted_steps=bad[b]) for b in sorted(steps)]


def summarise(runs: list[ProtocolRun]) -> Protocol:
    return Protocol(
        runs=runs,
        pooled=pool(runs),
        dispersion_p=dispersion_p(runs),
        steps=sum(r.steps for r in runs),
        corrupted_steps=sum(r.corrupted_steps for r in runs),
        bucket_steps=pool_buckets(runs),
    )


def bucket_rows(p: Protocol) -> list[dict[str, Any]]:
    """Table rows: each bucket's pooled steps, corrupted steps and the per-step rate with its Wilson
    95% interval."""
    rows = []
    for b in p.bucket_steps:
        ci = stats.rate(b.corrupted_steps, b.steps)
        rows.append(dict(b.model_dump(), step_rate=ci["rate"], lo=ci["lo"], hi=ci["hi"]))
    return rows


def run(
    runner: Runner,
    workload: Mapping[str, Any],
    seeds: Iterable[int],
    instruments: Callable[[int], Sequence[Instrument]] | None = None,
    progress: Callable[[str], object] | None = print,
    label: str = "",
) -> Protocol:
    """The protocol on `runner` (captured once), one run per seed. instruments(seed) gives the
    instruments of one run (fresh each run, so their records are that run's)."""
    runs = []
    for s in seeds:
        r = _one(runner, workload, s, instruments(s) if instruments else ())
        runs.append(r)
        if progress:
            progress(
                f"{label}protocol seed {s}: {r.corrupted_sessions}/{r.sessions} sessions, "
                f"{r.corrupted_steps}/{r.steps} steps"
            )
    return summarise(runs)


def block(base_seed: int, p: Protocol) -> Block:
    """p, the protocol run from seeds(base_seed, n), as a seed block."""
    return Block(
        base_seed=base_seed,
        runs=p.runs,
        pooled=p.pooled,
        dispersion_p=p.dispersion_p,
        bucket_steps=p.bucket_steps,
    )


def between_blocks_p(blocks: Iterable[Block]) -> float:
    """Whether the seed blocks share one session rate: homogeneity_p of their pooled counts."""
    return homogeneity_p([(b.pooled.corrupted_sessions, b.pooled.sessions) for b in blocks])


def block_rows(blocks: Iterable[Block]) -> list[dict[str, Any]]:
    """Table rows: one per seed block, its runs, pooled rate and interval, the dispersion p."""
    return [
        dict(
            base_seed=b.base_seed,
            runs=" ".join(f"{r.corrupted_sessions}/{r.sessions}" for r in b.runs),
            corrupted_sessions=b.pooled.corrupted_sessions,
            sessions=b.pooled.sessions,
            rate=b.pooled.rate,
            lo=b.pooled.lo,
            hi=b.pooled.hi,
            dispersion_p=b.dispersion_p,
        )
        for b in blocks
    ]


def blocks_verdict(blocks: Sequence[Block]) -> str:
    """One sentence: each block's pooled rate and run range, whether the runs of each block agree,
    and whether the blocks agree with each other."""
    if len(blocks) < 2:
        return "Seed blocks: one (the profile's seed_blocks lists fewer than two), nothing to compare."
    each = "; ".join(
        f"{b.base_seed}: {stats.fmt_rate(b.pooled.corrupted_sessions, b.pooled.sessions)}, runs "
        f"{min(r.corrupted_sessions / r.sessions for r in b.runs):.0%}-"
        f"{max(r.corrupted_sessions / r.sessions for r in b.runs):.0%}, p = {b.dispersion_p:.2g}"
        for b in blocks
    )
    over = [str(b.base_seed) for b in blocks if b.dispersion_p < 0.05]
    within = (
        f"The runs of block(s) {', '.join(over)} spread more than a binomial gives (over-dispersed)"
        if over
        else "No block's runs spread more than a binomial gives"
    )
    p = between_blocks_p(blocks)
    between = (
        f"the blocks differ (chi-square p = {p:.2g}): the rate depends on the seeds drawn"
        if p < 0.05
        else f"the blocks' pooled rates differ no more than chance makes them differ (chi-square p = {p:.2g})"
    )
    head = f"The protocol on {len(blocks)} seed blocks (base seed: pooled, runs, dispersion p)"
    return f"{head} {each}. {within}; {between}."


def describe(p: Protocol) -> str:
    """One sentence: the runs, the pooled rate and what the spread says."""
    each = ", ".join(f"{r.corrupted_sessions}/{r.sessions}" for r in p.runs)
    rows = [r.rows_per_corrupted_step for r in p.runs if r.rows_per_corrupted_step is not None]
    per_step = f"; a corrupted step hit {sum(rows) / len(rows):.1f} sessions on average" if rows else ""
    spread = (
        "more than a binomial at the pooled rate gives (over-dispersed"
        if p.dispersion_p < 0.05
        else "what a binomial at the pooled rate gives (no over-dispersion detected"
    )
    return (
        f"{len(p.runs)} runs: {each} sessions corrupted; pooled "
        f"{stats.fmt_rate(p.pooled.corrupted_sessions, p.pooled.sessions)}, "
        f"{p.corrupted_steps}/{p.steps} steps{per_step}. The run-to-run spread is {spread}, "
        f"chi-square p = {p.dispersion_p:.2g})."
    )


class ConfigProtocol(BaseModel):
    """The protocol on one configuration of the matrix, and what the campaign's fingerprint expects
    of it (the corrupting configuration corrupts; each one-knob change from it stays clean)."""

    index_dtype: str
    mode: str
    overlap: str
    expected: str  # corrupts | clean
    protocol: Protocol

    @property
    def holds(self) -> bool:
        k = self.protocol.pooled.corrupted_sessions
        return k > 0 if self.expected == "corrupts" else k == 0


RACY = ("bf16", "graph", "on")


def configurations(
    index_dtypes: Iterable[str], modes: Sequence[str], overlaps: Sequence[str]
) -> list[tuple[str, str, str]]:
    """The corrupting configuration and each configuration one knob away from it (the campaign's
    toggles), among those the profile lists: the ones the protocol runs."""
    out = []
    for cfg in [(d, m, o) for d in index_dtypes for m in modes for o in overlaps]:
        if sum(a != b for a, b in zip(cfg, RACY)) <= 1:
            out.append(cfg)
    return out


def fingerprint_rows(checks: Iterable[ConfigProtocol]) -> list[dict[str, Any]]:
    """Table rows: one per configuration, its runs, pooled rate and interval, the dispersion p."""
    return [
        dict(
            index_dtype=c.index_dtype,
            mode=c.mode,
            overlap=c.overlap,
            runs=" ".join(str(r.corrupted_sessions) for r in c.protocol.runs),
            corrupted_sessions=c.protocol.pooled.corrupted_sessions,
            sessions=c.protocol.pooled.sessions,
            lo=c.protocol.pooled.lo,
            hi=c.protocol.pooled.hi,
            corrupted_steps=c.protocol.corrupted_steps,
            steps=c.protocol.steps,
            dispersion_p=c.protocol.dispersion_p,
            expected=c.expected,
            holds=c.holds,
        )
        for c in checks
    ]


def headline(checks: Iterable[ConfigProtocol]) -> ConfigProtocol | None:
    """The corrupting configuration's ConfigProtocol, or None when the profile leaves it out."""
    return next((c for c in checks if c.expected == "corrupts"), None)


def verdict(checks: Sequence[ConfigProtocol]) -> str:
    """One sentence for the notebook's verdict: the corrupting configuration's protocol, and
    whether each one-knob change stayed clean."""
    h = headline(checks)
    if h is None:
        return "The campaign's protocol: not run (the profile leaves out bf16 + graph + overlap on)."
    clean = [c for c in checks if c.expected == "clean"]
    broken = [f"{c.index_dtype}/{c.mode}/overlap {c.overlap}" for c in clean if not c.holds]
    tail = (
        f" Clean configurations that corrupted: {', '.join(broken)}."
        if broken
        else f" Each one-knob change ({len(clean)}) stayed clean."
    )
    return f"The campaign's protocol, bf16 + graph + overlap on: {describe(h.protocol)}{tail}"
