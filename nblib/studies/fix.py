"""The fix, proved: the buggy overlap against overlap off, the persistent buffer and record_stream.

    plan = fix.plan(buggy_rows, target=0.01)            # sessions each fix needs, per racy bucket
    rows = fix.corruption(dev, model, buckets, workload, variants, sessions)
    reports = fix.audits(dev, model, buckets, variants)
    times = fix.step_times(dev, model, buckets, variants, replays=200)
    cks = fix.checks(rows, reports, times, target); fix.verdict(cks, ...)

A fix is proved when (1) it corrupts no session where the buggy overlap does, over enough sessions
that the Wilson 95 % upper bound on its rate is below the target; (2) the capture audit finds no race
in it; (3) its decode step keeps the overlap's speed. The overlap is worth keeping when it makes the
step at least 10 % faster than overlap off at two or more buckets; at each such bucket a fix must keep
at least 90 % of that gain, and may not be more than 5 % faster than the buggy overlap either (a fix
faster than the overlap it fixes ran less work): a two-sided check that fails when the gain is lost
and fails, not skips, when there is no gain to keep.
"""

import gc
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from nblib.core import phases, stats
from nblib.engine import build, references
from nblib.engine.build import full_batch
from nblib.engine.runner import Runner
from nblib.instruments.overhead import timed, timer, warmups

if TYPE_CHECKING:
    from nblib.backends.device import Device
    from nblib.instruments.audit import Report

__all__ = [
    "BUGGY",
    "FIXES",
    "HELPS",
    "HELPS_AT",
    "KEEP",
    "SPEED_KEYS",
    "SPEED_TOLERANCE",
    "VARIANTS",
    "audits",
    "branch_fns",
    "branches",
    "check_variants",
    "checks",
    "overlap_story",
    "plan",
    "pooled",
    "run_variant",
    "speed",
    "speed_checks",
    "step_times",
    "verdict",
]

Row = dict[str, Any]  # a table row: a corruption, timing, speed or check row

VARIANTS = {
    "buggy overlap": dict(overlap="on", logits_policy="transient"),
    "overlap off": dict(overlap="off", logits_policy="transient"),
    "persistent buffer": dict(overlap="on", logits_policy="persistent"),
    "record_stream": dict(overlap="on", logits_policy="record_stream"),
}
BUGGY = "buggy overlap"
FIXES = ("persistent buffer", "record_stream")
SPEED_TOLERANCE = 0.05  # a fix more than 5 % faster than the buggy overlap ran less work
HELPS = 0.10  # the overlap is worth keeping at a bucket when overlap off is >= 10 % slower
HELPS_AT = 2  # ... at this many buckets or more
KEEP = 0.90  # a fix keeps at least this share of the overlap's gain


def check_variants(variants: Iterable[str]) -> list[str]:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or BUGGY not in variants:
        raise ValueError(
            f"variants must include {BUGGY!r} and come from {', '.join(VARIANTS)}; got {variants}"
        )
    return list(variants)


def _model(dev, model, variant, index_dtype):
    return build.model(dev, model, index_dtype=index_dtype, **VARIANTS[variant])


def run_variant(
    dev: "Device",
    model: Mapping[str, Any],
    buckets: Sequence[int],
    workload: Mapping[str, Any],
    variant: str,
    sessions: Mapping[int, int] | None = None,
    index_dtype: str = "bf16",
    progress: Callable[[str], object] | None = print,
    floor: Mapping[int, int] | None = None,
) -> list[Row]:
    """Corruption rows for one variant: {bucket: sessions} (or None: the workload's own) per bucket.
    floor: {bucket: sessions} each row must count at least (plan's), topped up with new seeds."""
    m = _model(dev, model, variant, index_dtype)
    runner = Runner(m, buckets, "graph", references=references.shared()).capture()
    rows = []
    for b in sorted(buckets):
        n = (sessions or {}).get(b, workload["sessions"])
        parts = _bucket_parts(runner, workload, b, n, (floor or {}).get(b, 0))
        rows.append(dict(variant=variant, bucket=b, **{key: sum(p[key] for p in parts) for key in parts[0]}))
        if progress:
            progress(
                f"{variant:18s} bucket {b:3d}: corrupted "
                f"{rows[-1]['corrupted_sessions']}/{rows[-1]['sessions']}"
            )
    del runner, m
    gc.collect()
    return rows


def _bucket_parts(runner, workload, b, n, floor, extra=8):
    """The counts of `n` sessions at bucket `b`, in chunks of the profile's sessions with new seeds (so
    the cache pages the profile sized for its concurrent sessions still suffice), then more chunks
    while the counted sessions are below `floor`: a chunk's last sessions can decode only in a
    smaller bucket's graph, where they do not count for this one (run_sessions' tail). A top-up
    chunk holds at least `b` sessions, so its first step fills the bucket; at most `extra` of them."""
    size = workload["sessions"]
    seed = workload.get("seed", 0)
    chunks = [min(size, n - i) for i in range(0, n, size)]

    def chunk(k, c):  # the k-th chunk of c sessions, on its own seed
        return build.bucket_run(runner, workload, b, sessions=c, seed=seed + 1000 * k).counts

    parts = [chunk(k, c) for k, c in enumerate(chunks)]
    for k in range(len(chunks), len(chunks) + extra):
        counted = sum(p["sessions"] for p in parts)
        if counted >= floor or b > size:
            break
        parts.append(chunk(k, min(size, max(floor - counted, b))))
    return parts


def plan(
    buggy_rows: Sequence[Row], target: float = 0.01, margin: float = 1.1, min_bucket: int = 2
) -> dict[str, Any]:
    """Sessions per bucket for each fix: enough, pooled over the buckets where the buggy overlap
    corrupted (or over all buckets >= min_bucket if it corrupted nowhere), for the Wilson upper
    bound at zero failures to fall below `target`. Decided from the buggy run only. sessions: what
    each bucket runs (the need, `margin` over); floor: what each bucket must count, an equal share
    of the need (run_variant tops a bucket up to it)."""
    need = stats.zero_failure_sessions(target, method="wilson")
    racy = sorted(r["bucket"] for r in buggy_rows if r["corrupted_sessions"])
    where = racy or sorted(r["bucket"] for r in buggy_rows if r["bucket"] >= min_bucket)
    per = math.ceil(need * margin / max(1, len(where)))
    return dict(
        needed=need,
        target=target,
        racy_buckets=racy,
        pooled_buckets=where,
        sessions={b: per for b in where},
        floor={b: math.ceil(need / max(1, len(where))) for b in where},
    )


def pooled(rows: Sequence[Row], buckets: Collection[int]) -> list[Row]:
    """Per variant: corrupted sessions over `buckets`, with the Wilson interval."""
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        sel = [r for r in rows if r["variant"] == v and r["bucket"] in buckets]
        k, n = sum(r["corrupted_sessions"] for r in sel), sum(r["sessions"] for r in sel)
        s = stats.rate(k, n)
        out.append(
            dict(
                variant=v,
                buckets=list(buckets),
                corrupted_sessions=k,
                sessions=n,
                rate=s["rate"],
                lo=s["lo"],
                hi=s["hi"],
            )
        )
    return out


def audits(
    dev: "Device",
    model: Mapping[str, Any],
    buckets: Sequence[int],
    variants: Iterable[str],
    index_dtype: str = "bf16",
) -> dict[str, "Report"]:
    """The capture audit of every bucket of each variant: {variant: Report}."""
    from nblib.instruments import audit

    out = {}
    for v in variants:
        m = _model(dev, model, v, index_dtype)
        with audit.recording(dev) as rec:
            Runner(m, buckets, "graph").capture(record=rec)
        with phases.phase("audit"):
            out[v] = rec.report(names=m.captures)
        del m
        gc.collect()
    return out


def step_times(
    dev: "Device",
    model: Mapping[str, Any],
    buckets: Sequence[int],
    variants: Sequence[str],
    replays: int = 200,
    warmup: int | None = None,
    index_dtype: str = "bf16",
    seed: int = 0,
    measure: Callable[[Callable[[], object]], float] | None = None,
    ctx: int | None = None,
) -> list[Row]:
    """Decode-step (graph replay) time per bucket and variant: a full batch of `ctx` entries a
    request (None or 0: half the longest context), `replays` timed replays after `warmup`
    (default: overhead.warmups); median and quartiles in ms.

    The variants take turns, one replay each, round after round: whatever drifts while they are
    timed (clocks, heat, another process's load on the host that launches the replays) falls on
    every variant alike, so their ratios compare like with like. measure: a timer from
    overhead.timer (default: the device's own)."""
    with phases.phase("timing"):
        return _step_times(dev, model, buckets, variants, replays, warmup, index_dtype, seed, measure, ctx)


def _step_times(dev, model, buckets, variants, replays, warmup, index_dtype, seed, measure, ctx):
    method, measure = timer(dev) if measure is None else ("given", measure)
    warmup = warmups(dev, warmup, cuda=10)
    runners = {}
    for v in variants:  # every variant captured first: all their graphs are live together
        m = _model(dev, model, v, index_dtype)
        runners[v] = (m, Runner(m, buckets, "graph").capture())
    rows = []
    for b in sorted(buckets):
        batches = {v: full_batch(m, b, seed, ctx) for v, (m, _) in runners.items()}
        calls = {v: partial(r.run, *batches[v]) for v, (_, r) in runners.items()}
        ts = {v: [] for v in variants}
        for i in range(warmup + replays):
            for v in variants:
                t = measure(calls[v])
                if i >= warmup:
                    ts[v].append(t)
        for v in variants:
            q = statistics.quantiles(ts[v], n=4)
            rows.append(
                dict(
                    variant=v,
                    bucket=b,
                    median_ms=statistics.median(ts[v]),
                    q1_ms=q[0],
                    q3_ms=q[2],
                    replays=replays,
                    ctx=int(batches[v].seq_lens[0]),
                    method=method,
                )
            )
    del runners
    gc.collect()
    return rows


def branch_fns(m: Any, batch: build.Batch) -> dict[str, Callable[[], Any]]:
    """The two branches the overlap runs side by side, as calls on one batch: the side branch
    (indexer logits + top-k) and the main branch (trunk + MLP)."""
    tokens, table, lens, _ = batch
    x = m.embed[tokens]
    q = (x @ m.w_q).view(-1, m.cfg.heads, m.cfg.dim)
    w = (x @ m.w_head).float()
    return dict(indexer=lambda: m.indexer(q, w, table, lens, None), main=lambda: m.main_branch(x))


def branches(
    dev: "Device",
    model: Mapping[str, Any],
    buckets: Sequence[int],
    replays: int = 50,
    warmup: int | None = None,
    index_dtype: str = "bf16",
    seed: int = 0,
    ctx: int | None = None,
) -> list[Row]:
    """Each branch timed alone (eager, one stream) on the same full batch as step_times (`ctx`
    entries a request). The overlap can hide at most the shorter one."""
    with phases.phase("timing"):
        return _branches(dev, model, buckets, replays, warmup, index_dtype, seed, ctx)


def _branches(dev, model, buckets, replays, warmup, index_dtype, seed, ctx):
    _, measure = timer(dev)
    warmup = warmups(dev, warmup, cuda=5)
    m = _model(dev, model, "overlap off", index_dtype)
    rows = []
    for b in sorted(buckets):
        fns = branch_fns(m, full_batch(m, b, seed, ctx))
        rows.append(
            dict(
                bucket=b,
                **{f"{k}_ms": statistics.median(timed(measure, f, replays, warmup)) for k, f in fns.items()},
            )
        )
    del m
    gc.collect()
    return rows


SPEED_KEYS = {  # results.json's speed rows: one plain key per variant
    BUGGY: "overlap_on_ms",
    "overlap off": "overlap_off_ms",
    "persistent buffer": "persistent_ms",
    "record_stream": "record_stream_ms",
}


def speed(times: Sequence[Row]) -> list[Row]:
    """Per bucket: each variant's median step (ms, keys of SPEED_KEYS), the overlap's gain
    (off / on - 1) and, per fix, the share of that gain it keeps ((off - fix) / (off - on))."""
    out = []
    for b in sorted({t["bucket"] for t in times}):
        t = {x["variant"]: x["median_ms"] for x in times if x["bucket"] == b}
        row = dict(bucket=b, **{SPEED_KEYS[v]: t[v] for v in t})
        on, off = t.get(BUGGY), t.get("overlap off")
        if on and off:
            row["overlap_gain"] = off / on - 1
            row["overlap_helps"] = row["overlap_gain"] >= HELPS
            for f in FIXES:
                if f in t:
                    row[f"{SPEED_KEYS[f][:-3]}_kept"] = (off - t[f]) / (off - on) if off != on else None
                    row[f"{SPEED_KEYS[f][:-3]}_vs_on"] = t[f] / on
        out.append(row)
    return out


def speed_checks(speed_rows: Sequence[Row], fixes: Iterable[str] = FIXES) -> list[Row]:
    """The overlap is worth keeping (>= HELPS gain at >= HELPS_AT buckets), and each fix keeps at
    least KEEP of the gain where it is, without being more than SPEED_TOLERANCE faster than the buggy
    overlap. Every check is listed, and fails rather than disappears when there is nothing to keep."""
    helps = [s for s in speed_rows if s.get("overlap_helps")]
    gains = ", ".join(
        f"{s['bucket']}: {100 * s['overlap_gain']:+.1f}%" for s in speed_rows if "overlap_gain" in s
    )
    out = [
        dict(
            check=f"overlap worth keeping: >= {100 * HELPS:g}% faster than overlap off "
            f"at >= {HELPS_AT} buckets",
            measured=f"gain by bucket {gains or 'not measured'}",
            holds=len(helps) >= HELPS_AT,
        )
    ]
    for f in fixes:
        key = SPEED_KEYS[f][:-3]
        got = [s for s in helps if s.get(f"{key}_kept") is not None]
        if not got:
            out.append(
                dict(
                    check=f"{f}: keeps >= {100 * KEEP:g}% of the overlap's gain",
                    measured="no gain to keep",
                    holds=False,
                )
            )
            continue
        worst = min(got, key=lambda s: s[f"{key}_kept"])
        fastest = min(got, key=lambda s: s[f"{key}_vs_on"])
        out.append(
            dict(
                check=f"{f}: keeps >= {100 * KEEP:g}% of the overlap's gain, and is not > "
                f"{100 * SPEED_TOLERANCE:g}% faster than the buggy overlap",
                measured=f"keeps at worst {100 * worst[f'{key}_kept']:.0f}% (bucket {worst['bucket']}); "
                f"at best {fastest[f'{key}_vs_on']:.3f}x the buggy overlap's time "
                f"(bucket {fastest['bucket']})",
                holds=worst[f"{key}_kept"] >= KEEP and fastest[f"{key}_vs_on"] >= 1 - SPEED_TOLERANCE,
            )
        )
    return out


def checks(
    rows: Sequence[Row],
    plan_: Mapping[str, Any],
    reports: Mapping[str, "Report"],
    speed_rows: Sequence[Row],
    fixes: Iterable[str] = FIXES,
    gpu_times: bool = True,
) -> list[Row]:
    """What the fix must show, checked on the measured data. gpu_times False (the simulator: the
    times are its timing model's, not a GPU's): the speed checks are listed with holds None."""
    pool = {p["variant"]: p for p in pooled(rows, plan_["pooled_buckets"])}
    out = []
    for f in fixes:
        p = pool.get(f)
        if p is None:
            continue
        out.append(
            dict(
                check=f"{f}: 0 corrupted sessions, upper bound < {100 * plan_['target']:g}%",
                measured=f"{p['corrupted_sessions']}/{p['sessions']} (upper {100 * p['hi']:.2f}%)",
                holds=p["corrupted_sessions"] == 0 and p["hi"] < plan_["target"],
            )
        )
    for v, rep in reports.items():
        want = v == BUGGY
        out.append(
            dict(
                check=f"{v}: the audit {'names a race' if want else 'finds no race'}",
                measured=rep.summary(),
                holds=(not rep.ok) == want,
            )
        )
    speed_cks = speed_checks(speed_rows, fixes)
    if not gpu_times:
        for c in speed_cks:
            c.update(holds=None, measured=c["measured"] + " (the simulator's timing model: not judged)")
    return out + speed_cks


def overlap_story(speed_rows: Iterable[Row], branch_rows: Iterable[Row]) -> tuple[list[Row], str]:
    """Per bucket: what the overlap could hide (the shorter branch alone) and what it did hide
    (overlap off minus buggy overlap); one sentence, saying so when it helps nowhere."""
    br = {r["bucket"]: r for r in branch_rows}
    rows = []
    for s in speed_rows:
        b = br.get(s["bucket"])
        if b is None or "overlap_off_ms" not in s:
            continue
        rows.append(
            dict(
                bucket=s["bucket"],
                indexer_ms=b["indexer_ms"],
                main_ms=b["main_ms"],
                could_hide_ms=min(b["indexer_ms"], b["main_ms"]),
                hidden_ms=s["overlap_off_ms"] - s["overlap_on_ms"],
                helps=s["overlap_helps"],
            )
        )
    helps = [r["bucket"] for r in rows if r["helps"]]
    detail = ", ".join(
        f"bucket {r['bucket']}: hid {r['hidden_ms']:.3f} of {r['could_hide_ms']:.3f} ms" for r in rows
    )
    if helps:
        text = (
            f"the overlap helps at buckets {helps} (at least {100 * HELPS:g}% faster than overlap off); "
            f"{detail}"
        )
    else:
        text = (
            f"the overlap helps at no bucket (none is {100 * HELPS:g}% faster with it): "
            f"{detail}. Run side by side, the two branches share the device, and the shorter one is "
            f"not hidden behind the longer."
        )
    return rows, text


def verdict(cks: Sequence[Row], plan_: Mapping[str, Any], pool_rows: Sequence[Row]) -> str:
    bad = [c for c in cks if c["holds"] is False]
    unjudged = [c for c in cks if c["holds"] is None]
    # the buggy overlap's row: present whenever it corrupted somewhere (plan_'s racy_buckets)
    buggy: Any = next((p for p in pool_rows if p["variant"] == BUGGY), None)
    head = (
        "the bug was not reproduced here, so no fix can be proved against it; "
        if not plan_["racy_buckets"]
        else f"the buggy overlap corrupted {buggy['corrupted_sessions']}/{buggy['sessions']} sessions "
        f"in buckets "
        f"{plan_['racy_buckets']}; "
    )
    fixes = "; ".join(
        f"{p['variant']} {p['corrupted_sessions']}/{p['sessions']} (95% upper {100 * p['hi']:.2f}%)"
        for p in pool_rows
        if p["variant"] != BUGGY
    )
    tail = (
        "every check holds"
        if not bad
        else "checks that FAIL: " + "; ".join(f"{c['check']} ({c['measured']})" for c in bad)
    )
    if unjudged:
        tail += (
            f" ({len(unjudged)} speed check(s) not judged: the simulator's times are its timing "
            f"model's, not a GPU's)"
        )
    return f"{head}over the same buckets: {fixes}. {tail}."
