"""The writeup (notebook 05): built from one run's results.json files alone, so every number in it
is one a notebook measured. A notebook that did not finish shows as missing, never as a finding.

    results = report.load(output_dir)
    md = report.writeup(results)          # markdown; report.save(output_dir, md) writes writeup.md
"""

import json
from pathlib import Path
from typing import NamedTuple

from nblib.core import stats
from nblib.core.files import write_text
from nblib.core.paths import MEASURING as NOTEBOOKS
from nblib.publish import caveats
from nblib.publish.show import markdown_table
from nblib.schema import results as R
from nblib.studies import designs

FIGURES = (
    (
        "00_protocol.png",
        "The campaign's protocol: each run's corrupted sessions and the pooled rate (notebook 00)",
    ),
    (
        "00_seed_blocks.png",
        "The same protocol from each seed block: each run's rate and each block's pooled rate (notebook 00)",
    ),
    (
        "00_bucket_steps.png",
        "Each bucket's replayed steps and how many corrupted, pooled over the protocol's runs (notebook 00)",
    ),
    (
        "02_designs.png",
        "The differential's designs on the protocol: rate per design, what each saw (notebook 02)",
    ),
    ("00_matrix_sessions.png", "Corrupted sessions by configuration and bucket (notebook 00)"),
    ("03_timeline.png", "The two streams of one capture, the racing ops in red (notebook 03)"),
    ("04_step_times.png", "Decode-step time per bucket, buggy overlap vs the fixes (notebook 04)"),
)


class Measured(NamedTuple):
    """The measuring notebooks' results in one run, each None when missing or not finished."""

    reproduce: R.Reproduce00 | None
    canary: R.Canary01 | None
    graph_vs_eager: R.GraphVsEager02 | None
    overlap: R.Overlap03 | None
    fix: R.Fix04 | None


def load(output_dir):
    """{notebook: its results through its model (nblib.schema.results), or None when missing,
    unreadable or not finished (status other than "ok")}. A file that reads but does not fit its
    model raises: a finished notebook's file was validated when it said ok."""
    out = {}
    for name in NOTEBOOKS:
        try:
            r = R.load(Path(output_dir) / f"{name}.results.json")
        except (OSError, json.JSONDecodeError):
            r = None
        out[name] = r if r and r.status == "ok" else None
    return out


def measured(results):
    return Measured(*(results[n] for n in NOTEBOOKS))


def environment(results):
    """One row per notebook: where and on which code it ran."""
    return [
        dict(
            notebook=n,
            status="ok" if r else "missing",
            device=r.device if r else "-",
            torch=r.torch if r else "-",
            triton=r.triton if r else "-",
            commit=r.commit[:12] if r else "-",
            seconds=r.seconds if r else "-",
        )
        for n, r in results.items()
    ]


def same_code(results):
    commits = {r.commit for r in results.values() if r}
    return len(commits) == 1, sorted(commits)


def _rate(k, n):
    return stats.fmt_rate(k, n) if n else "no sessions"


def investigation(results):
    """The campaign's table: one row per step, each finding computed from that step's results."""
    m = measured(results)
    rows = []

    def add(step, question, finding):
        rows.append(dict(step=step, question=question, finding=finding))

    if m.reproduce:
        bad = [x for x in m.reproduce.matrix if x.corrupted_sessions]
        where = (
            "; ".join(
                f"{x.index_dtype}/{x.mode}/overlap {x.overlap}/bucket {x.bucket} "
                f"{_rate(x.corrupted_sessions, x.sessions)}"
                for x in bad
            )
            or "nowhere"
        )
        add(
            "00 symptom matrix",
            "where does the output go wrong?",
            f"corrupted: {where}. {m.reproduce.verdict}",
        )
    else:
        add("00 symptom matrix", "where does the output go wrong?", "not run in this run")
    add(
        "01 canary",
        "is the index-K cache being overwritten?",
        m.canary.verdict if m.canary else "not run in this run",
    )
    _graph_vs_eager(m.graph_vs_eager, add)
    _overlap(m.overlap, add)
    if m.fix:
        add("04 fix", "does the persistent buffer remove it, with confidence?", m.fix.verdict)
        add("04 speed", "does the fix keep the overlap's speed?", _speed(m.fix))
    else:
        add("04 fix", "does the fix remove it?", "not run in this run")
    return rows


def _graph_vs_eager(r2, add):
    if not r2:
        add("02 graph vs eager", "does the differential see it?", "not run in this run")
        return
    off = r2.off
    add("02 graph vs eager", "does the differential see it, and does it change the rate?", r2.verdict)
    add(
        "02 the Heisenbug explained",
        "layout, lifetime, in-step timing or batch dynamics: why does an instrument move the rate?",
        " ".join(f"{f.design}: {f.effect} ({f.why})." for f in r2.explanation.findings),
    )
    if r2.campaign_verdict:
        add(
            "02 the campaign's design",
            "does the campaign's own design reproduce its drop?",
            r2.campaign_verdict,
        )
    if r2.forced_verdict:
        add(
            "02 under the forced order",
            "did a design move the rate by timing, or take the race away?",
            r2.forced_verdict,
        )
    need = "; ".join(f"baseline {x.baseline:.3g}: {x.fisher} sessions per arm" for x in r2.sessions_needed)
    add(
        "02 Heisenbug statistics",
        "how many sessions tell a real change in rate from chance?",
        f"to detect a rate falling to zero with 80% power (Fisher, alpha 0.05): {need}; to claim a rate "
        f"below 1% with no failure: {r2.zero_failure_1pct} sessions. Measured without instrument: "
        f"{_rate(off.corrupted_sessions, off.sessions)}; "
        + "; ".join(
            f"{a.design} {_rate(a.corrupted_sessions, a.sessions)} (Fisher p = {a.fisher_p:.2g})"
            for a in r2.designs
        ),
    )


def _overlap(r3, add):
    if not r3:
        add("03 overlap toggles / audit", "which knob, which race?", "not run in this run")
        return
    add("03 overlap toggles", "which knob turns it off?", r3.verdict)
    h = r3.hazards[0] if r3.hazards else None
    named = (
        f"{h.kind}: {h.first_op} ({h.first_stream}) on {h.first_tensor} "
        f"[alloc {h.first_alloc}; free {h.first_free}] vs {h.second_op} ({h.second_stream}) "
        f"on {h.second_tensor} [alloc {h.second_alloc}], bucket {h.bucket}, {h.nbytes} bytes"
        if h
        else "no hazard named"
    )
    csan_s = f" PyTorch's CUDA sanitizer on the same captures: {r3.csan_verdict}" if r3.csan_verdict else ""
    add(
        "03 capture audit",
        "what races, from one capture?",
        f"{named}. One capture audited in {r3.audit_one_capture_seconds} s.{csan_s}",
    )
    if r3.forced_verdict:
        add(
            "03 the forced order",
            "does each hazard change the output when its order is forced?",
            r3.forced_verdict,
        )


def _speed(r4):
    """The speed finding; labelled as the simulator's timing model (and not judged) where it is."""
    method = r4.times[0].method if r4.times else ""
    judged = "; ".join(f"{c.check}: {c.measured}" for c in r4.checks if "decode step" in c.check)
    text = f"{r4.overlap_story} {judged}".strip()
    if caveats.gpu_time(method):
        return text
    return f"Not judged: the step times are the simulator's timing model, not a GPU's. Measured: {text}"


def backend_section(results):
    """The writeup's account of what this run's backend can and cannot show (empty when nothing)."""
    notes = caveats.backend_notes(results)
    if not notes:
        return []
    lines = [f"- {'' if n == 'all' else f'**{n[:2]}** '}{s}" for n, s in notes]
    return ["## What this backend shows, and what it cannot", "\n".join(lines)]


def figures(output_dir):
    return [(f, cap) for f, cap in FIGURES if (Path(output_dir) / f).exists()]


def writeup(results, output_dir):
    """The whole writeup as markdown (tables, figure links, environment)."""
    ran = [n for n, r in results.items() if r]
    first = results[ran[0]] if ran else None
    same, commits = same_code(results)
    parts = [
        f"# Capture-corruption investigation: {Path(output_dir).name}",
        f"Backend {first.backend if first else '-'}, device {first.device if first else '-'}, "
        f"{len(ran)} of {len(NOTEBOOKS)} notebooks finished. "
        + (
            "All ran on commit " + commits[0][:12] + "."
            if same and commits
            else f"They ran on {len(commits)} different commits: {', '.join(c[:12] for c in commits)}."
        ),
        "## The investigation",
        markdown_table(investigation(results), ["step", "question", "finding"]),
        *backend_section(results),
    ]
    parts += _tables(measured(results))
    parts += ["## Figures"] + [f"![{cap}]({f})\n\n*{cap}*" for f, cap in figures(output_dir)]
    parts += ["## Environment", markdown_table(environment(results))]
    return "\n\n".join(parts) + "\n"


def _tables(m):
    """The fix's, the designs' and the fingerprint's tables, for the notebooks that finished."""
    parts = []
    if m.fix:
        parts += [
            "## The fix",
            markdown_table(
                _dicts(m.fix.pooled),
                ["variant", "buckets", "corrupted_sessions", "sessions", "rate", "lo", "hi"],
            ),
            markdown_table([c.model_dump() for c in m.fix.checks], ["check", "measured", "holds"]),
            "## Speed (decode step, median ms)",
            markdown_table(_dicts(m.fix.speed)),
        ]
    if m.graph_vs_eager:
        arms = [m.graph_vs_eager.off, *m.graph_vs_eager.designs]
        parts += [
            "## The differential's designs (notebook 02)",
            markdown_table([a.model_dump() for a in arms], designs.COLUMNS),
            m.graph_vs_eager.explanation.text.replace("\n", "\n\n"),
        ]
        if m.graph_vs_eager.bucket_table:
            parts += [
                "Steps per bucket (corrupted/steps), each design beside off:",
                markdown_table(_dicts(m.graph_vs_eager.bucket_table)),
            ]
        if m.graph_vs_eager.campaign_verdict:
            parts.append(m.graph_vs_eager.campaign_verdict)
    if m.reproduce:
        if m.reproduce.protocol_checks:
            parts += [
                "## The campaign's protocol (notebook 00)",
                markdown_table(_dicts(m.reproduce.protocol_checks)),
            ]
        parts += [
            "## The fingerprint (notebook 00)",
            markdown_table(
                _dicts(m.reproduce.fingerprint.checks),
                ["check", "scope", "corrupted", "sessions", "upper95", "holds", "expected", "why"],
            ),
        ]
    return parts


def _dicts(rows):
    """A table's row models as the dicts the notebook wrote (the keys it wrote, no others)."""
    return [r.model_dump(exclude_unset=True) for r in rows]


def save(output_dir, text, name="writeup.md"):
    return write_text(Path(output_dir) / name, text)
