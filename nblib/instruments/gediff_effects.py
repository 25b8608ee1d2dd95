"""How the graph-vs-eager differential can change the bug it watches, measured directly.

Two real effects, both from putting the instrument inside the capture:
  pool layout  its clones of the indexer's inputs and logits are allocated in the same graph pool
               and kept, so which blocks the allocator hands out, and so which tensors alias, can
               shift per bucket: the capture audit's aliasing pairs with and without it show that;
  the window   its clones are extra work on the side stream, between the indexer and top-k, so the
               side branch runs longer and the race's window moves: the side branch timed alone
               (a graph of the indexer, its hook and top-k) with and without it shows that.

    rows = gediff_effects.effects(dev, model, buckets)
"""

import statistics

from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.instruments import audit
from nblib.instruments.gediff import GEDiff
from nblib.instruments.overhead import timed, timer


def _pairs(report, bucket):
    """The (side tensor, main tensor) pairs the audit names in one bucket, deduplicated."""
    rows = [h.row() for h in report.by("bucket").get(bucket, [])]
    return sorted({f"{r['first_tensor']} / {r['second_tensor']}" for r in rows})


def _side_ms(dev, m, bucket, replays, warmup, seed):
    """The side branch alone as a captured graph (indexer, the differential's hook if attached,
    top-k) on a full batch, replayed `replays` times: median ms and the timing method."""
    method, measure = timer(dev)
    tokens, table, lens, _ = build.full_batch(m, bucket, seed)
    x = m.embed[tokens]
    q = (x @ m.w_q).view(-1, m.cfg.heads, m.cfg.dim)
    w = (x @ m.w_head).float()
    g = dev.CUDAGraph()
    m.bucket = bucket
    with dev.graph(g, pool=dev.graph_pool_handle()):
        m.indexer(q, w, table, lens, None)
    m.bucket = None
    if hasattr(g, "expected_seconds"):  # the simulator: its calibrated timing model, not host time
        return 1e3 * g.expected_seconds(), "simulated (the calibrated timing model, without jitter)"
    return statistics.median(timed(measure, g.replay, replays, warmup)), method


def effects(
    dev,
    model,
    buckets,
    index_dtype="bf16",
    overlap="on",
    logits_policy="transient",
    replays=50,
    warmup=5,
    seed=0,
):
    """Per bucket and arm (differential off / on): the audit's hazards and aliasing pairs from one
    capture of every bucket, and the side branch's time alone."""
    knobs = dict(index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy)
    rows = []
    for arm in ("off", "on"):
        m = build.model(dev, model, **knobs)
        gd = GEDiff(m) if arm == "on" else None
        with audit.recording(dev) as rec:
            Runner(m, buckets, "graph").capture(record=rec)
        report = rec.report(names=m.captures)
        for b in sorted(buckets):
            side_ms, method = _side_ms(dev, m, b, replays, warmup, seed)
            pairs = _pairs(report, b)
            rows.append(
                dict(
                    arm=arm,
                    bucket=b,
                    hazards=len(report.by("bucket").get(b, [])),
                    pairs=pairs,
                    side_ms=side_ms,
                    method=method,
                )
            )
        if gd is not None:
            gd.detach()
    return rows


def summary(rows):
    """One sentence per effect, from the rows."""
    by = {(r["arm"], r["bucket"]): r for r in rows}
    buckets = sorted({r["bucket"] for r in rows})
    moved = [b for b in buckets if by["off", b]["pairs"] != by["on", b]["pairs"]]
    longer = [
        f"bucket {b}: {by['off', b]['side_ms']:.3f} -> {by['on', b]['side_ms']:.3f} ms" for b in buckets
    ]
    layout = (
        f"with the differential attached the aliasing pairs change in buckets {moved}"
        if moved
        else "with the differential attached the audit names the same aliasing pairs in every bucket"
    )
    return f"{layout}; the side branch alone, off -> on: {', '.join(longer)} ({rows[0]['method']})"
