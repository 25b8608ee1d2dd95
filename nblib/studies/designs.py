"""The graph-vs-eager differential in several designs, each measured on the campaign's protocol.

The campaign turned its differential on and the corruption nearly vanished, with zero divergence in
every comparison; it could only ask "layout or timing?". Here each arm runs the same protocol (the
same seeds, so the same sessions and replay-timing draws) and records, on the captures it ran:

  the rate      sessions corrupted, Wilson interval, Fisher's p against the arm without instrument
  what it saw   comparisons and divergences (a differential), after every replay
  layout        the capture audit's hazards and aliasing pairs per bucket: which blocks the
                allocator handed on, so what can race at all (an instrument that allocates or keeps
                blocks in the graph pool changes this)
  timing        the side branch (indexer, the instrument's side-stream work, top-k) and the main
                branch (the instrument's main-stream work, trunk, MLP), each captured alone and timed
                on a full batch: the race's window is how long the side branch still reads after the
                main branch starts writing
  planted       one capture with a planted divergence (model.plant_divergence): does the design see it

Arms: "off" (no instrument), "canary" (the campaign's baseline ran with it: eager checksums around
each replay, nothing captured), and the differential's DESIGNS.

    result = designs.compare(dev, shapes, buckets, workload, seeds)
    result.arms, designs.explain(result)   # the why: nblib.studies.design_evidence
"""

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from nblib.core import phases, stats
from nblib.engine import build, references
from nblib.engine.runner import Runner
from nblib.instruments import audit
from nblib.instruments.canary import Canary
from nblib.instruments.gediff import DESIGNS, GEDiff
from nblib.instruments.overhead import timed, timer, warmups
from nblib.studies import protocol
from nblib.studies.design_evidence import Explanation, Finding, campaign_sentence, explain, verdict
from nblib.studies.forced import ForcedArm, arm_check

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = [
    "ARMS", "COLUMNS", "Arm", "Designs", "Explanation", "Finding", "Mechanism", "branch_ms",
    "bucket_table", "campaign_sentence", "check_arms", "compare", "explain",
    "planted_caught", "run_arm", "verdict",
]  # fmt: skip

ARMS = ("off", "canary", *DESIGNS)
ARM_NOTES = {
    "off": "no instrument",
    "canary": "the canary alone: eager checksums of the index-K pages around each replay",
    **DESIGNS,
}


# the designs table, as notebook 02, its live panel and the writeup show it
COLUMNS = [
    "design", "runs", "corrupted_sessions", "sessions", "lo", "hi", "fisher_p", "dispersion_p",
    "comparisons", "diverged", "max_abs", "planted_caught", "hazards", "pairs",
]  # fmt: skip


def check_arms(arms: Iterable[str]) -> list[str]:
    bad = [a for a in arms if a not in ARMS]
    if bad or "off" not in arms:
        raise ValueError(f"arms must include 'off' and come from {', '.join(ARMS)}; got {list(arms)}")
    return list(arms)


class Mechanism(BaseModel):
    """One bucket of one arm's captures: the audit's hazards and aliasing pairs, the bytes in blocks
    the capture allocated and still held at its end, and each branch timed alone (ms; `method` says how)."""

    bucket: int
    hazards: int
    pairs: list[str]
    side_ms: float
    main_ms: float
    kept_bytes: int = 0


class Arm(BaseModel):
    design: str
    description: str
    sessions: int
    corrupted_sessions: int
    rate: float
    lo: float
    hi: float
    fisher_p: float | None  # against "off"; None for "off" itself
    runs: list[int]  # corrupted sessions per run
    dispersion_p: float
    steps: int
    corrupted_steps: int
    comparisons: int
    diverged: int
    max_abs: float
    planted_caught: bool | None  # None: not a differential
    hazards: int  # summed over buckets
    pairs: int  # aliasing pairs summed over buckets
    side_ms: dict[int, float]
    main_ms: dict[int, float]
    buckets: list[Mechanism]
    bucket_steps: list[protocol.BucketSteps] = []  # pooled over the runs: where the engine replayed
    kept_bytes: int = 0  # summed over buckets
    mechanism: str | None = None  # what carries its effect against off (design_evidence.MECHANISMS)
    forced: ForcedArm | None = None  # its captures under the forced order (forced_replays > 0)
    lines: list[str] = Field(default_factory=list, exclude=True)  # one log line per comparison


class Designs(BaseModel):
    arms: list[Arm]
    seeds: list[int]
    method: str  # how the branches were timed

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.design == name)


def _pairs(report, bucket):
    rows = [h.row() for h in report.by("bucket").get(bucket, [])]
    return sorted({f"{r['first_tensor']} / {r['second_tensor']}" for r in rows})


def _graph_ms(dev, fn, replays, warmup):
    """fn captured alone in a graph of its own pool, replayed: median ms and the method."""
    method, measure = timer(dev)
    g = dev.CUDAGraph()
    with dev.graph(g, pool=dev.graph_pool_handle()):
        fn()
    if hasattr(g, "expected_seconds"):  # the simulator: its calibrated timing model, without jitter
        return 1e3 * g.expected_seconds(), "simulated (the calibrated timing model, without jitter)"
    return statistics.median(timed(measure, g.replay, replays, warmups(dev, warmup, cuda=3))), method


def branch_ms(
    dev: "Device",
    m: Any,  # a DecodeModel: its weights (embed, w_q, w_head) are attributes set from its weight set
    bucket: int,
    replays: int = 20,
    warmup: int | None = None,
    seed: int = 0,
    ctx: int | None = None,
) -> tuple[float, float, str]:
    """The side branch (indexer with the instrument's hook, top-k) and the main branch (the
    instrument's main-stream hook, trunk, MLP), each alone on a full batch of `bucket` requests of
    `ctx` entries (None or 0: half the longest context)."""
    tokens, table, lens, _ = build.full_batch(m, bucket, seed, ctx)
    x = m.embed[tokens]
    q = (x @ m.w_q).view(-1, m.cfg.heads, m.cfg.dim)
    w = (x @ m.w_head).float()

    def main():
        if m.gediff is not None:
            m.gediff.before_fork(q, w, table, lens)
        m.main_branch(x)

    m.bucket = bucket
    try:
        main_ms, method = _graph_ms(dev, main, replays, warmup)
        side_ms, _ = _graph_ms(dev, lambda: m.indexer(q, w, table, lens, None), replays, warmup)
    finally:
        m.bucket = None
    return side_ms, main_ms, method


def planted_caught(
    dev: "Device",
    shapes: Mapping[str, Any],
    knobs: Mapping[str, Any],
    design: str,
    bucket: int,
    seed: int = 0,
) -> bool:
    """Capture `bucket` with a planted divergence (model.plant_divergence) and this design attached,
    replay one full batch: does the comparison report it?"""
    m = build.model(dev, shapes, **knobs)
    m.plant_divergence = True
    gd = GEDiff(m, design=design)
    runner = Runner(m, [bucket]).capture()
    batch = build.full_batch(m, bucket, seed, ctx=min(m.cfg.max_ctx // 4, 4 * m.cfg.topk))
    runner.run(*batch)
    return bool(gd.compare(bucket, rows=bucket)["diverged"])


def _instruments(arm, m, gd):
    if arm == "canary":
        return lambda seed: [Canary(m, seed=seed)]
    if gd is not None:
        return lambda seed: [gd]
    return None


def _kept(report):
    """Per bucket: bytes in blocks allocated during its capture and not freed by the capture's end."""
    return {t.label.get("bucket"): sum(a.nbytes for a in t.allocs if not a.freed) for t in report.traces}


def _mechanisms(dev, m, report, buckets, replays, seed, ctx):
    out, method, kept = [], "", _kept(report)
    for b in sorted(buckets):
        side, main, method = branch_ms(dev, m, b, replays, seed=seed, ctx=ctx)
        out.append(
            Mechanism(
                bucket=b,
                hazards=len(report.by("bucket").get(b, [])),
                pairs=_pairs(report, b),
                side_ms=side,
                main_ms=main,
                kept_bytes=kept.get(b, 0),
            )
        )
    return out, method


def run_arm(
    dev: "Device",
    shapes: Mapping[str, Any],
    buckets: Sequence[int],
    workload: Mapping[str, Any],
    arm: str,
    seeds: Sequence[int],
    knobs: Mapping[str, Any],
    replays: int = 20,
    progress: Callable[[str], object] | None = print,
    ctx: int | None = None,
    forced_in: tuple[Sequence[int] | None, int] | None = None,
) -> tuple[protocol.Protocol, GEDiff | None, list[Mechanism], str, ForcedArm | None]:
    """One arm: capture every bucket once under the audit, run the protocol on those graphs, then
    measure the branches on full batches of `ctx` entries a request (branch_ms). forced_in:
    (buckets, replays) to replay under the forced order (forced.arm_check), None: none. Returns
    (protocol.Protocol, differential or None, mechanisms, method, forced.ForcedArm or None)."""
    m = build.model(dev, shapes, **knobs)
    gd = GEDiff(m, design=arm) if arm in DESIGNS else None
    with audit.recording(dev) as rec:
        runner = Runner(m, buckets, references=references.shared()).capture(record=rec)
    with phases.phase("audit"):
        report = rec.report(names=m.captures)
    proto = protocol.run(runner, workload, seeds, _instruments(arm, m, gd), progress, label=f"{arm}: ")
    with phases.phase("timing"):
        mech, method = _mechanisms(dev, m, report, buckets, replays, seeds[0], ctx)
    held = None
    if forced_in is not None:
        where = forced_in[0] if forced_in[0] is not None else sorted({h.bucket for h in report.hazards})
        with phases.phase("audit"):
            held = arm_check(dev, m, runner, report, where, ctx or 2048, forced_in[1])
    return proto, gd, mech, method, held


def _arm(name, proto, gd, mech, off, planted):
    p = proto.pooled
    summary = gd.summary() if gd is not None else dict(comparisons=0, diverged=0, max_abs=0.0)
    return Arm(
        design=name,
        description=ARM_NOTES[name],
        sessions=p.sessions,
        corrupted_sessions=p.corrupted_sessions,
        rate=p.rate,
        lo=p.lo,
        hi=p.hi,
        fisher_p=None
        if off is None
        else stats.fisher(off.corrupted_sessions, off.sessions, p.corrupted_sessions, p.sessions)["p"],
        runs=[r.corrupted_sessions for r in proto.runs],
        dispersion_p=proto.dispersion_p,
        steps=proto.steps,
        corrupted_steps=proto.corrupted_steps,
        comparisons=summary["comparisons"],
        diverged=summary["diverged"],
        max_abs=summary["max_abs"],
        planted_caught=planted,
        hazards=sum(x.hazards for x in mech),
        pairs=sum(len(x.pairs) for x in mech),
        side_ms={x.bucket: x.side_ms for x in mech},
        main_ms={x.bucket: x.main_ms for x in mech},
        buckets=mech,
        bucket_steps=proto.bucket_steps,
        kept_bytes=sum(x.kept_bytes for x in mech),
        lines=[f"{name}: {line}" for line in (gd.lines if gd is not None else [])],
    )


def compare(
    dev: "Device",
    shapes: Mapping[str, Any],
    buckets: Sequence[int],
    workload: Mapping[str, Any],
    seeds: Sequence[int],
    arms: Iterable[str] = ARMS,
    knobs: Mapping[str, Any] | None = None,
    replays: int = 20,
    progress: Callable[[str], object] | None = print,
    ctx: int | None = None,
    forced_replays: int = 0,
) -> Designs:
    """Every arm on the protocol; the differential designs also get the planted check (at the
    largest bucket). knobs: index_dtype, overlap, logits_policy (default bf16, on, transient).
    ctx: entries a request in the batches the branches are measured on (branch_ms).
    forced_replays > 0: each arm also replayed under the forced order in the buckets where off's
    capture has a hazard (Arm.forced)."""
    arms = check_arms(arms)
    knobs = dict(dict(index_dtype="bf16", overlap="on", logits_policy="transient"), **(knobs or {}))
    out, off, method = [], None, ""
    for name in ["off"] + [a for a in arms if a != "off"]:
        where: list[int] | None = None if off is None else off.forced.buckets if off.forced else None
        proto, gd, mech, method, held = run_arm(
            dev, shapes, buckets, workload, name, seeds, knobs, replays, progress, ctx,
            forced_in=(where, forced_replays) if forced_replays else None,
        )  # fmt: skip
        planted = planted_caught(dev, shapes, knobs, name, max(buckets)) if name in DESIGNS else None
        arm = _arm(name, proto, gd, mech, off, planted)
        arm.forced = held
        off = off or arm
        out.append(arm)
        if progress:
            progress(
                f"{name}: {stats.fmt_rate(arm.corrupted_sessions, arm.sessions)}"
                + (f", Fisher p {arm.fisher_p:.2g}" if arm.fisher_p is not None else "")
                + (f", {arm.diverged}/{arm.comparisons} diverged" if name in DESIGNS else "")
            )
    result = Designs(arms=out, seeds=list(seeds), method=method)
    for f in explain(result).findings:
        result.arm(f.design).mechanism = f.mechanism
    return result


def bucket_table(result: Designs) -> list[dict[str, Any]]:
    """Per bucket: each arm's steps there, pooled over its runs, as 'corrupted/steps' (off first): whether
    an instrument moved the engine to other buckets."""
    buckets = sorted({b.bucket for a in result.arms for b in a.bucket_steps})
    rows = []
    for x in buckets:
        row: dict[str, Any] = dict(bucket=x)
        for a in result.arms:
            b = next((b for b in a.bucket_steps if b.bucket == x), None)
            row[a.design] = f"{b.corrupted_steps}/{b.steps}" if b else "0/0"
        rows.append(row)
    return rows
