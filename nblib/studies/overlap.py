"""Stream-overlap toggles: corruption rates and the capture audit's verdict, configuration by configuration.

    measured = overlap.measured_matrix(reproduced, model, buckets, wl, dtypes, overlaps, policies[0])
    rows, reports = overlap.toggles(dev, model, buckets, wl, dtypes, overlaps, policies, measured=measured)
    checks = overlap.checks(rows); overlap.verdict(checks, rows)
    hazards = overlap.hazard_rows(reports)  # every racy configuration's hazards, as OverlapHazard

A configuration is (logits policy, index dtype, overlap); each is captured for every bucket. The
corruption rate comes from replaying the agentic workload (nblib.studies.reproduce.corruption_matrix,
graph mode); the audit reads one more capture of the same configuration (nblib.instruments.audit),
replaying nothing. Notebook 00's replays stand in for the first policy's when they are the same runs
(measured_matrix): `reproduced` is 00's results (nblib.schema.results.Reproduce00, a Reproduced).
"""

import gc
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from nblib.core import phases, results
from nblib.engine import build
from nblib.engine.model import HANDS_LOGITS_ACROSS, LOGITS_POLICIES, check_choice
from nblib.engine.runner import Runner
from nblib.instruments import audit
from nblib.instruments.audit import graph_check as audit_graph
from nblib.instruments.audit import zoo as audit_zoo
from nblib.instruments.audit.hazards import HazardRow
from nblib.studies import reproduce

__all__ = [
    "GRAPH_COLUMNS",
    "TOGGLE_COLUMNS",
    "Configuration",
    "MatrixRow",
    "OverlapHazard",
    "Reproduced",
    "audit_model",
    "checks",
    "graph_rows",
    "graph_verdict",
    "hazard_rows",
    "measured_matrix",
    "telling_hazard",
    "toggles",
    "verdict",
    "zoo_rows",
]


class Configuration(BaseModel):
    """What notebook 03 toggles: the logits policy, the index dtype and the overlap."""

    model_config = ConfigDict(extra="forbid")
    logits_policy: str
    index_dtype: str
    overlap: str


class Captured(Configuration):
    """One configuration's capture of one bucket."""

    bucket: int


class OverlapHazard(HazardRow, Captured):
    """One hazard the capture audit named (a HazardRow), after the configuration and bucket of the
    capture it was named in: those fields first, as notebook 03's table shows them."""


def hazard_rows(reports) -> list[OverlapHazard]:
    """The hazards of every racy configuration of toggles' reports, one per capture, tensor pair and op
    pair (Report.rows), each with its configuration."""
    return [
        OverlapHazard(logits_policy=policy, index_dtype=dtype, overlap=ov, **row)
        for (policy, dtype, ov), rep in reports.items()
        if not rep.ok
        for row in rep.rows()
    ]


def audit_model(dev, model, buckets, index_dtype, overlap, logits_policy, keep_graph=False):
    """Capture every bucket of one configuration under the recorder; returns (report, runner, trace
    seconds). The runner's graphs are the audited ones (replay them for a timeline); keep_graph keeps
    CUDA's graphs readable for graph_rows."""
    m = build.model(dev, model, index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy)
    runner = Runner(m, buckets, "graph")
    t0 = time.perf_counter()
    with audit.recording(dev) as rec:
        runner.capture(record=rec, keep_graph=keep_graph)
    seconds = time.perf_counter() - t0
    with phases.phase("audit"):
        return rec.report(names=m.captures), runner, seconds


def graph_rows(rep, runner, config):
    """The audit against the graphs actually built (audit_graph.rows), one row per bucket: hazards
    the graph confirms (no path between the two ops' nodes) or contradicts, unordered overlapping
    pairs the audit missed, audited ops the graph lacks."""
    graphs = [runner.graphs[tr.label["bucket"]][0] for tr in rep.traces]
    with phases.phase("audit"):
        checked = audit_graph.rows(rep, graphs)
    return [dict(config, bucket=tr.label["bucket"], **r) for tr, r in zip(rep.traces, checked)]


# notebook 03's toggle table: the configuration, its replays' counts, and the audit's verdict
TOGGLE_COLUMNS = ["logits_policy", "index_dtype", "overlap", "bucket", "sessions", "corrupted_sessions"]
TOGGLE_COLUMNS += ["corrupted_steps", "steps", "not_replayed", "audit", "hazards", "tensors"]
GRAPH_COLUMNS = ["logits_policy", "index_dtype", "bucket", "hazards", "nodes", "confirmed"]
GRAPH_COLUMNS += ["confirmed_by_order", "contradicted", "undecidable", "missed", "lacking", "blind", "agree"]


def graph_verdict(graph, zoo):
    """One sentence: do the graphs actually built agree with the audit, on the model and on the zoo?"""
    errors = sorted(
        {r["error"] for r in graph if r.get("error")} | {z["graph_error"] for z in zoo if z["graph_error"]}
    )
    read = [r for r in graph if r.get("agree") is not None]
    off = [r for r in read if not r["agree"]]
    bug = [r for r in read if r["hazards"]]
    s = (
        f"the graphs as built ({read[0]['source'] if read else 'none read'}) agree with the audit in "
        f"{len(read) - len(off)} of {len(read)} forked captures: {sum(r['confirmed'] for r in bug)} hazard "
        f"pair(s) confirmed unordered in {len(bug)} capture(s) with a race, "
        f"{sum(r['missed'] for r in read)} unordered overlapping pair(s) the audit missed"
    )
    by_order, undecided = (sum(r.get(k, 0) for r in read) for k in ("confirmed_by_order", "undecidable"))
    if by_order:
        s += f" ({by_order} of the confirmed by ordering alone: a node's pointers unreadable)"
    if undecided:
        s += f"; {undecided} hazard pair(s) undecidable (an op without a graph node)"
    if off:
        s += "; they DISAGREE at " + ", ".join(
            f"{r['logits_policy']}/{r['index_dtype']}/bucket {r['bucket']}" for r in off
        )
    right, agree = sum(z["right"] for z in zoo), sum(z["graph_agrees"] for z in zoo)
    s += f". The zoo: the audit right on {right} of {len(zoo)} scenarios, the graph agreeing on {agree}."
    if errors:
        s += " Reading the graph failed: " + "; ".join(errors[:3]) + "."
    return s


def zoo_rows(dev):
    """The audit's zoo (planted races and their twins) audited and read back, one row per scenario."""
    out = []
    with phases.phase("audit"):
        zoo = audit_zoo.run(dev, keep_graph=True)
    for r in zoo:
        checks = audit_zoo.graph_check(r)
        d = {k: r.as_dict()[k] for k in ("case", "variant", "expected", "reported", "right")}
        d["graph_agrees"] = bool(checks) and all(c.get("agree") for c in checks)
        d["graph_error"] = "; ".join(c["error"] for c in checks if "error" in c)
        out.append(d)
    return out


def _pair(r):
    return f"{r['first_tensor']} ({r['first_stream']}) / {r['second_tensor']} ({r['second_stream']})"


class MatrixRow(BaseModel):
    """One row of notebook 00's symptom matrix (nblib.studies.reproduce.corruption_matrix, rates added):
    one (index dtype, mode, overlap, bucket) replayed over the workload."""

    model_config = ConfigDict(extra="forbid")
    index_dtype: str
    mode: str
    overlap: str
    bucket: int
    sessions: int
    corrupted_sessions: int
    steps: int
    corrupted_steps: int
    tail_steps: int
    tail_corrupted_steps: int
    buckets_replayed: list[int]  # the buckets the engine actually replayed while pinned to this one
    session_rate: float
    session_lo: float  # the Wilson interval's bounds
    session_hi: float
    step_rate: float
    step_lo: float
    step_hi: float


class Reproduced(BaseModel):
    """What notebook 03 reads of notebook 00's results: whether it finished, on which commit, with which
    parameters, and its symptom matrix. nblib.schema.results.Reproduce00, the model of 00's whole file,
    is one (it adds the rest of the file)."""

    model_config = ConfigDict(extra="forbid")
    status: Literal["running", "ok"]
    commit: str
    # the profile keys 00 declares, defaults applied (Reproduce00 types each value: ParamValue)
    params: dict[str, Any]
    matrix: list[MatrixRow] | None = None  # None: the run stopped before its matrix


def measured_matrix(
    reproduced: Reproduced | None,
    model: dict,
    buckets: Sequence[int],
    workload: dict,
    index_dtypes: Sequence[str],
    overlaps: Sequence[str],
    logits_policy: str,
) -> list[dict] | None:
    """Notebook 00's graph-mode rows when its run (`reproduced`, a Reproduced; None: none in the output
    folder) finished ok on this very commit with these parameters (the suite runs 00 first, in 03's
    lane); else None, and the toggles replay it themselves. The same runs then back both notebooks,
    and the suite does not pay for them twice."""
    if reproduced is None:
        return None
    p, here = reproduced.params, results.commit()
    same = (
        reproduced.status == "ok"
        and reproduced.matrix is not None
        and reproduced.commit == here
        and here != "unknown"
        and p.get("model") == model
        and p.get("buckets") == list(buckets)
        and {**p.get("workload", {}), "seed": p.get("seed")} == workload
        and p.get("logits_policy") == logits_policy
        and "graph" in p.get("modes", [])
        and set(index_dtypes) <= set(p.get("index_dtypes", []))
        and set(overlaps) <= set(p.get("overlaps", []))
    )
    return [m.model_dump() for m in reproduced.matrix if m.mode == "graph"] if same else None


def toggles(
    dev, model, buckets, workload, index_dtypes, overlaps, logits_policies, progress=print, measured=None
):
    """One row per (policy, dtype, overlap, bucket): corrupted sessions and the audit's hazards.
    measured: notebook 00's graph rows (measured_matrix) for the first policy, instead of replaying.
    The other policies (the fixes) are replayed where they change something: overlap on, and an index
    dtype whose main stream hands its logits across (HANDS_LOGITS_ACROSS). With overlap off nothing
    forks; fp8 allocates its logits on the side stream. The audit still reads those captures, and
    their rows say why they were not replayed."""
    for p in logits_policies:
        check_choice("logits policy", p, LOGITS_POLICIES)
    rows, reports = [], {}
    for i, policy in enumerate(logits_policies):
        if i == 0 and measured is not None:
            matrix = measured
        else:
            ovs = overlaps if i == 0 else [o for o in overlaps if o == "on"]
            dts = index_dtypes if i == 0 else [d for d in index_dtypes if d in HANDS_LOGITS_ACROSS]
            matrix = []
            if ovs and dts:
                knobs = reproduce.Knobs(dts, ["graph"], ovs, policy)
                found = reproduce.corruption_matrix(dev, model, buckets, workload, knobs, progress=progress)
                matrix = found.rows
        for dtype in index_dtypes:
            for ov in overlaps:
                keep = ov == "on"  # the forked captures are read back and cross-checked
                rep, runner, cap_s = audit_model(dev, model, buckets, dtype, ov, policy, keep_graph=keep)
                reports[(policy, dtype, ov)] = rep
                if ov == "on":
                    config = dict(logits_policy=policy, index_dtype=dtype, overlap=ov)
                    rep.graph_rows = graph_rows(rep, runner, config)
                by_bucket = rep.by("bucket")
                mine = [r for r in matrix if r["index_dtype"] == dtype and r["overlap"] == ov]
                why = "overlap off: nothing forks" if ov == "off" else f"{dtype}: no logits handed across"
                blank = dict(sessions=None, corrupted_sessions=None, steps=None, not_replayed=why)
                mine = mine or [dict(bucket=b, **blank) for b in buckets]
                for r in mine:
                    hz = [h.row() for h in by_bucket.get(r["bucket"], [])]
                    tensor_rows = audit.Report(rep.traces, by_bucket.get(r["bucket"], []), 0).rows("tensors")
                    rows.append(
                        dict(
                            logits_policy=policy,
                            index_dtype=dtype,
                            overlap=ov,
                            bucket=r["bucket"],
                            sessions=r["sessions"],
                            corrupted_sessions=r["corrupted_sessions"],
                            steps=r["steps"],
                            corrupted_steps=r.get("corrupted_steps"),
                            not_replayed=r.get("not_replayed", ""),
                            hazards=len(hz),
                            audit="hazard" if hz else "clean",
                            tensors="; ".join(_pair(t) for t in tensor_rows),
                            alloc_free=_sites(tensor_rows),
                        )
                    )
                if progress:
                    progress(
                        f"audit {policy:10s} {dtype:4s} overlap={ov:3s}: {rep.summary()} "
                        f"(capture {cap_s:.2f} s)"
                    )
                del runner
                gc.collect()
    return rows, reports


def telling_hazard(report, rows, key):
    """The hazard a reader meets first for the racy configuration `key` (logits policy, index dtype,
    overlap): one in the bucket whose replays corrupted the most sessions (toggles' rows), else the
    report's first (a race no replay showed: latent)."""
    bad = [r for r in rows if (r["logits_policy"], r["index_dtype"], r["overlap"]) == key]
    for r in sorted((r for r in bad if r["corrupted_sessions"]), key=lambda r: -r["corrupted_sessions"]):
        for h in report.hazards:
            if h.label.get("bucket") == r["bucket"]:
                return h
    return report.hazards[0]


def _sites(tensor_rows):
    return "; ".join(
        f"{t['first_tensor']}: alloc {t['first_alloc']}, free {t['first_free']} | "
        f"{t['second_tensor']}: alloc {t['second_alloc']}, free {t['second_free']}"
        for t in tensor_rows[:1]
    )


def checks(rows):
    """What the audit must get right, checked on the measured rows."""

    def check(name, sel, pred, expect):
        sel = [r for r in rows if sel(r)]
        bad = [r for r in sel if not pred(r)]
        return dict(
            check=name,
            configurations=len(sel),
            failures=len(bad),
            holds=bool(sel) and not bad,
            expected=expect,
            where=", ".join(_where(r) for r in bad[:4]),
        )

    named = lambda r: "indexer.logits (side)" in r["tensors"] and "(main)" in r["tensors"]
    return [
        check(
            "corrupting configuration -> the audit names the logits transient and a main-stream tensor",
            lambda r: (r["corrupted_sessions"] or 0) > 0,
            lambda r: r["hazards"] > 0 and named(r),
            "hazard",
        ),
        check(
            "bf16 + transient + overlap on -> hazard (every bucket where the bytes are reused)",
            _racy,
            lambda r: r["hazards"] > 0 or not r["corrupted_sessions"],
            "hazard",
        ),
        check(
            "overlap off -> no hazard", lambda r: r["overlap"] == "off", lambda r: r["hazards"] == 0, "clean"
        ),
        check(
            "persistent logits buffer -> no hazard",
            lambda r: r["logits_policy"] == "persistent",
            lambda r: r["hazards"] == 0,
            "clean",
        ),
        check(
            "record_stream before the free -> no hazard",
            lambda r: r["logits_policy"] == "record_stream",
            lambda r: r["hazards"] == 0,
            "clean",
        ),
        check(
            "fp8 (logits allocated on the side stream) -> no hazard",
            lambda r: r["index_dtype"] == "fp8",
            lambda r: r["hazards"] == 0,
            "clean",
        ),
        check(
            "no hazard -> no corruption (replayed configurations)",
            lambda r: r["hazards"] == 0 and r["sessions"] is not None,
            lambda r: r["corrupted_sessions"] == 0,
            "clean",
        ),
    ]


def _racy(r):
    return r["index_dtype"] == "bf16" and r["logits_policy"] == "transient" and r["overlap"] == "on"


def _where(r):
    return f"{r['logits_policy']}/{r['index_dtype']}/overlap {r['overlap']}/bucket {r['bucket']}"


def verdict(cks, rows):
    """One sentence from the checks and rows; it says so when the data disagree."""
    held = [c for c in cks if c["configurations"]]
    ok = all(c["holds"] for c in held)
    latent = [r for r in rows if r["hazards"] and r["sessions"] is not None and not r["corrupted_sessions"]]
    corrupt = [r for r in rows if r["corrupted_sessions"]]
    head = (
        "audit agrees with the replays"
        if ok
        else "audit DISAGREES with the replays: "
        + "; ".join(f"{c['check']} fails at {c['where']}" for c in held if not c["holds"])
    )
    s = (
        f"{head}: {len(corrupt)} corrupting configuration(s) "
        f"({', '.join(_where(r) for r in corrupt) or 'none'}), each with a named hazard; "
        f"no hazard with overlap off, a persistent buffer, record_stream, or fp8."
    )
    if latent:
        s += (
            f" Hazard without observed corruption (a latent race, intermittent at this sample size): "
            f"{', '.join(_where(r) for r in latent)}."
        )
    return s
