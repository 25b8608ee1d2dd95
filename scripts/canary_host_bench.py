"""Host time of the canary per replay (before + after) for a bucket-48 step on the CPU.

The GPU profile's cache (num_pages 24000, page 64 entries) and two bucket-48 steps:
  bench     notebook 02's overhead step (build.full_batch): 48 requests of 31935 entries on 499 pages
            each, so nearly every page is live; no live_pages (the canary derives them from the batch)
  sessions  a run_sessions-like step: 48 requests of 1024..34000 entries on pages drawn from a
            shuffled pool, with live_pages (a Python set, as run_sessions passes it)
The cache pages are one 32-bit word each, so the checksums cost next to nothing here and what is
timed is the canary's bookkeeping (on CUDA the checksums are a Triton kernel, asynchronous). Prints
the median over `--replays` before+after pairs, and of before and after alone: on CUDA the GPU
waits for before()'s host work, while after()'s is launched behind the replay. `--profile` adds
cProfile's top entries.

    PYTHONPATH=. python scripts/canary_host_bench.py [--replays 50] [--profile]

Run it on another checkout's PYTHONPATH to compare implementations (e.g. `git archive` of an older
commit into a temporary folder).
"""

import argparse
import cProfile
import pstats
import statistics
import time
from types import SimpleNamespace

import torch

from nblib.engine.model import PAGE
from nblib.instruments.canary import Canary

NUM_PAGES, BUCKET, MAX_CTX = 24000, 48, 65536


def bench_step(num_pages=NUM_PAGES, bucket=BUCKET, max_ctx=MAX_CTX):
    """build.full_batch's inputs for the GPU profile at this bucket, without a model."""
    npages = -(-(max_ctx // 2) // PAGE)
    if 1 + bucket * npages > num_pages:
        npages = max(1, (num_pages - 1) // bucket)
    per = npages * PAGE - 1
    table = torch.zeros(bucket, max_ctx // PAGE, dtype=torch.int32)
    table[:, :npages] = torch.arange(1, 1 + bucket * npages, dtype=torch.int32).view(bucket, npages)
    lens = torch.full((bucket,), per, dtype=torch.int32)
    stores = table[:, (per - 1) // PAGE].long() * PAGE + (per - 1) % PAGE
    return dict(index=0, bs=bucket, bucket=bucket, tokens=torch.zeros(bucket, dtype=torch.long),
                page_table=table, seq_lens=lens, store_slots=stores)  # fmt: skip


def sessions_step(num_pages=NUM_PAGES, bucket=BUCKET, max_ctx=MAX_CTX, seed=0):
    """Random contexts (1024..34000 entries) on pages from a shuffled pool; live_pages a set."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1024, 34001, (bucket,), generator=g, dtype=torch.int32)
    need = (lens + PAGE - 1) // PAGE
    pool = (torch.randperm(num_pages - 1, generator=g) + 1).int()
    table = torch.zeros(bucket, max_ctx // PAGE, dtype=torch.int32)
    at = 0
    for r, n in enumerate(need.tolist()):
        table[r, :n] = pool[at : at + n]
        at += n
    stores = table[torch.arange(bucket), ((lens - 1) // PAGE).long()].long() * PAGE + (lens - 1).long() % PAGE
    stores[::4] = PAGE - 1  # a quarter of the rows store nothing: the scratch slot
    live = {int(p) for p in pool[:at].tolist()}
    return dict(index=0, bs=bucket, bucket=bucket, tokens=torch.zeros(bucket, dtype=torch.long),
                page_table=table, seq_lens=lens, store_slots=stores, live_pages=live)  # fmt: skip


def canary(num_pages=NUM_PAGES):
    """A Canary over a [num_pages, 1, 2] bf16 cache (one word a page): the bookkeeping alone."""
    cache = torch.randn(num_pages, 1, 2).bfloat16()
    return Canary(SimpleNamespace(index_cache=cache), seed=0), cache


def host_ms(step, replays=50, warmup=5, profile=None):
    """Median ms of before(step) + after(step), of before and of after, with a write to each
    expected page in between (the replay's stores, not timed); and the last record."""
    c, cache = canary()
    pages = (step["store_slots"] // PAGE).tolist()
    out = []
    for i in range(warmup + replays):
        if profile is not None and i == warmup:
            profile.enable()
        t0 = time.perf_counter()
        c.before(step)
        t1 = time.perf_counter()
        cache[pages, 0, 0] += 1
        t2 = time.perf_counter()
        c.after(step)
        t3 = time.perf_counter()
        out.append((1e3 * (t1 - t0 + t3 - t2), 1e3 * (t1 - t0), 1e3 * (t3 - t2)))
    if profile is not None:
        profile.disable()
    return *(statistics.median(x) for x in zip(*out[warmup:])), c.records[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # as the simulator runs
    for name, step in (("bench", bench_step()), ("sessions", sessions_step())):
        prof = cProfile.Profile() if a.profile else None
        ms, before, after, rec = host_ms(step, a.replays, profile=prof)
        print(
            f"{name:8s} host {ms:8.3f} ms per before+after (before {before:.3f}, after {after:.3f}); "
            f"watched {rec['watched']}, changed {rec['changed']}, expected {rec['expected']}"
        )
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
