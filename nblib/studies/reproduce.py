"""The corruption matrix: index dtype x mode x overlap x bucket, session- and step-level.

Each row runs the agentic workload with at most `bucket` sessions decoding together (the decode
batch size the campaign varied), so the bucket-1 row is the batch-size-1 check. A row counts only
the steps replayed in its bucket's graph: the run's tail (fewer sessions left, a smaller bucket)
belongs to the smaller bucket's graph, not to this one. Every step is
compared with the eager single-stream reference; rates come with Wilson 95% intervals.
"""

import gc
import time

from nblib.core import stats
from nblib.engine.model import INDEX_DTYPES, OVERLAPS, DecodeModel, ModelConfig, check_choice
from nblib.engine.runner import MODES, Runner, check_buckets
from nblib.engine.workload import WorkloadConfig, in_bucket, run_sessions


def check_matrix_args(index_dtypes, modes, overlaps, buckets, logits_policy="transient"):
    """Validate every choice up front: a typo fails in one line, before anything is allocated."""
    for d in index_dtypes:
        check_choice("index dtype", d, INDEX_DTYPES)
    for m in modes:
        check_choice("mode", m, MODES)
    for o in overlaps:
        check_choice("overlap mode", o, OVERLAPS)
    from nblib.engine.model import LOGITS_POLICIES

    check_choice("logits policy", logits_policy, LOGITS_POLICIES)
    return check_buckets(buckets)


def corruption_matrix(
    dev,
    model,
    buckets,
    workload,
    index_dtypes=INDEX_DTYPES,
    modes=MODES,
    overlaps=OVERLAPS,
    logits_policy="transient",
    progress=print,
):
    """Run every configuration; returns (rows, aliases). `model`, `workload`: dicts of config values."""
    buckets = check_matrix_args(index_dtypes, modes, overlaps, buckets, logits_policy)
    base = ModelConfig(**model, logits_policy=logits_policy)
    rows, aliases = [], []
    for dtype in index_dtypes:
        for overlap in overlaps:
            m = DecodeModel(base.with_knobs(index_dtype=dtype, overlap=overlap), dev)
            for mode in modes:
                t0 = time.perf_counter()
                runner = Runner(m, buckets, mode).capture()
                if mode == "graph":
                    aliases += [dict(index_dtype=dtype, overlap=overlap, **a) for a in runner.aliases()]
                for b in buckets:
                    r = run_sessions(runner, WorkloadConfig(**{**workload, "concurrency": b}))
                    rows.append(
                        dict(
                            index_dtype=dtype,
                            mode=mode,
                            overlap=overlap,
                            bucket=b,
                            **in_bucket(r, b),
                            buckets_replayed=sorted({s["bucket"] for s in r["step_log"]}),
                        )
                    )
                if progress:
                    bad = [(x["bucket"], x["corrupted_sessions"]) for x in rows[-len(buckets) :]]
                    progress(
                        f"{dtype:4s} {mode:5s} overlap={overlap:3s}  corrupted sessions by "
                        f"bucket {bad}  ({time.perf_counter() - t0:.1f} s)"
                    )
                del runner
                gc.collect()
            del m
            gc.collect()
    return rows, aliases


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
    """The campaign's fingerprint, checked on the measured rows (not asserted: reported)."""

    def bad(pred):
        sel = [r for r in rows if pred(r)]
        return sum(r["corrupted_sessions"] for r in sel), sum(r["sessions"] for r in sel)

    def row(name, pred, expect_bad):
        k, n = bad(pred)
        lo, hi = stats.wilson(k, n)
        holds = (k > 0) if expect_bad else (k == 0)
        return dict(
            check=name,
            corrupted=k,
            sessions=n,
            upper95=hi,
            holds=holds,
            expected="corrupts" if expect_bad else "clean",
        )

    return [
        row(
            "bf16 + graph + overlap on, bucket > 1",
            lambda r: (
                r["index_dtype"] == "bf16"
                and r["mode"] == "graph"
                and r["overlap"] == "on"
                and r["bucket"] > 1
            ),
            True,
        ),
        row("eager", lambda r: r["mode"] == "eager", False),
        row("fp8", lambda r: r["index_dtype"] == "fp8", False),
        row("overlap off", lambda r: r["overlap"] == "off", False),
        row("bucket 1", lambda r: r["bucket"] == 1, False),
    ]


def verdict(fp, rows):
    """One sentence from the measured fingerprint; it says so when the data disagree with it."""
    corrupt = [r for r in rows if r["corrupted_sessions"]]
    where = (
        ", ".join(
            f"{r['index_dtype']}/{r['mode']}/overlap {r['overlap']}/bucket {r['bucket']}: "
            f"{r['corrupted_sessions']}/{r['sessions']}"
            for r in corrupt
        )
        or "nowhere"
    )
    clean = [c for c in fp if c["expected"] == "clean"]
    held = all(c["holds"] for c in fp)
    head = "fingerprint reproduced" if held else "fingerprint NOT reproduced"
    bounds = "; ".join(
        f"{c['check']} {c['corrupted']}/{c['sessions']} (95% upper {100 * c['upper95']:.1f}%)" for c in clean
    )
    return f"{head}: corrupted sessions {where}. Clean checks: {bounds}."
