"""Notebook 03's forced order: each hazard the audit names in the miniature's captures, replayed with
its losing order forced and compared with eager (nblib.instruments.audit.confirm), bucket by bucket,
on a full batch of long contexts. The buckets are captured as the runner captures them (largest
first, into one shared pool), so the blocks each capture reuses are those the suite's replays meet.
A hazard the protocol's replays never showed (a latent race) is confirmed or not here, from values."""

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from nblib.core import phases
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig
from nblib.instruments import audit
from nblib.instruments.audit import confirm as audit_confirm

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = [
    "ForcedArm",
    "ForcedRow",
    "arm_check",
    "arms_verdict",
    "captured_bucket",
    "confirm_buckets",
    "describe",
    "longest_ctx",
    "table",
]


class ForcedRow(BaseModel):
    """One hazard of one bucket's capture under the forced order."""

    bucket: int
    kind: str
    first_op: str
    first_tensor: str
    second_op: str
    second_tensor: str
    delayed: str
    replays: int
    differing: int
    max_abs: float | None
    nonfinite: bool
    tensor: str | None  # the first value that differed
    natural: int  # of `replays` replays without a delay, those that differed

    @property
    def confirmed(self) -> bool:
        return self.differing > 0


def longest_ctx(workload: Mapping[str, Any]) -> int:
    """Entries a request holds at the end of its last round: its longest context, where the
    indexer's branch runs longest and the race is lost most often."""
    w = WorkloadConfig(**workload)
    return w.ctx_max + w.turn_ctx * (w.rounds - 1) + w.out_max * w.rounds


def _captured(dev, m, buckets, ctx, before=None, bucket=None):
    """A runner over `m` with every bucket's static batch full (build.full_batch), captured under the
    recorder; before(i) is called before each op of `bucket`'s capture (CUDA's forced order)."""
    runner = Runner(m, buckets)
    for b in runner.buckets:
        runner.static[b].fill(*build.full_batch(m, b, ctx=ctx))
    with audit.recording(dev) as rec:
        if before is not None:
            rec.before_op = lambda i: before(i) if rec.label.get("bucket") == bucket else None
        runner.capture(record=rec)
    return runner, rec.report(names=m.captures)


def _bucket(rep, runner, b, recapture=None):
    trace = next(t for t in rep.traces if t.label.get("bucket") == b)
    g, out, topk = runner.graphs[b]
    hazards = [h for h in rep.hazards if h.bucket == b]
    return audit_confirm.Captured(trace, hazards, g, (out, topk), recapture, owner=runner)


def captured_bucket(
    dev: "Device", m: Any, runner: Runner, report: audit.Report, bucket: int, ctx: int | None
) -> audit_confirm.Captured:
    """`bucket`'s capture in `runner` (recorded: report), with the recapture CUDA's forced order
    needs: the same buckets captured again through a Runner (which tells the model's hooks, a
    differential's among them, which bucket they capture) with a spin before the delayed op."""

    def recapture(before):
        r2, rep2 = _captured(dev, m, runner.buckets, ctx, before, bucket)
        return _bucket(rep2, r2, bucket)

    return _bucket(report, runner, bucket, recapture)


def confirm_buckets(
    dev: "Device",
    shapes: Mapping[str, Any],
    buckets: Sequence[int],
    knobs: Mapping[str, Any],
    ctx: int | None,
    replays: int,
) -> list[ForcedRow]:
    """Every bucket's hazards forced `replays` times (audit_confirm.confirm), one row per hazard."""
    m = build.model(dev, shapes, **knobs)
    with phases.phase("audit"):
        runner, rep = _captured(dev, m, buckets, ctx)
    rows = []
    for b in sorted(runner.buckets):
        st = runner.static[b]

        def step(st=st):
            return m.step(*st.args())

        captured = captured_bucket(dev, m, runner, rep, b, ctx)
        if not captured.hazards:
            continue
        with phases.phase("audit"):
            c = audit_confirm.confirm(step, dev, captured, replays=replays)
        rows += [_row(b, h, k, c.natural.differing) for h, k in zip(captured.hazards, c.hazards)]
    return rows


class ForcedArm(BaseModel):
    """Notebook 02: one design's captures under the forced order, in the buckets where off's capture
    has a hazard: the schedules forced (each hazard group's first op delayed, or, with no hazard
    left, each side branch's first op), their replays, and how many differed from eager."""

    buckets: list[int]
    hazards: int  # the design's own hazards in those buckets
    schedules: int
    replays: int
    differing: int

    @property
    def corrupts(self) -> bool:
        return self.differing > 0


def arm_check(
    dev: "Device",
    m: Any,
    runner: Runner,
    report: audit.Report,
    buckets: Iterable[int],
    ctx: int | None,
    replays: int,
) -> ForcedArm:
    """The forced order on a design's runner (captured under the recorder: report), bucket by bucket,
    on full batches of `ctx` entries a request (the runner's static batches are refilled)."""
    hazards = schedules = total = differing = 0
    for b in buckets:
        st = runner.static[b]
        st.fill(*build.full_batch(m, b, ctx=ctx))

        def step(st=st):
            return m.step(*st.args())

        captured = captured_bucket(dev, m, runner, report, b, ctx)
        c = audit_confirm.confirm(step, dev, captured, replays=replays)
        checks = list({k.delayed: k for k in c.hazards}.values()) + c.branches
        hazards += len(captured.hazards)
        schedules += len(checks)
        total += sum(k.replays for k in checks)
        differing += sum(k.differing for k in checks)
    return ForcedArm(
        buckets=list(buckets), hazards=hazards, schedules=schedules, replays=total, differing=differing
    )


def arms_verdict(arms: Iterable[tuple[str, ForcedArm | None]]) -> str:
    """One paragraph: under the forced order, which designs corrupt like the arm without instrument
    (what they did to the rate was timing, the race still there) and which do not (layout or
    lifetime took the race away). arms: (design, ForcedArm) pairs, off first."""
    ran = [(d, f) for d, f in arms if f is not None]
    if not ran or ran[0][0] != "off":
        return ""
    off = ran[0][1]
    where = ", ".join(map(str, off.buckets)) or "none"
    head = (
        f"Under the forced order (buckets {where}: each hazard's first op delayed past the other, or "
        f"each side branch's first op where a design left no hazard), off differs from eager in "
        f"{off.differing} of {off.replays} replays."
    )
    if not off.corrupts:
        return head + " The forced order does not corrupt off, so it separates no mechanism here."
    like = [d for d, f in ran[1:] if f.corrupts]
    not_ = [d for d, f in ran[1:] if not f.corrupts]
    s = head
    if like:
        one = len(like) == 1
        s += (
            f" {', '.join(like)} corrupt{'s' * one} like off: the race is still in "
            f"{'its' if one else 'their'} graphs, so a change in {'its' if one else 'their'} rate can only "
            "come from timing."
        )
    if not_:
        s += (
            f" {', '.join(not_)} stay{'s' * (len(not_) == 1)} equal to eager: the race is gone from "
            f"{'its' if len(not_) == 1 else 'their'} graphs (layout or lifetime), not merely less likely."
        )
    return s


def _row(bucket, h, k, natural):
    r = h.row()
    sides = {f: r[f] for f in ("first_op", "first_tensor", "second_op", "second_tensor")}
    check = k.model_dump(include={"delayed", "replays", "differing", "max_abs", "nonfinite", "tensor"})
    return ForcedRow(bucket=bucket, kind=h.kind, natural=natural, **sides, **check)


def table(rows: Iterable[ForcedRow]) -> list[dict[str, Any]]:
    """One row per (bucket, delayed op): the hazards that share that forced schedule, the tensors on
    their other side, and the forced and natural replays that differed from eager."""
    groups: dict[tuple[int, str], list[ForcedRow]] = {}
    for r in rows:
        groups.setdefault((r.bucket, r.delayed), []).append(r)
    return [
        dict(
            bucket=b,
            delayed=delayed,
            reads_or_writes=rs[0].first_tensor,
            hazards=len(rs),
            against=", ".join(sorted({x.second_tensor for x in rs})),
            forced=f"{rs[0].differing}/{rs[0].replays}",
            natural=f"{rs[0].natural}/{rs[0].replays}",
            confirmed=rs[0].confirmed,
        )
        for (b, delayed), rs in sorted(groups.items())
    ]


def describe(rows: Sequence[ForcedRow], corrupted_buckets: Iterable[int] = ()) -> str:
    """One paragraph: which delayed ops change values under the forced order, in which buckets, the
    latent ones among them (corrupted_buckets: those whose protocol replays corrupted)."""
    if not rows:
        return "The audit names no hazard in these captures: nothing to force."
    t = table(rows)
    yes = [r for r in t if r["confirmed"]]
    by = sorted({r["bucket"] for r in yes})
    s = (
        f"Under the forced order (the op issued first delayed, so the other runs before it), "
        f"{sum(r.confirmed for r in rows)} of {len(rows)} hazards change the step's values"
    )
    if not yes:
        return s + ": no value depends on the orders the audit names."
    ops: dict[tuple[str, str], list[int]] = {}
    for r in yes:
        ops.setdefault((r["delayed"].split(" (")[0], r["reads_or_writes"]), []).append(r["bucket"])
    s += ": " + "; ".join(f"{op} on {t_} delayed (bucket{'s' * (len(bs) > 1)} {', '.join(map(str, bs))})"
                          for (op, t_), bs in ops.items())  # fmt: skip
    latent = [b for b in by if b not in set(corrupted_buckets)]
    if latent:
        s += (
            f". In bucket{'s' * (len(latent) > 1)} {', '.join(map(str, latent))} the protocol's replays "
            "never corrupted a step: a latent race, real, lost only when the side branch runs late"
        )
    no = [r for r in t if not r["confirmed"]]
    if no:
        s += f". {len(no)} forced schedule(s) left every value equal to eager"
    return s + "."
