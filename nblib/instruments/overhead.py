"""What an instrument costs: replay time with the canary, with the differential, with neither.

Each configuration replays one bucket's graph many times on the same filled batch; the time of a
replay includes the instrument's work around it (checksums and their copy to the host; the eager
recompute and comparison), as it would in an engine. On CUDA the times come from CUDA events
(dev.Event(enable_timing=True)); the simulator's events carry no timing, so on sim they are
time.perf_counter around a replay that completes before returning (host time of the Python model).
"""

import statistics
import time

import torch

from nblib.engine.model import PAGE, DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.instruments.canary import Canary
from nblib.instruments.gediff import GEDiff


def timer(dev):
    """(method, measure(fn) -> ms)."""
    ev = dev.Event(enable_timing=True)
    if hasattr(ev, "elapsed_time"):

        def measure(fn):
            a, b = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)

        return "cuda events", measure

    def measure(fn):
        dev.synchronize()
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        return 1e3 * (time.perf_counter() - t0)

    return "time.perf_counter (the simulator's events carry no timing)", measure


def timed(measure, fn, replays, warmup):
    """`replays` measurements of fn (ms), after `warmup` untimed-in-the-result ones."""
    return [measure(fn) for _ in range(warmup + replays)][warmup:]


def full_batch(m, bucket, seed=0):
    """A full bucket of requests at half the longest context, their pages prefilled."""
    per = m.cfg.max_ctx // 2
    npages = -(-per // PAGE)
    if 1 + bucket * npages > m.cfg.num_pages:
        npages = max(1, (m.cfg.num_pages - 1) // bucket)
        per = npages * PAGE - 1
    d = m.dev.torch_device
    table = torch.zeros(bucket, m.cfg.max_ctx // PAGE, dtype=torch.int32)
    table[:, :npages] = torch.arange(1, 1 + bucket * npages, dtype=torch.int32).view(bucket, npages)
    m.prefill_entries(
        torch.arange(PAGE, PAGE * (1 + bucket * npages), device=d),
        torch.Generator(device=d).manual_seed(seed),
    )
    lens = torch.full((bucket,), per, dtype=torch.int32)
    stores = table[:, (per - 1) // PAGE].long() * PAGE + (per - 1) % PAGE
    tokens = torch.arange(bucket) * 7 % m.cfg.vocab
    return tuple(x.to(d) for x in (tokens, table, lens, stores))


def replay_times(
    dev,
    model,
    bucket,
    replays=50,
    warmup=5,
    index_dtype="bf16",
    overlap="on",
    logits_policy="transient",
    seed=0,
):
    """Median replay time (ms) for neither, canary, gediff, and the ratios to neither."""
    cfg = ModelConfig(**model, index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy)
    method, measure = timer(dev)
    out = []
    for name in ("neither", "canary", "gediff"):
        m = DecodeModel(cfg, dev)
        inst = Canary(m) if name == "canary" else GEDiff(m) if name == "gediff" else None
        runner = Runner(m, [bucket]).capture()
        args = full_batch(m, bucket, seed)
        step = dict(
            bs=bucket,
            bucket=bucket,
            tokens=args[0],
            page_table=args[1],
            seq_lens=args[2],
            store_slots=args[3],
        )

        def once():
            if inst:
                inst.before(step)
            runner.run(*args)
            if inst:
                inst.after(step)

        times = timed(measure, once, replays, warmup)
        out.append(dict(instrument=name, bucket=bucket, replays=replays, median_ms=statistics.median(times)))
        del runner, m
    base = out[0]["median_ms"]
    for r in out:
        r["ratio"] = r["median_ms"] / base
        r["method"] = method
    return out
