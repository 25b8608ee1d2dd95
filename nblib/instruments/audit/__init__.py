"""The capture audit: name every cross-stream race in a capture, from the capture alone.

    report = audit.audit_capture(fn, *args, device=dev)     # captures fn(*args) and audits it
    with audit.recording(dev) as rec:                         # or around code that captures
        runner.capture(record=rec)                            # (rec(bucket) labels captures)
    report = rec.report(names=model.captures)

Modules, each one job:
    trace/        record a capture: allocations, frees, each op's byte accesses, stream syncs
    hazards       happens-before (vector clocks per stream) and the races it leaves
    report        the Report over recorded captures; audit_capture; the capture rule an error broke
    byte_overlap  whether two strided views share a byte
    graph_read    a built graph's nodes and edges (the simulator's, or CUDA's through the driver)
    graph_match   which graph nodes each recorded op launched
    graph_check   the audit cross-checked against the graph that was built
    target        `python -m nblib audit TARGET`: a user's step captured and audited
    records       the target's report as typed records (--json) and text
    confirm       --confirm: each hazard replayed with its losing order forced
    parity        what a capture forbids, simulator against CUDA, case by case
    zoo/          small multi-stream scenarios, each race with a synchronised twin
"""

from nblib.instruments.audit.hazards import (
    HAZARD_COLUMNS,
    KINDS,
    VERBS,
    Hazard,
    happens_before,
    kind_of,
    ordered,
    races,
    tensor_name,
)
from nblib.instruments.audit.report import (
    AuditCaptureError,
    Report,
    audit,
    audit_capture,
    error_chain,
    name_allocations,
    recording,
    restore_stream,
    rule_of,
    rule_of_error,
)

__all__ = [
    "HAZARD_COLUMNS",
    "KINDS",
    "VERBS",
    "AuditCaptureError",
    "Hazard",
    "Report",
    "audit",
    "audit_capture",
    "error_chain",
    "happens_before",
    "kind_of",
    "name_allocations",
    "ordered",
    "races",
    "recording",
    "restore_stream",
    "rule_of",
    "rule_of_error",
    "tensor_name",
]
