"""Where a decode step's time goes on CUDA: the GPU's kernels against the host's launches, for the
bucket-1 row and a racing bucket, on the graph and the eager paths of notebook 00's matrix.

    python scripts/profile_gpu_steps.py --params params/gpu.yaml --sessions 8 --out outputs/profile/x

Writes <out>/steps.txt: per path and bucket, the wall time of a bucket row (its references
computed first, so the row's time is its own), the steps it ran, ms a step; the indexer's logits
kernel timed with one program per request (the profile's) against programs filling the GPU, with
whether their logits agree bit for bit; and torch.profiler's kernels by GPU time over a few steps.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path.cwd()))

from nblib.backends import device  # noqa: E402
from nblib.engine import build, references  # noqa: E402
from nblib.engine.runner import Runner  # noqa: E402


def row_time(dev, runner, workload, bucket, sessions):
    dev.synchronize()
    t0 = time.perf_counter()
    run = build.bucket_run(runner, workload, bucket, sessions=sessions)
    dev.synchronize()
    return time.perf_counter() - t0, len(run.result["step_log"])  # every step, the tail's included


def logits_programs(dev, m, bucket, ctx, reps=20):
    """ms per indexer logits call with the model's programs and with 0 (fill the GPU); equal bits?"""
    b = build.full_batch(m, bucket, ctx=ctx)
    x = m.embed[b.tokens]
    q = (x @ m.w_q).view(-1, m.cfg.heads, m.cfg.dim)
    head_w = (x @ m.w_head).float()
    out = {}
    for programs in (m.cfg.indexer_programs, 0):
        logits = m.index_logits(q, head_w, b.page_table, b.seq_lens, programs=programs).clone()
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            m.index_logits(q, head_w, b.page_table, b.seq_lens, programs=programs)
        dev.synchronize()
        out[programs] = ((time.perf_counter() - t0) / reps * 1e3, logits)
    (t1, l1), (t0_, l0) = out[m.cfg.indexer_programs], out[0]
    n = int(b.seq_lens.max())
    same = torch.equal(l1[:, :n], l0[:, :n])
    return t1, t0_, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params/gpu.yaml")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 24])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    profile = yaml.safe_load(Path(a.params).read_text())
    dev = device.get(profile.get("backend", "cuda"))
    lines = []
    say = lambda s: (print(s, flush=True), lines.append(s))
    refs = references.shared()
    m = build.model(dev, profile["model"], index_dtype="bf16", overlap="on")
    graph = Runner(m, a.buckets, "graph", references=refs).capture()
    eager = Runner(m, a.buckets, "eager", references=refs)
    w = profile["workload"]
    for b in a.buckets:
        dt, n = row_time(dev, graph, w, b, a.sessions)
        say(f"bucket {b}: graph row with its references {dt:.2f} s, {n} steps, {dt / n * 1e3:.2f} ms a step")
        for name, runner in (("graph", graph), ("eager", eager)):
            dt, n = row_time(dev, runner, w, b, a.sessions)
            say(f"bucket {b}: {name} row, references cached {dt:.2f} s, {dt / n * 1e3:.2f} ms a step")
        for ctx in sorted({min(8192, m.cfg.max_ctx // 4), min(32768, m.cfg.max_ctx // 2)}):
            t1, t0, same = logits_programs(dev, m, b, ctx)
            say(
                f"bucket {b} ctx {ctx}: indexer logits {t1:.3f} ms with {m.cfg.indexer_programs} program(s) "
                f"a request, {t0:.3f} ms filling the GPU; same bits: {same}"
            )
    for name, runner in (("graph", graph), ("eager", eager)) if dev.name == "cuda" else ():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            build.bucket_run(runner, w, 1, sessions=1)
            dev.synchronize()
        say(f"\n{name}, bucket 1, one session: kernels by GPU time")
        say(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "steps.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
