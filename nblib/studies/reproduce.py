"""The corruption matrix: index dtype x mode x overlap x bucket, session- and step-level.

Each row runs the agentic workload with at most `bucket` sessions decoding together (the decode
batch size the campaign varied), so the bucket-1 row is the batch-size-1 check. A row decodes
row_sessions(sessions, bucket) of the workload's sessions: twice its bucket, at least 8, at most all
of them. A batch of b sessions needs no more than a few times b to stay full, while the whole workload
one or eight sessions at a time would decode every token of every session in its own small step (the
bucket-1 row would cost as much as all the others together); the Wilson intervals widen to match.
A row counts only the steps replayed in its bucket's graph: the run's tail (fewer sessions left, a
smaller bucket) belongs to the smaller bucket's graph, not to this one. Every step is compared with
the eager single-stream reference; rates come with Wilson 95% intervals.
"""

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from nblib.core import stats
from nblib.engine import build, references
from nblib.engine.model import INDEX_DTYPES, LOGITS_POLICIES, OVERLAPS, check_choice
from nblib.engine.runner import MODES, Runner, check_buckets
from nblib.engine.workload import WorkloadConfig
from nblib.studies import protocol


class Knobs(NamedTuple):
    """The configurations a matrix runs: every index dtype x overlap x mode, under one logits policy."""

    index_dtypes: Sequence[str] = INDEX_DTYPES
    modes: Sequence[str] = MODES
    overlaps: Sequence[str] = OVERLAPS
    logits_policy: str = "transient"


EVERY_KNOB = Knobs()  # every index dtype, mode and overlap; logits transient (the race's policy)


ROW_MIN_SESSIONS = 8


def row_sessions(sessions: int, bucket: int) -> int:
    """The sessions a matrix row decodes: 2 x bucket, at least ROW_MIN_SESSIONS, at most `sessions`."""
    return min(sessions, max(2 * bucket, ROW_MIN_SESSIONS))


def check_matrix_args(knobs: Knobs, buckets):
    """Validate every choice up front: a typo fails in one line, before anything is allocated."""
    for d in knobs.index_dtypes:
        check_choice("index dtype", d, INDEX_DTYPES)
    for m in knobs.modes:
        check_choice("mode", m, MODES)
    for o in knobs.overlaps:
        check_choice("overlap mode", o, OVERLAPS)
    check_choice("logits policy", knobs.logits_policy, LOGITS_POLICIES)
    return check_buckets(buckets)


@dataclass
class Matrix:
    """What corruption_matrix measured.

    rows: one per configuration and bucket (its session and step counts, the buckets replayed).
    aliases: per graph capture, the tensors that shared bytes across streams.
    window_steps: every step replayed in its own bucket's graph with overlap on (index dtype,
        bucket, the batch's longest and total context, rows, corrupted rows): the data behind the
        race's window (window_table).
    protocols: protocol.ConfigProtocol, one per configuration protocol.configurations() picks, each
        run on the same graphs for the protocol's seeds (empty without them)."""

    rows: list[dict] = field(default_factory=list)
    aliases: list[dict] = field(default_factory=list)
    window_steps: list[dict] = field(default_factory=list)
    protocols: list[protocol.ConfigProtocol] = field(default_factory=list)


def corruption_matrix(
    dev, model, buckets, workload, knobs=EVERY_KNOB, protocol_seeds=(), progress=None
) -> Matrix:
    """Run every configuration of `knobs` on each bucket. `model`, `workload`: dicts of config values.
    protocol_seeds: the protocol's seeds (protocol.seeds(seed, runs)); none: no protocol is run.
    progress: called with a line per configuration (and the protocol's lines) as each finishes."""
    buckets = check_matrix_args(knobs, buckets)
    wanted = protocol.configurations(knobs.index_dtypes, knobs.modes, knobs.overlaps)
    sessions = WorkloadConfig(**workload).sessions
    out = Matrix()
    for dtype in knobs.index_dtypes:
        for overlap in knobs.overlaps:
            m = build.model(dev, model, index_dtype=dtype, overlap=overlap, logits_policy=knobs.logits_policy)
            for mode in knobs.modes:
                t0 = time.perf_counter()
                runner = Runner(m, buckets, mode, references=references.shared()).capture()
                if mode == "graph":
                    out.aliases += [dict(index_dtype=dtype, overlap=overlap, **a) for a in runner.aliases()]
                for b in buckets:
                    n = row_sessions(sessions, b)
                    run, counts = build.bucket_run(runner, workload, b, sessions=n)
                    if mode == "graph" and overlap == "on":
                        out.window_steps += [
                            dict(
                                index_dtype=dtype,
                                bucket=b,
                                ctx_max=s["ctx_max"],
                                ctx_sum=s["ctx_sum"],
                                bs=s["bs"],
                                bad_rows=s["bad_rows"],
                            )
                            for s in run["step_log"]
                            if s["bucket"] == b
                        ]
                    out.rows.append(
                        dict(
                            index_dtype=dtype,
                            mode=mode,
                            overlap=overlap,
                            bucket=b,
                            **counts,
                            buckets_replayed=sorted({s["bucket"] for s in run["step_log"]}),
                        )
                    )
                if protocol_seeds and (dtype, mode, overlap) in wanted:
                    out.protocols.append(
                        config_protocol(runner, workload, protocol_seeds, (dtype, mode, overlap), progress)
                    )
                if progress:
                    bad = [(r["bucket"], r["corrupted_sessions"]) for r in out.rows[-len(buckets) :]]
                    progress(
                        f"{dtype:4s} {mode:5s} overlap={overlap:3s}  corrupted sessions by "
                        f"bucket {bad}  ({time.perf_counter() - t0:.1f} s)"
                    )
                del runner
                gc.collect()
            del m
            gc.collect()
    return out


def config_protocol(runner, workload, seeds, cfg, progress):
    """The protocol on one configuration's captured runner; cfg: (index dtype, mode, overlap)."""
    label = "/".join(cfg) + " "
    p = protocol.run(runner, workload, seeds, progress=progress, label=label)
    expected = "corrupts" if cfg == protocol.RACY else "clean"
    return protocol.ConfigProtocol(
        index_dtype=cfg[0], mode=cfg[1], overlap=cfg[2], expected=expected, protocol=p
    )


def seed_blocks(dev, model, buckets, workload, bases, runs, logits_policy, known=None, progress=print):
    """The campaign's protocol on bf16 + graph + overlap on from each base seed of `bases`, `runs`
    runs each (protocol.seeds(base, runs)), on one capture: [protocol.Block], in the order of
    `bases`. known: {base: protocol.Protocol} already run from that base (the headline's), reused."""
    known = known or {}
    todo = [b for b in bases if b not in known]
    got = dict(known)
    if todo:
        dtype, mode, overlap = protocol.RACY
        m = build.model(dev, model, index_dtype=dtype, overlap=overlap, logits_policy=logits_policy)
        runner = Runner(m, check_buckets(buckets), mode, references=references.shared()).capture()
        for base in todo:
            label = f"seed block {base}: "
            got[base] = protocol.run(
                runner, workload, protocol.seeds(base, runs), progress=progress, label=label
            )
        del runner, m
        gc.collect()
    return [protocol.block(b, got[b]) for b in bases]


MATRIX_COLUMNS = [
    "index_dtype", "mode", "overlap", "bucket", "sessions", "corrupted_sessions",
    "session_lo", "session_hi", "steps", "corrupted_steps", "step_hi",
]  # fmt: skip


def with_intervals(rows):
    """Add Wilson 95% bounds for the session- and step-level rates."""
    out = []
    for r in rows:
        s = stats.rate(r["corrupted_sessions"], r["sessions"])
        t = stats.rate(r["corrupted_steps"], r["steps"])
        out.append(
            {
                **r,
                "session_rate": s["rate"],
                "session_lo": s["lo"],
                "session_hi": s["hi"],
                "step_rate": t["rate"],
                "step_lo": t["lo"],
                "step_hi": t["hi"],
            }
        )
    return out


def fingerprint(rows):
    """The campaign's fingerprint, checked on the measured rows (not asserted: reported).

    scope "pooled": the campaign's claims over all matching rows; these decide the verdict.
    scope "bucket": the corrupting configuration again, one row per bucket > 1, because a pool
    can hide a bucket that never corrupts (whether the freed logits block is handed on depends on
    the sizes, so on the bucket)."""

    def row(name, pred, expect_bad, scope="pooled"):
        sel = [r for r in rows if pred(r)]
        k, n = sum(r["corrupted_sessions"] for r in sel), sum(r["sessions"] for r in sel)
        lo, hi = stats.wilson(k, n)
        return dict(
            check=name,
            scope=scope,
            corrupted=k,
            sessions=n,
            upper95=hi,
            holds=None if n == 0 else (k > 0) if expect_bad else (k == 0),  # None: nothing measured
            expected="corrupts" if expect_bad else "clean",
            why=UNREACHED if n == 0 else "" if expect_bad else CLEAN_WHY.get(name, ""),
        )

    def racy(r):
        return r["index_dtype"] == "bf16" and r["mode"] == "graph" and r["overlap"] == "on"

    pooled = [
        row("bf16 + graph + overlap on, bucket > 1", lambda r: racy(r) and r["bucket"] > 1, True),
        row("eager", lambda r: r["mode"] == "eager", False),
        row("fp8", lambda r: r["index_dtype"] == "fp8", False),
        row("overlap off", lambda r: r["overlap"] == "off", False),
        row("bucket 1", lambda r: r["bucket"] == 1, False),
    ]
    per_bucket = [
        row(
            f"bf16 + graph + overlap on, bucket {b}",
            lambda r, b=b: racy(r) and r["bucket"] == b,
            True,
            "bucket",
        )
        for b in sorted({r["bucket"] for r in rows if racy(r) and r["bucket"] > 1})
    ]
    return pooled + per_bucket


UNREACHED = (
    "not measured: no step replayed this bucket's graph (the workload never has more sessions "
    "decoding together than the next bucket down holds)"
)

CLEAN_WHY = {
    "eager": "by construction: eager decode never forks a stream",
    "overlap off": "by construction: without the overlap nothing runs on a second stream",
    "fp8": "by the audit: the fp8 indexer allocates its logits on the side stream itself, so no "
    "main-stream block is handed across (notebook 03's audit finds no race)",
    "bucket 1": "by measurement: the fork and the freed block exist, but at one request the side "
    "branch ends long before the main branch's first write into the reused bytes",
}


def corrupting(rows, min_bucket=2):
    """The corrupting configuration (bf16, graph, overlap on) pooled over buckets >= min_bucket:
    sessions and steps, their rates, and the buckets that corrupted at all."""
    sel = [
        r
        for r in rows
        if r["index_dtype"] == "bf16"
        and r["mode"] == "graph"
        and r["overlap"] == "on"
        and r["bucket"] >= min_bucket
    ]
    k, n = sum(r["corrupted_sessions"] for r in sel), sum(r["sessions"] for r in sel)
    ks, ns = sum(r["corrupted_steps"] for r in sel), sum(r["steps"] for r in sel)
    return dict(
        corrupted_sessions=k,
        sessions=n,
        session_rate=k / n if n else 0.0,
        corrupted_steps=ks,
        steps=ns,
        step_rate=ks / ns if ns else 0.0,
        buckets=[r["bucket"] for r in sel],
        buckets_corrupting=[r["bucket"] for r in sel if r["corrupted_sessions"]],
    )


def window_table(steps):
    """Per bucket, over its bf16 steps: how many corrupted, the shortest longest-context that
    corrupted and the longest that did not (the window's edge, if the contexts decide it), and the
    clean steps at or above that shortest corrupted one (none when the contexts decide it)."""
    out = []
    for b in sorted({s["bucket"] for s in steps}):
        sel = [s for s in steps if s["bucket"] == b and s["index_dtype"] == "bf16"]
        bad = [s["ctx_max"] for s in sel if s["bad_rows"]]
        ok = [s["ctx_max"] for s in sel if not s["bad_rows"]]
        out.append(
            dict(
                bucket=b,
                steps=len(sel),
                corrupted_steps=len(bad),
                shortest_corrupted=min(bad) if bad else None,
                longest_clean=max(ok) if ok else None,
                clean_above_shortest_corrupted=sum(1 for c in ok if bad and c >= min(bad)),
            )
        )
    return out


def _quiet(quiet, aliases):
    """Buckets where the corrupting configuration never corrupted, and why that is expected: no
    block handed across at that size (the layout), or one handed across that no step reached in
    time (the window). Without the aliases, only the first reason can be named, as a possibility."""
    if not quiet:
        return ""
    shared = {a["bucket"] for a in aliases or [] if a["index_dtype"] == "bf16" and a["overlap"] == "on"}
    name = lambda c: f"{c['check'].rsplit(', ', 1)[1]} 0/{c['sessions']}"
    if aliases is None:
        return " Buckets where bf16 + graph + overlap on never corrupted (the alias depends on sizes): " + (
            "; ".join(name(c) for c in quiet) + "."
        )
    layout = [name(c) for c in quiet if int(c["check"].rsplit(" ", 1)[1]) not in shared]
    window = [name(c) for c in quiet if int(c["check"].rsplit(" ", 1)[1]) in shared]
    s = " Buckets where bf16 + graph + overlap on never corrupted, as expected:"
    s += f" {'; '.join(layout)} (no block handed across at that size)" if layout else ""
    s += ";" if layout and window else ""
    s += f" {'; '.join(window)} (a block handed across, but no step outlasted the window)" if window else ""
    return s + "."


def verdict(fp, rows, aliases=None):
    """One sentence from the measured fingerprint; it says so when the data disagree with it, and
    names any bucket > 1 where the corrupting configuration never corrupted, with why: given the
    aliases (corruption_matrix's), whether a freed block was handed across there at all."""
    corrupt = [r for r in rows if r["corrupted_sessions"]]
    where = (
        ", ".join(
            f"{r['index_dtype']}/{r['mode']}/overlap {r['overlap']}/bucket {r['bucket']}: "
            f"{r['corrupted_sessions']}/{r['sessions']}"
            for r in corrupt
        )
        or "nowhere"
    )
    pooled = [c for c in fp if c["scope"] == "pooled"]
    clean = [c for c in pooled if c["expected"] == "clean"]
    # reproduced: the race measured and seen, and no clean check that was measured broken
    held = pooled[0]["holds"] is True and all(c["holds"] is not False for c in pooled)
    head = "fingerprint reproduced" if held else "fingerprint NOT reproduced"
    bounds = "; ".join(
        f"{c['check']} {c['corrupted']}/{c['sessions']} (95% upper {100 * c['upper95']:.1f}%)"
        if c["sessions"]
        else f"{c['check']} not measured"
        for c in clean
    )
    quiet = [c for c in fp if c["scope"] == "bucket" and c["holds"] is False]
    unreached = [c["check"].rsplit(", ", 1)[1] for c in fp if c["scope"] == "bucket" and c["holds"] is None]
    tail = _quiet(quiet, aliases)
    if unreached:
        tail += f" Not measured (no step filled the bucket): {', '.join(unreached)}."
    return f"{head}: corrupted sessions {where}. Clean checks: {bounds}.{tail}"
