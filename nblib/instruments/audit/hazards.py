"""Happens-before and races: a recorded capture's ops ordered by vector clocks per stream, and every
pair of unordered accesses on different streams that share a byte, one of them writing, as a Hazard.

HazardRow is the hazard's one model as a flat row: Hazard.fields() builds it, the audit's tables
(Report.rows) and notebook 03's results.json hold it (nblib.studies.overlap.OverlapHazard adds the
configuration). The command's nested record of the same hazard is
nblib.instruments.audit.records.HazardRecord, of the same Kind."""

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict

from nblib.instruments.audit.byte_overlap import share_bytes
from nblib.instruments.audit.trace.records import Access, Op
from nblib.instruments.audit.trace.stacks import format_stack, site

__all__ = [
    "HAZARD_COLUMNS",
    "KINDS",
    "RAW",
    "VERBS",
    "WAR",
    "WAW",
    "Hazard",
    "HazardRow",
    "Kind",
    "happens_before",
    "kind_of",
    "ordered",
    "races",
    "tensor_name",
]

Kind = Literal["read-after-write", "write-after-read", "write-after-write"]
KINDS: tuple[str, ...] = get_args(Kind)
RAW, WAR, WAW = KINDS


class HazardRow(BaseModel):
    """One hazard, flat: the two ops, their streams, tensors and sites, the bytes, and the allocation and
    free sites of both sides (sites as stacks.site gives them, nblib's frames included)."""

    model_config = ConfigDict(extra="forbid")
    kind: str  # one of KINDS; Report.rows joins the kinds of the pairs it merges with ", "
    first_op: str  # issued first on the host (the graph runs the two in either order)
    first_stream: str
    first_tensor: str
    first_site: str
    second_op: str
    second_stream: str
    second_tensor: str
    second_site: str
    addr: str  # hex, the lowest byte the two share
    nbytes: int
    reused: bool  # the two sides are two allocations of the same bytes: freed, then reused
    first_alloc: str
    first_free: str
    second_alloc: str
    second_free: str
    pairs: int  # access pairs merged into this row


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

    kind: Kind
    label: dict
    first: Op
    second: Op
    first_access: Access
    second_access: Access
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
        """A flat dict for tables and results.json: the capture's label (less its capture number), then
        the HazardRow's fields."""
        return {**{k: v for k, v in self.label.items() if k != "capture"}, **self.fields().model_dump()}

    def fields(self) -> HazardRow:
        """The hazard as its flat model, without the capture's label."""
        fa, sa = self.first_access.alloc, self.second_access.alloc
        return HazardRow(
            kind=self.kind,
            first_op=self.first.name,
            first_stream=self.first.stream,
            first_tensor=tensor_name(fa),
            first_site=site(self.first.stack, code=False),
            second_op=self.second.name,
            second_stream=self.second.stream,
            second_tensor=tensor_name(sa),
            second_site=site(self.second.stack, code=False),
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
            out.append(format_stack(op.stack, indent="          "))
            if al is not None:
                out.append(
                    f"          {tensor_name(al)}: {al.nbytes} bytes allocated on stream {al.stream} "
                    f"by {al.op} at {site(al.stack)}"
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
    return site(a.stack) if a is not None else "before the capture"


def _free_site(a):
    if a is None:
        return "-"
    return site(a.free_stack) if a.freed else "alive at the end of the capture"


def kind_of(first, second) -> Kind:
    """The hazard's kind from its two accesses in host order (one of them writes)."""
    if first.writes and second.writes:
        return WAW
    return RAW if first.writes else WAR


class _Span(NamedTuple):
    """One access as a byte interval, for the sweep over addresses."""

    lo: int
    hi: int
    op: Op
    access: Access


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
            kind = kind_of(f.access, s.access)
            key = (f.op.index, s.op.index, id(f.access.alloc), id(s.access.alloc), kind)
            olo, ohi = max(x.lo, y.lo), min(x.hi, y.hi)
            h = found.get(key)
            if h is None:
                found[key] = Hazard(kind, tr.label, f.op, s.op, f.access, s.access, olo, ohi)
            else:
                h.lo, h.hi, h.count = min(h.lo, olo), max(h.hi, ohi), h.count + 1
        active.append(y)
    return sorted(found.values(), key=lambda h: (h.first.index, h.second.index, h.lo))
