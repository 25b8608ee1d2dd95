"""The capture audit: name every cross-stream race in a capture, from the capture alone.

    report = audit.audit_capture(fn, *args, device=dev)     # captures fn(*args) and audits it
    with audit.recording(dev) as rec:                         # or around code that captures
        runner.capture(record=rec)                            # (rec(bucket) labels captures)
    report = rec.report(names=model.captures)
    report.ok, report.hazards, print(report), report.rows()

How: nblib.instruments.trace records, in program order, each allocation and free, each op's byte accesses
(read or write) and stream, and each event record and wait. Happens-before is computed with a
vector clock per stream (an op ticks its stream's clock; a record snapshots the stream's clock into
the event; a wait merges the event's clock into the stream's). Two accesses race when their bytes
overlap, at least one writes, they run on different streams, and neither op happens before the
other. Accesses are compared by bytes, not by tensor, and the history is kept across frees: a
side-stream kernel still reading a block that the main stream's next tensor reuses is reported with
both tensors' allocation and free sites (PyTorch's CUDA sanitizer forgets a tensor at its free, so it
cannot see that). The audit only reads what the capture recorded; the graph it audits replays the
same with or without it.
"""

import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

from nblib.backends.sim.rules import CUDA_TEXTS, RULES, SimCaptureError
from nblib.instruments import trace as T
from nblib.instruments.byte_overlap import share_bytes  # noqa: F401  (part of this module's API)
from nblib.instruments.trace import site  # noqa: F401  (part of this module's API)

KINDS = ("read-after-write", "write-after-read", "write-after-write")


class AuditCaptureError(RuntimeError):
    """The function being audited raised while capturing; the message names the op or line."""


# ------------------------------------------------------------------------------------------------
# happens-before: vector clocks per stream and event
# ------------------------------------------------------------------------------------------------


def happens_before(tr):
    """Give every op of the trace its epoch (its tick on its stream) and vc (the stream's vector
    clock at the op: the last tick of every stream known to happen before it)."""
    clocks, events = {}, {}
    for e in tr.events:
        if e.kind == "op":
            op = e.op
            c = clocks.setdefault(op.stream, {})
            c[op.stream] = c.get(op.stream, 0) + 1
            op.epoch, op.vc = c[op.stream], dict(c)
        elif e.kind == "record":
            events[e.clock] = dict(clocks.get(e.stream, {}))
        elif e.kind == "wait":
            c = clocks.setdefault(e.stream, {})
            for s, t in events.get(e.clock, {}).items():  # an event never recorded: waits for nothing
                if t > c.get(s, 0):
                    c[s] = t
    return tr


def ordered(a, b):
    """True when op a happens before op b (a was issued first)."""
    return a.epoch <= b.vc.get(a.stream, 0)


# ------------------------------------------------------------------------------------------------
# races
# ------------------------------------------------------------------------------------------------


VERBS = {"r": "reads", "w": "writes", "rw": "reads and writes"}  # an access's kind, as a sentence says it


@dataclass(eq=False)
class Hazard:
    """One race: two ops on different streams, unordered, touching the same bytes, one writing.
    `first` is the op issued first on the host (the graph runs them in either order)."""

    kind: str
    label: dict
    first: T.Op
    second: T.Op
    first_access: T.Access
    second_access: T.Access
    lo: int
    hi: int
    count: int = 1  # access pairs merged into this entry

    @property
    def bucket(self):
        return self.label.get("bucket")

    @property
    def nbytes(self):
        return self.hi - self.lo

    @property
    def reused(self):
        """The two accesses belong to different allocations of the same bytes: a free, then reuse."""
        a, b = self.first_access.alloc, self.second_access.alloc
        return a is not None and b is not None and a is not b

    def row(self):
        """A flat dict for tables and results.json."""
        fa, sa = self.first_access.alloc, self.second_access.alloc
        return dict(
            **{k: v for k, v in self.label.items() if k != "capture"},
            kind=self.kind,
            first_op=self.first.name,
            first_stream=self.first.stream,
            first_tensor=tensor_name(fa),
            first_site=T.site(self.first.stack, code=False),
            second_op=self.second.name,
            second_stream=self.second.stream,
            second_tensor=tensor_name(sa),
            second_site=T.site(self.second.stack, code=False),
            addr=hex(self.lo),
            nbytes=self.nbytes,
            reused=self.reused,
            first_alloc=_alloc_site(fa),
            first_free=_free_site(fa),
            second_alloc=_alloc_site(sa),
            second_free=_free_site(sa),
            pairs=self.count,
        )

    def sentence(self) -> str:
        """The hazard in one sentence: which ops, on which streams, touch which bytes, and whether
        the bytes changed hands through a free (describe() adds the stacks)."""
        fa, sa = self.first_access.alloc, self.second_access.alloc
        where = ", ".join(f"{k} {v}" for k, v in self.label.items() if k != "capture")
        text = (
            f"{where + ': ' if where else ''}{self.first.name} on stream {self.first.stream} "
            f"{VERBS[self.first_access.kind]} {tensor_name(fa)} and {self.second.name} on stream "
            f"{self.second.stream} {VERBS[self.second_access.kind]} {tensor_name(sa)}, the same "
            f"{self.nbytes} bytes with no order between the streams ({self.kind})"
        )
        if self.reused:
            text += (
                f"; {tensor_name(fa)} was freed at {_free_site(fa)} and its bytes handed to {tensor_name(sa)}"
            )
        return text + "."

    def describe(self):
        fa, sa = self.first_access.alloc, self.second_access.alloc
        title = (
            ", ".join(f"{k} {v}" for k, v in self.label.items() if k != "capture")
            or f"capture {self.label.get('capture')}"
        )
        head = f"{title}: {self.kind} on {self.nbytes} bytes at {self.lo:#x}" + (
            " (the same bytes, two allocations: freed, then reused)" if self.reused else ""
        )
        out = [head]
        for tag, op, acc, al in (
            ("first ", self.first, self.first_access, fa),
            ("second", self.second, self.second_access, sa),
        ):
            verb = VERBS[acc.kind]
            out.append(
                f"  {tag} {op.name} (op {op.index}) on stream {op.stream} {verb} {acc.what} "
                f"= {tensor_name(al)}"
            )
            out.append(T.format_stack(op.stack, indent="          "))
            if al is not None:
                out.append(
                    f"          {tensor_name(al)}: {al.nbytes} bytes allocated on stream {al.stream} "
                    f"by {al.op} at {T.site(al.stack)}"
                )
                out.append(
                    f"          freed at {_free_site(al)}"
                    + (f"; record_stream({', '.join(al.record_streams)})" if al.record_streams else "")
                )
        return "\n".join(x for x in out if x)


HAZARD_COLUMNS = [
    "bucket", "kind", "first_tensor", "first_op", "first_stream",
    "second_tensor", "second_op", "second_stream", "nbytes",
]  # fmt: skip


def tensor_name(a):
    if a is None:
        return "persistent memory (outside the capture's pool)"
    return a.label()


def _alloc_site(a):
    return T.site(a.stack) if a is not None else "before the capture"


def _free_site(a):
    if a is None:
        return "-"
    return T.site(a.free_stack) if a.freed else "alive at the end of the capture"


def _kind(first, second):
    if first.writes and second.writes:
        return "write-after-write"
    return "read-after-write" if first.writes else "write-after-read"


class _Span(NamedTuple):
    """One access as a byte interval, for the sweep over addresses."""

    lo: int
    hi: int
    op: T.Op
    access: T.Access


def races(tr):
    """Every racing access pair of one trace, merged per (op pair, allocation pair, kind)."""
    happens_before(tr)
    spans = sorted(
        (_Span(a.addr, a.addr + a.nbytes, op, a) for op in tr.ops for a in op.accesses), key=lambda x: x.lo
    )
    found, active = {}, []
    for y in spans:
        active = [x for x in active if x.hi > y.lo]
        for x in active:
            if x.op is y.op or x.op.stream == y.op.stream or not (x.access.writes or y.access.writes):
                continue
            f, s = sorted((x, y), key=lambda p: p.op.index)
            if ordered(f.op, s.op) or not share_bytes(x.access, y.access):
                continue
            kind = _kind(f.access, s.access)
            key = (f.op.index, s.op.index, id(f.access.alloc), id(s.access.alloc), kind)
            olo, ohi = max(x.lo, y.lo), min(x.hi, y.hi)
            h = found.get(key)
            if h is None:
                found[key] = Hazard(kind, tr.label, f.op, s.op, f.access, s.access, olo, ohi)
            else:
                h.lo, h.hi, h.count = min(h.lo, olo), max(h.hi, ohi), h.count + 1
        active.append(y)
    return sorted(found.values(), key=lambda h: (h.first.index, h.second.index, h.lo))


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Report:
    traces: list
    hazards: list
    seconds: float
    incomplete: int = 0
    result: object = None  # audit_capture: what fn returned (the capture's static outputs)
    graph: object = None  # audit_capture: the captured graph
    notes: list = field(default_factory=list)
    graph_rows: list = field(default_factory=list)  # the cross-check with the built graphs, if made

    @property
    def ok(self):
        return not self.hazards

    @property
    def ops(self):
        return sum(len(t.ops) for t in self.traces)

    def rows(self, level="ops"):
        """Table rows. level "ops": one per (capture label, tensor pair, op pair); level "tensors":
        one per (capture label, tensor pair), the racing ops listed in first_op / second_op."""
        out = {}
        for h in self.hazards:
            r = h.row()
            key = tuple(sorted((k, str(v)) for k, v in h.label.items() if k != "capture")) + (
                r["first_tensor"],
                r["second_tensor"],
            )
            if level == "ops":
                key += (r["first_op"], r["first_site"], r["second_op"], r["second_site"])
            if key in out:
                o = out[key]
                o["pairs"] += r["pairs"]
                o["nbytes"] = max(o["nbytes"], r["nbytes"])
                for k in ("kind", "first_op", "second_op"):
                    if r[k] not in o[k].split(", "):
                        o[k] += ", " + r[k]
            else:
                out[key] = r
        return list(out.values())

    def by(self, key):
        """Hazards grouped by a label key, e.g. report.by("bucket") -> {8: [...], 4: [...]}."""
        out = {t.label.get(key): [] for t in self.traces}
        for h in self.hazards:
            out.setdefault(h.label.get(key), []).append(h)
        return out

    def summary(self):
        n = len(self.traces)
        head = (
            f"capture audit: {n} capture{'s' * (n != 1)}, {self.ops} ops, "
            f"{len(self.hazards)} hazard{'s' * (len(self.hazards) != 1)} ({self.seconds * 1e3:.1f} ms)"
        )
        if self.incomplete:
            head += f"; {self.incomplete} capture(s) raised and were not audited"
        return head

    def __str__(self):
        if self.ok:
            return self.summary() + ": no cross-stream race"
        seen, parts = set(), [self.summary()]
        for h in self.hazards:  # one block per notebook row, the first instance
            r = h.row()
            key = (
                tuple(sorted(h.label.items())),
                r["first_tensor"],
                r["second_tensor"],
                r["first_op"],
                r["second_op"],
            )
            if key in seen:
                continue
            seen.add(key)
            parts.append(h.describe())
        return "\n".join(parts)

    __repr__ = summary


def name_allocations(traces, names):
    """Give allocations the names a caller noted while capturing: dicts with addr and tensor, and
    optionally bucket (matched against the capture's label) -- e.g. DecodeModel.captures."""
    for tr in traces:
        for a in tr.allocs:
            for n in names:
                if (
                    n.get("addr") == a.addr
                    and n.get("nbytes", a.nbytes) == a.nbytes
                    and ("bucket" not in n or n["bucket"] == tr.label.get("bucket"))
                ):
                    a.name = n["tensor"]


def recording(dev):
    """`with recording(dev) as rec:` records every capture made inside; rec.report() audits them."""
    return T.recording(dev, analyse=audit)


def audit(traces, names=None):
    """Audit recorded captures (nblib.instruments.trace.CaptureTrace list); incomplete ones are skipped."""
    t0 = time.perf_counter()
    done = [t for t in traces if t.complete]
    if names:
        name_allocations(done, names)
    hazards = [h for t in done for h in races(t)]
    notes = [
        f"{t.title()}: {op.name} on stream {op.stream} at {T.site(op.stack)} is a raw Triton launch that "
        "declares no tensors, so its accesses were not audited (wrap it in a torch.library custom op "
        "with mutates_args, or give the kernel a launch_metadata that returns its tensors)"
        for t in done
        for op in t.ops
        if op.opaque
    ]
    rep = Report(done, hazards, time.perf_counter() - t0, incomplete=len(traces) - len(done))
    rep.notes.extend(notes)
    return rep


def audit_capture(
    fn, *args, device, pool=None, names=None, label=None, keep_graph=False, before_op=None, **kwargs
):
    """Capture fn(*args, **kwargs) on `device` into a new graph and audit it. The report carries
    the graph (report.graph) and what fn returned (report.result); keep_graph=True keeps CUDA's
    graph readable for nblib.instruments.audit_graph's cross-check. If fn raises, nothing is left
    capturing, the current stream is restored, and AuditCaptureError names the user's line, the op,
    and the capture rule it broke (if it broke one). before_op (CUDA): called with each op's index
    just before the op is queued (the forced schedule of nblib.instruments.audit_confirm)."""
    dev = device
    if before_op is not None and dev.name != "cuda":
        raise ValueError("before_op needs the CUDA recorder: the simulator delays a replay's nodes instead")
    g = dev.CUDAGraph(keep_graph=keep_graph)
    prev = dev.current_stream()
    rec = recording(dev)
    rec.before_op = before_op
    # warnings raised inside the capture (torch's CUDA warnings from destructors) help name the rule
    with rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with rec(**(label or {})), dev.graph(g, pool=pool):
                result = fn(*args, **kwargs)
        except Exception as e:
            raise AuditCaptureError(_failure(fn, e, [str(w.message) for w in caught])) from e
        finally:
            restore_stream(dev, prev)
    for w in caught:  # passed on, now that the capture is over
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    report = rec.report(names=names)
    report.result, report.graph = result, g
    return report


def _chain(e):
    """An error and the errors it was raised during, outermost first."""
    out = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _rule_of_one(e):
    if isinstance(e, SimCaptureError):
        return e.rule
    text = str(e)
    for cuda_text, rule in CUDA_TEXTS.items():
        if cuda_text in text:
            if rule == "sync" and any(f.name == "query" for f in traceback.extract_tb(e.__traceback__)):
                return "query"
            return rule
    return None


def rule_of(e, warned=()):
    """The capture rule an error broke, or None: the first error of the chain that names one (a
    capture invalidated earlier fails later with 'a previous error', which names none), else a
    warning torch gave meanwhile (destroying a graph inside a capture only warns)."""
    rules = [_rule_of_one(x) for x in reversed(_chain(e))]  # the first error first
    for x, r in zip(reversed(_chain(e)), rules):
        if r == "invalidated" and getattr(x, "cause", None):
            return x.cause
        if r is not None and r != "invalidated":
            return r
    if any(RULES["graph_destroyed"].cuda_text in w and "reset" in w for w in warned):
        return "graph_destroyed"
    return next((r for r in rules if r), None)


def _failure(fn, e, warned=()):
    name = getattr(fn, "__qualname__", None) or repr(fn)
    chain = _chain(e)
    root = chain[-1]
    where = ""
    frames = [f for f in traceback.extract_tb(root.__traceback__) if not T.skip(f.filename)]
    if frames:
        f = frames[-1]
        where = f" at {os.path.basename(f.filename)}:{f.lineno} in {f.name}"
    notes = " ".join(getattr(root, "__notes__", []))
    msg = f"capturing {name} failed{where}: {type(root).__name__}: {root}" + (f" {notes}" if notes else "")
    if root is not e:
        msg += f"; then {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    rule = rule_of(e, warned)
    if rule is not None and rule in RULES:
        r = RULES[rule]
        msg += f" [rule {rule}: {r.says} ({r.cuda_error})]"
    return msg


def restore_stream(dev, prev):
    """Make `prev` the current stream again (torch.cuda.graph skips this when capture_end raises)."""
    if dev.current_stream() != prev:
        dev.set_stream(prev)
