"""Run the zoo: each scenario captured plainly and audited, and its verdict checked."""

import traceback
from dataclasses import dataclass, field

from nblib.instruments import audit
from nblib.instruments.audit import graph_check as audit_graph
from nblib.instruments.audit.report import one_line
from nblib.instruments.audit.zoo.base import CASES


@dataclass
class ZooRow:
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


def run_one(dev, c, racy, keep_graph=False):
    """One scenario, plainly and audited, each from a fresh build."""
    row = ZooRow(c.name, "race" if racy else "twin", c.covers, dev.name, "race" if racy else "clean")
    try:
        for g, _ in capture_all(dev, c.build(dev, racy)):
            g.replay()
    except Exception as e:
        row.plain_error = one_line(e)
    try:
        with audit.recording(dev) as rec:
            row.graphs = capture_all(dev, c.build(dev, racy), keep_graph)
        rep = rec.report()
        for g, _ in row.graphs:
            g.replay()
        dev.synchronize()
    except Exception as e:
        row.audit_error = one_line(e) + "\n" + traceback.format_exc(limit=-3)
        row.reported = "error"
        return row
    row.report, row.hazards = rep, len(rep.hazards)
    row.kinds = sorted({h.kind for h in rep.hazards})
    row.reported = "race" if rep.hazards else "clean"
    return row


def graph_check(row):
    """The row's audited graphs read back (CUDA's driver, or the simulator's nodes) and cross-checked
    with its report (audit_graph.rows): one dict per capture."""
    return audit_graph.rows(row.report, [g for g, _ in row.graphs]) if row.report is not None else []


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
