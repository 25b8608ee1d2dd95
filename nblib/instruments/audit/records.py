"""The capture audit's report on a user's target, as typed records (what `--json` prints) and as text:
each hazard's two ops and streams, the tensors behind the bytes, and the allocation, free and use
sites in the caller's code (frames of nblib, torch and site-packages left out). Built by
nblib.instruments.audit.target from an nblib.instruments.audit.Report."""

import linecache
import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from nblib.core.paths import NBLIB
from nblib.instruments.audit.confirm import ConfirmReport
from nblib.instruments.audit.hazards import Kind
from nblib.instruments.audit.trace import stacks

__all__ = [
    "EXIT",
    "Failure",
    "HazardRecord",
    "HazardSummary",
    "OpRecord",
    "Site",
    "TargetReport",
    "TensorRecord",
    "hazard_record",
    "not_users",
    "relpath",
    "render",
    "tensor_record",
    "user_site",
    "user_sites",
]

EXIT = {"clean": 0, "hazards": 1, "failed": 2}
ACCESS = {"r": "reads", "w": "writes", "rw": "reads and writes"}


# ------------------------------------------------------------------------------------------------
# records (what --json prints)
# ------------------------------------------------------------------------------------------------


class Site(BaseModel):
    """One line of the caller's code."""

    file: str  # relative to the working directory when under it
    line: int
    function: str
    code: str = ""

    def __str__(self):
        return f"{self.file}:{self.line} in {self.function}" + (f": {self.code}" if self.code else "")

    def short(self):
        """'hf_moe.py:107 in forward': the file's name, the line and the function."""
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}"


class TensorRecord(BaseModel):
    """The allocation behind one side of a hazard (persistent: made outside the capture's pool)."""

    name: str
    persistent: bool
    nbytes: int | None = None
    stream: str | None = None  # the allocation stream: whose free list gets the block back
    allocated_at: Site | None = None
    freed: bool = False
    freed_at: Site | None = None  # None while freed: the last reference died in no line of the caller's
    record_streams: list[str] = []


class OpRecord(BaseModel):
    """One op of a racing pair."""

    op: str
    index: int
    stream: str
    access: Literal["reads", "writes", "reads and writes"]
    argument: str
    at: Site | None  # the innermost line of the caller's
    called_from: list[Site] = []  # the caller's frames around it, innermost first
    tensor: TensorRecord


def _short(site):
    return site.short() if site is not None else "-"  # None: no line of the caller's


class HazardSummary(BaseModel):
    """A HazardRecord as one table row (notebook 06): each side's op on its stream and its line in the
    caller's code, the first side's tensor with its allocation and free lines, and the second side's
    tensor when the bytes were freed and handed on."""

    model_config = ConfigDict(extra="forbid")
    kind: Kind
    first: str  # "aten::mm on side"
    first_at: str  # "hf_moe.py:107 in forward"; "-": no line of the caller's
    second: str
    second_at: str
    tensor: str  # the first op's tensor
    allocated_at: str
    freed_at: str  # "alive at the end" when never freed
    reused_by: str  # the second op's tensor when the bytes were freed and handed on, else "-"
    pairs: int


class HazardRecord(BaseModel):
    """One hazard of the target's report, each side nested (the flat row of the same hazard is
    nblib.instruments.audit.hazards.HazardRow; summary() is this record as one table row)."""

    kind: Kind
    reused: bool  # the two sides are two allocations of the same bytes: freed, then reused
    addr: str
    nbytes: int
    pairs: int  # access pairs merged into this record
    first: OpRecord  # issued first on the host; the graph may run them in either order
    second: OpRecord
    # with --confirm: replays with the first op delayed, compared with eager (audit_confirm)
    confirmed: bool | None = None
    replays: int | None = None
    differing: int | None = None
    max_abs: float | None = None
    tensor: str | None = None
    error: str | None = None  # a forced replay that raised: its error; or why the check did not run

    def summary(self) -> HazardSummary:
        """This hazard as one table row: ops on their streams, the caller's lines, the tensors."""
        ta = self.first.tensor
        return HazardSummary(
            kind=self.kind,
            first=f"{self.first.op} on {self.first.stream}",
            first_at=_short(self.first.at),
            second=f"{self.second.op} on {self.second.stream}",
            second_at=_short(self.second.at),
            tensor=ta.name,
            allocated_at=_short(ta.allocated_at),
            freed_at=_short(ta.freed_at) if ta.freed else "alive at the end",
            reused_by=self.second.tensor.name if self.reused else "-",
            pairs=self.pairs,
        )


class Failure(BaseModel):
    stage: Literal["build", "capture"]
    message: str
    rule: str | None = None  # the capture rule broken (nblib.backends.capture_rules.RULES)
    rule_says: str | None = None
    cuda_error: str | None = None


class TargetReport(BaseModel):
    target: str
    backend: str
    label: str
    status: Literal["clean", "hazards", "failed"]
    captures: int = 0
    ops: int = 0
    hazards: list[HazardRecord] = []
    failure: Failure | None = None
    notes: list[str] = []
    confirm: ConfirmReport | None = None  # with --confirm
    _report: object = PrivateAttr(default=None)

    def add_confirm(self, c: ConfirmReport):
        """Attach --confirm's checks: each hazard record gets its own."""
        self.confirm = c
        for h, k in zip(self.hazards, c.hazards):
            h.confirmed, h.replays, h.differing = k.confirmed, k.replays, k.differing
            h.max_abs, h.tensor, h.error = k.max_abs, k.tensor, k.error

    @property
    def exit_code(self):
        return EXIT[self.status]

    @property
    def audit_report(self):
        """The underlying nblib.instruments.audit.Report (its graph and result too); None on failure."""
        return self._report

    @audit_report.setter
    def audit_report(self, rep):
        self._report = rep

    def text(self):
        return render(self)


# sites in the caller's code
# ------------------------------------------------------------------------------------------------

_NBLIB = str(NBLIB) + os.sep


def not_users(filename):
    return (
        filename.startswith(_NBLIB)
        or stacks.skip(filename)
        or f"{os.sep}site-packages{os.sep}" in filename
        or filename.startswith("<frozen")
    )


def relpath(filename):
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive
        return filename
    return filename if rel.startswith("..") else rel


def user_sites(stack, depth=3):
    """The step's own frames of a recorded stack, innermost first, at most `depth`: those inside the
    innermost nblib frame (the audit that called the step; frames outside it are whoever called the
    audit), without torch's and site-packages' frames."""
    stack = stack or []
    inner = max((i for i, fr in enumerate(stack) if fr["filename"].startswith(_NBLIB)), default=-1)
    frames = [fr for fr in stack[inner + 1 :] if not not_users(fr["filename"])][::-1][:depth]
    return [
        Site(
            file=relpath(fr["filename"]),
            line=fr["line"],
            function=fr["name"],
            code=linecache.getline(fr["filename"], fr["line"]).strip()[:100],
        )
        for fr in frames
    ]


def user_site(stack):
    """The innermost frame of the caller's code; None when no frame is the caller's."""
    sites = user_sites(stack, depth=1)
    return sites[0] if sites else None


def tensor_record(a):
    if a is None:
        return TensorRecord(name="persistent memory (outside the capture's pool)", persistent=True)
    at = user_site(a.stack)
    return TensorRecord(
        name=a.name or _variable(at) or f"tensor at {a.addr:#x}",
        persistent=False,
        nbytes=a.nbytes,
        stream=a.stream,
        allocated_at=at,
        freed=a.freed,
        freed_at=user_site(a.free_stack) if a.freed else None,
        record_streams=list(a.record_streams),
    )


def _variable(site):
    """'qkv_a (dsv4_attention.py:102)' from `qkv_a = ...` at the allocation site."""
    if site is None:
        return None
    m = re.match(r"\s*([A-Za-z_][\w.]*)\s*=[^=]", site.code)
    where = f"{os.path.basename(site.file)}:{site.line}"
    return f"{m.group(1)} ({where})" if m else f"tensor from {where}"


def hazard_record(h):
    def side(op, acc):
        sites = user_sites(op.stack)
        return OpRecord(
            op=op.name,
            index=op.index,
            stream=op.stream,
            access=ACCESS[acc.kind],
            argument=acc.what,
            at=sites[0] if sites else None,
            called_from=sites[1:],
            tensor=tensor_record(acc.alloc),
        )

    return HazardRecord(
        kind=h.kind,
        reused=h.reused,
        addr=hex(h.lo),
        nbytes=h.nbytes,
        pairs=h.count,
        first=side(h.first, h.first_access),
        second=side(h.second, h.second_access),
    )


# ------------------------------------------------------------------------------------------------
# the text report
# ------------------------------------------------------------------------------------------------


def render(rep):
    head = f"capture audit of {rep.label} on {rep.backend}"
    if rep.status == "failed":
        f = rep.failure
        lines = [f"{head}: the {f.stage} failed", f"  {f.message}"]
        if f.rule:
            lines.append(f"  capture rule broken: {f.rule}: {f.rule_says} ({f.cuda_error})")
        return "\n".join([*lines, f"verdict: failed (exit {rep.exit_code})"])
    n = len(rep.hazards)
    lines = [f"{head}: {rep.captures} capture, {rep.ops} ops, {n} hazard{'s' * (n != 1)}"]
    for i, h in enumerate(rep.hazards, 1):
        lines += _hazard_lines(i, h)
    lines += [f"note: {x}" for x in rep.notes]
    if rep.confirm is not None:
        lines += [f"confirm: {x}" for x in rep.confirm.lines()]
    verdict = "clean: no cross-stream race" if not n else f"{n} hazard{'s' * (n != 1)}"
    if rep.confirm is not None:
        k = sum(c.confirmed for c in rep.confirm.hazards)
        if not rep.confirm.compared:
            verdict += ", nothing to compare"
        elif rep.confirm.eager_differs is not None:
            verdict += ", undecided (the step's eager runs differ)"
        elif n:
            verdict += f", {k} confirmed"
        elif not any(b.confirmed for b in rep.confirm.branches):
            verdict += ", equal to eager under every forced order"
    return "\n".join([*lines, f"verdict: {verdict} (exit {rep.exit_code})"])


def _hazard_lines(i, h):
    out = [
        f"hazard {i}: {h.kind} on {h.nbytes} bytes at {h.addr}"
        + (" (the same bytes, two allocations: freed, then reused)" if h.reused else "")
    ]
    for tag, s in (("first ", h.first), ("second", h.second)):
        out.append(f"  {tag} {s.op} (op {s.index}) on stream {s.stream} {s.access} {s.tensor.name}")
        out.append(f"         at {s.at or '(no line of the caller)'}")
        out += [f"         called from {c}" for c in s.called_from[:1]]
    seen = set()
    for s in (h.first, h.second):
        t = s.tensor
        if t.persistent or t.name in seen:
            continue
        seen.add(t.name)
        out.append(f"  {t.name}: {t.nbytes} bytes allocated on stream {t.stream} at {t.allocated_at or '?'}")
        if not t.freed:
            out.append("         alive at the end of the capture")
        else:
            out.append(f"         freed at {t.freed_at or '(when the step returned)'}")
        if t.record_streams:
            out.append(f"         record_stream({', '.join(t.record_streams)})")
    return out
