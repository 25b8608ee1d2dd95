"""The audit's zoo: small multi-stream capture scenarios, each a planted race with a correctly
synchronised twin, runnable on both backends through the device facade.

    rows = audit_zoo.run(dev)                 # every case, race and twin, plain and audited
    [r for r in rows if not r.right]          # wrong verdicts (the goal: none, and no false alarm)

Each case builds its persistent tensors and streams outside the capture and returns the functions
to capture (usually one; two for the shared-pool case), all captured into one graph pool. `racy`
picks the planted race or its twin; the twin differs by the one sync (or layout) that fixes it.
Every race here arises from the real mechanism: unordered kernels on two streams touching the same
bytes, sometimes through the caching allocator handing a freed block to the next tensor.

Each scenario is captured twice, without and with the recorder: a capture that succeeds plainly
must succeed audited too (the audit never breaks a legal capture), and the audited verdict must be
the expected one: a race of the expected kind for the planted case, nothing for its twin.
"""

import traceback
from dataclasses import dataclass, field

import torch

from nblib.instruments import audit

N = 4096  # floats per tensor: 16 KiB, the allocator's small pool
RAW, WAR, WAW = "read-after-write", "write-after-read", "write-after-write"


@dataclass(frozen=True)
class Case:
    name: str
    covers: str  # which pattern of issue 13's list
    kinds: tuple  # hazard kinds the planted race shows (any one of them is right)
    build: object  # build(dev, racy) -> [fn, ...] to capture in order, into one pool


CASES = []


def case(covers, *kinds):
    def register(build):
        CASES.append(Case(build.__name__, covers, kinds, build))
        return build

    return register


def _zeros(dev, *shape):
    return torch.zeros(*shape, device=dev.torch_device)


def _empty(dev, *shape):
    return torch.empty(*shape, device=dev.torch_device)


def _fork(dev, *streams):
    main = dev.current_stream()
    for s in streams:
        s.wait_stream(main)
    return main


def _join(main, *streams):
    for s in streams:
        main.wait_stream(s)


# ------------------------------------------------------------------------------------------------
# allocator reuse
# ------------------------------------------------------------------------------------------------


@case("allocator reuse after a free before the join", WAR)
def reuse_free_before_join(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        t = x * 2  # allocated on main
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1  # read on side
        if not racy:
            main.wait_stream(side)
        del t  # freed: racy, before the side stream is joined
        u = _empty(dev, N)  # main's next tensor gets t's bytes
        u.fill_(-1.0)
        main.wait_stream(side)
        return r, u

    return [fn]


@case("allocator reuse with record_stream", WAR)
def reuse_record_stream(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        t = x * 2
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1
        dev.record_stream(t, main if racy else side)  # racy: names the wrong stream (a no-op)
        del t
        u = _empty(dev, N)
        u.fill_(-1.0)
        main.wait_stream(side)
        return r, u

    return [fn]


@case("a tensor allocated on one side stream and freed on another", WAR)
def reuse_across_side_streams(dev, racy):
    x, s1, s2 = _zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = _fork(dev, s1, s2)
        with dev.stream(s1):
            t = x * 2  # allocated on s1: its block goes back to s1's free list
        s2.wait_stream(s1)
        with dev.stream(s2):
            r = t + 1
            del t  # the last reference dies on s2
        if not racy:
            s1.wait_stream(s2)
        with dev.stream(s1):
            u = _empty(dev, N)  # s1 reuses the block s2 may still read
            u.fill_(-1.0)
        _join(main, s1, s2)
        return r, u

    return [fn]


@case("allocator reuse after a partial join", WAR)
def reuse_after_partial_join(dev, racy):
    x, s1, s2 = _zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = _fork(dev, s1, s2)
        t = x * 2
        s1.wait_stream(main)
        s2.wait_stream(main)
        with dev.stream(s1):
            r1 = t + 1
        with dev.stream(s2):
            r2 = t * 3
        main.wait_stream(s1)
        if not racy:
            main.wait_stream(s2)
        del t
        u = _empty(dev, N)
        u.fill_(0.5)
        main.wait_stream(s2)
        return r1, r2, u

    return [fn]


@case("discarded side-stream intermediates", WAW, WAR)
def discarded_side_intermediate(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        if racy:
            tmp = _empty(dev, N)  # on main, written and read on side
            side.wait_stream(main)
            with dev.stream(side):
                torch.mul(x, 2, out=tmp)
                s = tmp.sum()
        else:
            with dev.stream(side):
                tmp = x * 2  # the side stream's own intermediate
                s = tmp.sum()
        del tmp  # discarded before the join
        u = _empty(dev, N)
        u.fill_(-2.0)
        main.wait_stream(side)
        return s, u

    return [fn]


@case("two captures sharing one pool", WAR)
def shared_pool_two_captures(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def first():  # leaves freed blocks in the shared pool
        a = x * 2
        b = a + 1
        del a
        return b

    def second():
        main = _fork(dev, side)
        t = x * 3  # may get the first capture's freed block
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1
        if not racy:
            main.wait_stream(side)
        del t
        u = _empty(dev, N)
        u.fill_(-3.0)
        main.wait_stream(side)
        return r, u

    return [first, second]


# ------------------------------------------------------------------------------------------------
# missing or misplaced syncs on persistent memory
# ------------------------------------------------------------------------------------------------


@case("a missing wait (read after write)", RAW)
def missing_wait(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)  # forked before the write
        x.fill_(1.0)
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            y = x * 2
        main.wait_stream(side)
        return y

    return [fn]


@case("an event recorded too early", RAW)
def event_recorded_too_early(dev, racy):
    x, side, ev = _zeros(dev, N), dev.Stream(), dev.Event()

    def fn():
        main = _fork(dev, side)
        if racy:
            ev.record(main)
        x.fill_(2.0)
        if not racy:
            ev.record(main)
        side.wait_event(ev)
        with dev.stream(side):
            y = x * 3
        main.wait_stream(side)
        return y

    return [fn]


@case("an event waited on before its last record", RAW)
def stale_event_record(dev, racy):
    x, side, ev = _zeros(dev, N), dev.Stream(), dev.Event()

    def fn():
        main = _fork(dev, side)
        ev.record(main)  # an earlier record
        if racy:
            side.wait_event(ev)  # waits on that one
        x.fill_(9.0)
        ev.record(main)
        if not racy:
            side.wait_event(ev)
        with dev.stream(side):
            y = x + 1
        main.wait_stream(side)
        return y

    return [fn]


@case("a write after write", WAW)
def write_after_write(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        with dev.stream(side):
            x.fill_(1.0)
        if not racy:
            main.wait_stream(side)
        x.fill_(2.0)
        main.wait_stream(side)

    return [fn]


@case("a write after read", WAR)
def write_after_read(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        with dev.stream(side):
            y = x * 2
        if not racy:
            main.wait_stream(side)
        x.fill_(5.0)
        main.wait_stream(side)
        return y

    return [fn]


@case("a sync between the wrong pair of streams", RAW)
def wait_on_wrong_stream(dev, racy):
    x, side, other = _zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = _fork(dev, side, other)
        with dev.stream(side):
            x.fill_(1.0)
        (other if racy else main).wait_stream(side)
        y = x * 2
        _join(main, side, other)
        return y

    return [fn]


@case("a device-to-device copy", RAW)
def copy_race(dev, racy):
    buf, src, side = _zeros(dev, N), _zeros(dev, N) + 1, dev.Stream()

    def fn():
        main = _fork(dev, side)
        with dev.stream(side):
            buf.copy_(src)
        if not racy:
            main.wait_stream(side)
        y = buf * 2
        main.wait_stream(side)
        return y

    return [fn]


# ------------------------------------------------------------------------------------------------
# views and in-place ops
# ------------------------------------------------------------------------------------------------


@case("overlapping views of one buffer (twin: disjoint views, no sync)", WAW)
def overlapping_views(dev, racy):
    b, side = _zeros(dev, 2 * N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        lo, hi = (b[: N + 256], b[N - 256 :]) if racy else (b[:N], b[N:])
        with dev.stream(side):
            lo.fill_(1.0)
        hi.fill_(2.0)
        main.wait_stream(side)

    return [fn]


@case("strided views of one buffer (twin: interleaved columns, no sync)", WAW)
def strided_views(dev, racy):
    b, side = _zeros(dev, N // 2, 2), dev.Stream()

    def fn():
        main = _fork(dev, side)
        with dev.stream(side):
            b[:, 0].fill_(1.0)
        b[:, 0 if racy else 1].fill_(2.0)  # the twin's column interleaves with side's, byte-disjoint
        main.wait_stream(side)

    return [fn]


@case("an in-place op", WAR)
def inplace_op(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        main = _fork(dev, side)
        y = x * 2  # main reads x
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            x.add_(1.0)  # side updates it in place
        main.wait_stream(side)
        return y

    return [fn]


# ------------------------------------------------------------------------------------------------
# many streams, event chains, streams and events made inside the capture
# ------------------------------------------------------------------------------------------------


@case("fan-out over many streams, a join missing", RAW)
def fan_out_join_missing(dev, racy):
    out, streams = _zeros(dev, 4, N), [dev.Stream() for _ in range(4)]

    def fn():
        main = _fork(dev, *streams)
        for i, s in enumerate(streams):
            with dev.stream(s):
                out[i].fill_(float(i))
        _join(main, *(streams[:-1] if racy else streams))
        total = out.sum()
        _join(main, *streams)
        return total

    return [fn]


@case("fan-in over many streams, a wait missing (readers' results discarded)", WAR)
def fan_in_partial_wait(dev, racy):
    x = _zeros(dev, N)
    readers, writer = [dev.Stream() for _ in range(5)], dev.Stream()
    events = [dev.Event() for _ in readers]

    def fn():
        main = _fork(dev, *readers, writer)
        for s, e in zip(readers, events):
            with dev.stream(s):
                x.sum()  # discarded at once
            e.record(s)
        for e in events[:3] if racy else events:
            writer.wait_event(e)
        with dev.stream(writer):
            x.fill_(7.0)
        _join(main, *readers, writer)

    return [fn]


@case("an event chain (racy: a link recorded before its wait)", RAW)
def event_chain(dev, racy):
    x, (s1, s2, s3), (e1, e2) = _zeros(dev, N), [dev.Stream() for _ in range(3)], [dev.Event(), dev.Event()]

    def fn():
        main = _fork(dev, s1, s2, s3)
        with dev.stream(s1):
            x.fill_(3.0)
        e1.record(s1)
        if racy:
            e2.record(s2)
        s2.wait_event(e1)
        if not racy:
            e2.record(s2)
        s3.wait_event(e2)
        with dev.stream(s3):
            y = x * 2
        _join(main, s1, s2, s3)
        return y

    return [fn]


@case("a stream created inside the capture", RAW)
def stream_created_in_capture(dev, racy):
    x = _zeros(dev, N)

    def fn():
        side = dev.Stream()
        main = _fork(dev, side)
        x.fill_(4.0)
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            y = x + 1
        main.wait_stream(side)
        return y

    return [fn]


@case("an event created inside the capture, recorded on the wrong stream", RAW)
def event_created_in_capture(dev, racy):
    x, side = _zeros(dev, N), dev.Stream()

    def fn():
        ev = dev.Event()
        main = _fork(dev, side)
        with dev.stream(side):
            x.fill_(6.0)
        ev.record(main if racy else side)
        main.wait_event(ev)
        y = x * 2
        main.wait_stream(side)
        return y

    return [fn]


@case("a second side stream obtained inside the capture, both forked and joined", WAW)
def two_side_streams(dev, racy):
    x, side1 = _zeros(dev, N), dev.Stream()

    def fn():
        side2 = dev.Stream()
        main = _fork(dev, side1, side2)
        with dev.stream(side1):
            x.fill_(1.0)
        if not racy:
            side2.wait_stream(side1)
        with dev.stream(side2):
            x.mul_(3.0)
        _join(main, side1, side2)

    return [fn]


# ------------------------------------------------------------------------------------------------
# the runner
# ------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One scenario's verdicts: plain capture, audited capture, and what the audit said."""

    case: str
    variant: str  # "race" (the planted race) | "twin" (its synchronised twin)
    covers: str
    backend: str
    expected: str  # "race" | "clean"
    reported: str = "?"  # "race" | "clean" | "error"
    kinds: list = field(default_factory=list)
    hazards: int = 0
    plain_error: str = None  # capturing without the recorder failed (then the case is broken)
    audit_error: str = None  # capturing with it failed
    report: object = None  # the audit Report (not serialised)
    graphs: list = field(default_factory=list)  # the audited graphs, replayable (not serialised)

    @property
    def right(self):
        """The expected verdict, a planted race of an expected kind, and no capture broken."""
        if self.plain_error or self.audit_error:
            return False
        want = next(c for c in CASES if c.name == self.case).kinds
        if self.expected == "race":
            return self.reported == "race" and any(k in want for k in self.kinds)
        return self.reported == "clean"

    def as_dict(self):
        d = {k: v for k, v in self.__dict__.items() if k not in ("report", "graphs")}
        d["right"] = self.right
        return d


def capture_all(dev, fns, keep_graph=False):
    """Capture each fn into its own graph, one shared pool; returns [(graph, outputs)].
    keep_graph: keep CUDA's graph readable after capture (for audit_graph's cross-check)."""
    pool, out = dev.graph_pool_handle(), []
    for fn in fns:
        g = dev.CUDAGraph(keep_graph=keep_graph)
        with dev.graph(g, pool=pool):
            res = fn()
        out.append((g, res))
    return out


def _error(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def run_one(dev, c, racy, keep_graph=False):
    """One scenario, plainly and audited, each from a fresh build."""
    row = Row(c.name, "race" if racy else "twin", c.covers, dev.name, "race" if racy else "clean")
    try:
        for g, _ in capture_all(dev, c.build(dev, racy)):
            g.replay()
    except Exception as e:
        row.plain_error = _error(e)
    try:
        with audit.recording(dev) as rec:
            row.graphs = capture_all(dev, c.build(dev, racy), keep_graph)
        rep = rec.report()
        for g, _ in row.graphs:
            g.replay()
        dev.synchronize()
    except Exception as e:
        row.audit_error = _error(e) + "\n" + traceback.format_exc(limit=-3)
        row.reported = "error"
        return row
    row.report, row.hazards = rep, len(rep.hazards)
    row.kinds = sorted({h.kind for h in rep.hazards})
    row.reported = "race" if rep.hazards else "clean"
    return row


def run(dev, cases=None, keep_graph=False):
    """Every case (or those named), race and twin."""
    chosen = [c for c in CASES if cases is None or c.name in cases]
    return [run_one(dev, c, racy, keep_graph) for c in chosen for racy in (True, False)]


def summary(rows):
    wrong = [r for r in rows if not r.right]
    false_alarms = [r for r in rows if r.expected == "clean" and r.reported == "race"]
    missed = [r for r in rows if r.expected == "race" and r.reported != "race"]
    broken = [r for r in rows if r.audit_error and not r.plain_error]
    return dict(
        scenarios=len(rows),
        races=sum(r.expected == "race" for r in rows),
        right=len(rows) - len(wrong),
        false_alarms=len(false_alarms),
        missed=len(missed),
        captures_broken_by_the_audit=len(broken),
        wrong=[f"{r.case}/{r.variant}" for r in wrong],
    )
