"""Notebook 03's forced order: each hazard the audit names in the miniature's captures, replayed with
its losing order forced and compared with eager (nblib.instruments.audit_confirm), bucket by bucket,
on a full batch of long contexts. The buckets are captured as the runner captures them (largest
first, into one shared pool), so the blocks each capture reuses are those the suite's replays meet.
A hazard the protocol's replays never showed (a latent race) is confirmed or not here, from values."""

from pydantic import BaseModel

from nblib.core import phases
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig
from nblib.instruments import audit, audit_confirm

__all__ = ["ForcedRow", "confirm_buckets", "describe", "longest_ctx"]


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
    def confirmed(self):
        return self.differing > 0


def longest_ctx(workload):
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
    return audit_confirm.Captured(trace, hazards, g, (out, topk), recapture)


def confirm_buckets(dev, shapes, buckets, knobs, ctx, replays) -> list[ForcedRow]:
    """Every bucket's hazards forced `replays` times (audit_confirm.confirm), one row per hazard."""
    m = build.model(dev, shapes, **knobs)
    with phases.phase("audit"):
        runner, rep = _captured(dev, m, buckets, ctx)
    rows = []
    for b in sorted(runner.buckets):
        st = runner.static[b]

        def step(st=st):
            return m.step(*st.args())

        def recapture(before, b=b):
            r2, rep2 = _captured(dev, m, buckets, ctx, before, b)
            return _bucket(rep2, r2, b)

        captured = _bucket(rep, runner, b, recapture)
        if not captured.hazards:
            continue
        with phases.phase("audit"):
            c = audit_confirm.confirm(step, dev, captured, replays=replays)
        rows += [_row(b, h, k, c.natural.differing) for h, k in zip(captured.hazards, c.hazards)]
    return rows


def _row(bucket, h, k, natural):
    r = h.row()
    return ForcedRow(
        bucket=bucket,
        kind=h.kind,
        first_op=r["first_op"],
        first_tensor=r["first_tensor"],
        second_op=r["second_op"],
        second_tensor=r["second_tensor"],
        delayed=k.delayed,
        replays=k.replays,
        differing=k.differing,
        max_abs=k.max_abs,
        nonfinite=k.nonfinite,
        tensor=k.tensor,
        natural=natural,
    )


def table(rows):
    """One row per (bucket, delayed op): the hazards that share that forced schedule, the tensors on
    their other side, and the forced and natural replays that differed from eager."""
    groups = {}
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


def describe(rows, corrupted_buckets=()):
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
    ops = {}
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
