"""Confirm a hazard by forcing its losing order: `python -m nblib audit TARGET --confirm`.

The audit names two ops that the graph may run in either order. Whether the order matters is a
question of values, so each hazard is replayed with the order it does not expect forced:

- a delay is queued on the stream of the op issued first, just before that op, long enough that
  the other op runs first (CUDA: a spin kernel captured into a new capture of the step; the
  simulator: that node starts later in the replay's schedule, as behind a spin kernel);
- the bytes the hazard names are filled with a sentinel (0xFF: NaN in every float type) before each
  forced replay, unless they are persistent state, so a stale read cannot pass for a right one;
- the persistent state the step writes (every range outside the capture's pool that an op writes)
  is saved once and restored before each run, so the eager reference and every replay start alike;
- after each replay, that state and the step's return value are compared with one eager run of the
  step, in host order (`dev.serial()`), from the same state. A float value that differs from eager's
  only within rounding (torch.testing's default tolerance for its dtype: a captured kernel may sum in
  another order than its eager twin, or use atomics) is counted apart, as rounding, not as a
  difference; a sentinel or a stale read is far outside it.

The step is run eagerly twice first: a step whose two eager runs differ (it draws random numbers, or
reads bytes it never wrote) gives no reference a replay could be compared with, so nothing is forced
and every hazard reads "undecided", never confirmed.

A lost race can break the step instead of changing a value: an index read before it was written
points outside its table, and the op's own check raises (on CUDA a device-side assert, which ends the
process's CUDA context). A replay that raises counts as one that differs, with the error named. On
CUDA the context cannot be used after such an error: the checks after it do not run, and the report
says where the context ended.

A hazard is confirmed when at least one of its forced replays differs from eager. A target with no
hazard has each side branch's first op delayed the same way: a fixed form stays equal to eager. The
same count without any delay (natural replays) comes with it. The forced delay belongs to this
check alone: no rate the suite reports as the bug's own ever comes from a forced replay.
"""

import time
from dataclasses import dataclass

from pydantic import BaseModel

from nblib.instruments import audit as A
from nblib.instruments.audit.report import one_line
from nblib.instruments.audit.step_values import (
    Difference,
    StepState,
    beyond_rounding,
    differences,
    persistent_writes,
    same_bits,
)

__all__ = [
    "Captured",
    "Check",
    "ConfirmReport",
    "Difference",
    "StepState",
    "beyond_rounding",
    "confirm",
    "context_lost",
    "differences",
    "persistent_writes",
    "same_bits",
]

SENTINEL = 0xFF
MAX_BRANCHES = 8  # side branches delayed in turn on a target with no hazard


class Check(BaseModel):
    """N replays of the captured step, each compared with the eager reference."""

    delayed: str | None  # the op delayed ('aten::mm (op 3) on side'), None for natural replays
    delay_us: float = 0.0
    replays: int
    differing: int
    max_abs: float | None = None  # the largest finite |graph - eager| over every replay
    nonfinite: bool = False  # a replay's value held NaN or inf where eager's did not
    tensor: str | None = None  # the first value that differed
    rounding: int = 0  # replays whose values differ from eager's only within rounding
    rounding_max_abs: float | None = None  # the largest such |graph - eager|
    raised: int = 0  # replays that raised (counted in differing): the order broke the step
    error: str | None = None  # the first such error, one line; or why the check did not run

    @property
    def confirmed(self):
        return self.differing > 0

    def sentence(self):
        if not self.replays and self.error:
            return self.error
        if self.raised:
            n, of = self.differing, self.replays
            return f"{n} of {of} replays differ from eager ({self.raised} raised: {self.error})"
        if not self.differing:
            s = f"0 of {self.replays} replays differ from eager"
            if self.rounding:
                s += (
                    f" beyond rounding ({self.rounding} differ by at most {self.rounding_max_abs:.3g}, "
                    "within the dtype's tolerance)"
                )
            return s
        diff = f"max |diff| {self.max_abs:.3g}" if self.max_abs is not None else "no finite difference"
        nan = ", non-finite values (the sentinel or a stale read)" if self.nonfinite else ""
        n, of = self.differing, self.replays
        return f"{n} of {of} replays differ from eager ({diff}{nan}; first {self.tensor})"


class ConfirmReport(BaseModel):
    """Every hazard's forced check (in the audit's order), or each side branch's on a clean target,
    and the natural replays."""

    replays: int
    natural: Check
    # the first value in which the step's two eager runs differ: None, the step is deterministic;
    # else no replay is compared (every check has no replays) and nothing is confirmed
    eager_differs: str | None = None
    hazards: list[Check] = []
    branches: list[Check] = []  # a target with no hazard: each side branch delayed in turn
    compared: int = 0  # values compared after each run: the step's returned tensors, persistent ranges
    seconds: float = 0.0
    # CUDA: the schedule whose replay ended the process's CUDA context (a device-side assert); the
    # checks after it did not run. None: every check ran
    context_lost: str | None = None

    def lines(self):
        if not self.compared:
            return [
                "nothing to compare: the step returns no tensor and writes no memory outside the "
                "capture's pool; return its output (or copy it into a buffer made before capture) so "
                "--confirm can see it"
            ]
        if self.eager_differs is not None:
            return [
                f"undecided: two eager runs of the step differ from each other (first {self.eager_differs}): "
                "it draws random numbers or reads bytes it never wrote, so no replay can be compared "
                "with eager; make the step deterministic (a fixed generator state restored before each "
                "run) to confirm its hazards"
            ]
        out = [f"natural replays: {self.natural.sentence()}"]
        if self.context_lost:
            out.append(
                f"the CUDA context ended at {self.context_lost}: a lost race broke a kernel's own check "
                "(a device-side assert); the checks after it did not run, and this process cannot use "
                "the GPU again"
            )
        for i, c in enumerate(self.hazards, 1):
            if not c.replays:
                out.append(f"hazard {i} not checked: {c.sentence()} ({c.delayed} to be delayed)")
                continue
            verdict = "confirmed" if c.confirmed else "not confirmed"
            why = "" if c.confirmed else ": no value depends on this order (the second op first)"
            out.append(f"hazard {i} {verdict}: {c.sentence()} with {c.delayed} delayed{why}")
        for c in self.branches:
            out.append(f"forced: {c.delayed} delayed {c.delay_us:.0f} us: {c.sentence()}")
        return out


@dataclass
class Captured:
    """One captured step: its trace, the audit's hazards in it, the graph and its static outputs.
    recapture(before_op) -> Captured captures the step again with before_op called before each op
    is queued (CUDA's forced order); None: capture `step` alone (audit.audit_capture)."""

    trace: object
    hazards: list
    graph: object
    result: object
    recapture: object = None
    # what owns the graph's static inputs (a runner): a graph replays from their addresses, so they
    # must live as long as it does, or the allocator hands their bytes to the next tensor
    owner: object = None

    @classmethod
    def of(cls, report):
        """From an audit_target.TargetReport or the audit.Report of audit.audit_capture."""
        rep = report.audit_report if hasattr(report, "audit_report") else report
        return cls(rep.traces[0], rep.hazards, rep.graph, rep.result)


class _ContextLost(Exception):
    """A replay ended the CUDA context; `check`: the check it belongs to, as far as it got."""

    def __init__(self, check):
        super().__init__(check.delayed or "natural replays")
        self.check = check


def context_lost(dev, error):
    """Whether `error`, raised by a replay on `dev`, leaves the device unusable: on CUDA a kernel's
    device-side assert or an illegal address is sticky, and every later call fails with it."""
    return dev.name == "cuda" and "CUDA error" in str(error)


def _delayed_name(target):
    """How a check names what it delays: the op of a hazard group or a side branch's head, None
    for natural replays."""
    op = target[0].first if isinstance(target, list) and target else target
    return None if op is None else f"{op.name} (op {op.index}) on {op.stream}"


class _Tally:
    def __init__(self, replays, delayed=None, delay_s=0.0):
        self.check = Check(delayed=delayed, delay_us=delay_s * 1e6, replays=replays, differing=0)

    def fail(self, error):
        """A replay that raised: the forced order broke the step, which eager ran."""
        c = self.check
        c.raised += 1
        c.differing += 1
        c.error = c.error or one_line(error)

    def add(self, got, want):
        c, every = self.check, differences(got, want)
        diffs = [d for d in every if not d.rounding]
        if every and not diffs:
            c.rounding += 1
            m = max((d.max_abs for d in every if d.max_abs is not None), default=0.0)
            c.rounding_max_abs = max(m, c.rounding_max_abs or 0.0)
        for d in diffs:
            c.tensor = c.tensor or d.name
            c.nonfinite = c.nonfinite or d.nonfinite
            if d.max_abs is not None:
                c.max_abs = d.max_abs if c.max_abs is None else max(c.max_abs, d.max_abs)
        c.differing += bool(diffs)


def confirm(step, dev, report, replays=20):
    """Force each hazard of `report` (an audit_target.TargetReport of `step` on `dev`, the
    audit.Report of audit.audit_capture(step), or a Captured) `replays` times and compare with
    eager; on a target with no hazard, delay each side branch instead."""
    if replays < 1:
        raise ValueError(f"replays must be at least 1, got {replays}")
    t0 = time.perf_counter()
    rep = report if isinstance(report, Captured) else Captured.of(report)
    trace = rep.trace
    state = StepState(dev, persistent_writes(trace))
    lost = None
    try:
        want = state.values(_eager(step, dev, state))
        again = state.values(_eager(step, dev, state), copy=False)
        unequal = [d.name for d in differences(again, want) if not d.rounding]
        if unequal:
            return _undecided(rep, replays, len(want), unequal[0], t0)
        groups = {}  # hazards whose first op is the same share one forced schedule
        for h in rep.hazards:
            groups.setdefault(h.first.index, []).append(h)
        heads = [] if rep.hazards else side_branch_heads(trace)[:MAX_BRANCHES]
        plan = [None, *groups.values(), *heads]
        done, lost = _run_plan(_Forcing(step, dev, rep), state, want, replays, plan)
    finally:
        if lost is None:  # a lost CUDA context cannot be written to
            state.restore()
    by_group = dict(zip(groups, done[1 : 1 + len(groups)]))
    return ConfirmReport(
        replays=replays,
        natural=done[0],
        hazards=[by_group[h.first.index] for h in rep.hazards],
        branches=done[1 + len(groups) :],
        compared=len(want),
        seconds=round(time.perf_counter() - t0, 3),
        context_lost=lost,
    )


def _run_plan(force, state, want, replays, plan):
    """Each target's check in turn; after a replay that ends the CUDA context, the rest are marked
    not run. Returns (checks, where the context ended or None)."""
    done = []
    for target in plan:
        try:
            done.append(force.run(state, want, replays, target))
        except _ContextLost as e:
            done.append(e.check)
            lost = e.check.delayed or "a natural replay"
            why = f"not run: the CUDA context ended at {lost}"
            rest = [
                Check(delayed=_delayed_name(t), replays=0, differing=0, error=why) for t in plan[len(done) :]
            ]
            return done + rest, lost
    return done, None


def _eager(step, dev, state):
    """The step run eagerly in host order from the saved state; its return value."""
    state.restore()
    with dev.serial():
        result = step()
    dev.synchronize()
    return result


def _undecided(rep, replays, compared, first, t0):
    """A step whose eager runs differ: each hazard's check without replays, so none is confirmed."""
    none = lambda: Check(delayed=None, replays=0, differing=0)  # noqa: E731
    return ConfirmReport(
        replays=replays,
        natural=none(),
        eager_differs=first,
        hazards=[none() for _ in rep.hazards],
        compared=compared,
        seconds=round(time.perf_counter() - t0, 3),
    )


def side_branch_heads(trace):
    """The first op of each side-stream branch: on a stream other than the capture's, the stream's
    first op or the first after a wait."""
    main = trace.ops[0].stream if trace.ops else None
    fresh, heads = set(), []
    for e in trace.events:
        if e.kind == "wait":
            fresh.discard(e.stream)
        elif e.kind == "op":
            op = e.op
            if op.stream != main and op.stream not in fresh:
                heads.append(op)
            fresh.add(op.stream)
    return heads


class _Forcing:
    """Replays of the step with one op delayed: the audit's graph on the simulator (the delay is a
    later start in the replay's schedule), a new capture with a spin kernel before that op on CUDA."""

    def __init__(self, step, dev, rep):
        self.step, self.dev, self.rep = step, dev, rep
        self.delay = 2 * self._span() + 50e-6

    def _span(self):
        g = self.rep.graph
        if self.dev.name == "sim":
            return g.expected_seconds()
        start, end = self.dev.Event(enable_timing=True), self.dev.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return min(start.elapsed_time(end) * 1e-3, 0.01)

    def run(self, state, want, replays, target):
        """`replays` replays with `target` forced: hazards that share their first op (that op is
        delayed and all their pool bytes hold the sentinel), an op (a side branch's first), or
        None (natural replays). A _Tally's Check."""
        hazards = target if isinstance(target, list) else []
        op = hazards[0].first if hazards else target
        tally = _Tally(replays, _delayed_name(target), self.delay if op is not None else 0.0)
        # the Captured, not only its graph: what it owns (the recaptured runner's static inputs)
        # must stay alive while the graph replays from their addresses
        cap, sentinels = self._graph(op, hazards)
        g, result = cap.graph, cap.result
        for i in range(replays):
            state.restore()
            for lo, n in sentinels:
                self.dev.bytes_at(lo, n).fill_(SENTINEL)
            try:
                if op is not None and self.dev.name == "sim":
                    g.replay(delays={op.index: self.delay})
                else:
                    g.replay()
                self.dev.synchronize()
            except Exception as e:  # the order broke the step: its error is the finding
                tally.fail(e)
                if context_lost(self.dev, e):
                    tally.check.replays = i + 1  # the replays that ran
                    raise _ContextLost(tally.check) from e
                continue
            tally.add(state.values(result, copy=False), want)
        return tally.check

    def _graph(self, op, hazards):
        """(the Captured to replay, the sentinels' (addr, nbytes)) for one forced order."""
        rep = self.rep
        if op is None or self.dev.name == "sim":
            return rep, _sentinels(hazards)
        dev, index, delay = self.dev, op.index, self.delay

        def before(i):
            if i == index:
                dev.spin(delay)

        if rep.recapture is not None:
            again = rep.recapture(before)
        else:
            again = Captured.of(A.audit_capture(self.step, device=dev, before_op=before))
        same = [h for h in again.hazards if any(_same(h, x) for x in hazards)]
        return again, _sentinels(same)


def _same(a, b):
    return (a.first.index, a.second.index, a.kind) == (b.first.index, b.second.index, b.kind)


def _sentinels(hazards):
    """Each hazard's bytes whose both sides are the pool's (persistent bytes are restored instead)."""
    pool = {(h.lo, h.nbytes) for h in hazards if h.first_access.alloc and h.second_access.alloc}
    return sorted(pool)
