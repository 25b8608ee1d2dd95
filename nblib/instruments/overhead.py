"""What an instrument costs: replay time with the canary (eager, and in its own CUDA graphs), with
the differential, with neither.

Each configuration replays one bucket's graph many times on the same filled batch; the time of a
replay includes the instrument's work around it (checksums and their copy to the host; the eager
recompute and comparison), as it would in an engine. The times come from events
(dev.Event(enable_timing=True)): on CUDA the GPU's; on the simulator its timing model's, the replay's
span and, under dev.eager_timing(), the instrument's eager kernels (modelled kernel time, no launches).
"""

import gc
import statistics
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nblib.core import phases
from nblib.engine import build
from nblib.engine.build import full_batch
from nblib.engine.runner import Runner
from nblib.instruments.canary import Canary
from nblib.instruments.canary_graph import GraphedCanary
from nblib.instruments.gediff import GEDiff

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["CUDA_EVENTS", "INSTRUMENTS", "SIM_EVENTS", "replay_times", "timed", "timer", "warmups"]

CUDA_EVENTS = "cuda events"  # timer's method on CUDA
SIM_EVENTS = "simulated events"  # timer's method on the simulator: its timing model's time


def timer(dev: "Device") -> tuple[str, Callable[[Callable[[], object]], float]]:
    """(method, measure(fn) -> ms): events around fn, its eager kernels timed too (on the simulator
    they take no modelled time otherwise; on CUDA the GPU times them itself)."""

    def measure(fn: Callable[[], object]) -> float:
        a, b = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
        with dev.eager_timing():
            a.record()
            fn()
            b.record()
        b.synchronize()
        return a.elapsed_time(b)

    return (CUDA_EVENTS if dev.name == "cuda" else SIM_EVENTS), measure


def warmups(dev: object, warmup: int | None, cuda: int) -> int:
    """Untimed calls before the timed ones: `warmup` if given, else `cuda` on CUDA, where clocks
    and caches settle over the first replays, and one on the simulator, whose first call only puts
    its allocations out of the way (a warm-up there costs the host as much as a timed call)."""
    if warmup is not None:
        return warmup
    return cuda if getattr(dev, "name", "") == "cuda" else 1


def timed(
    measure: Callable[[Callable[[], object]], float], fn: Callable[[], object], replays: int, warmup: int
) -> list[float]:
    """`replays` measurements of fn (ms), after `warmup` untimed-in-the-result ones."""
    return [measure(fn) for _ in range(warmup + replays)][warmup:]


def _replay(runner, batch, inst=None):
    """One replay of `batch`, wrapped in the instrument's before and after, as run_sessions does."""
    step = batch.step()

    def once():
        if inst:
            inst.before(step)
        runner.run(*batch)
        if inst:
            inst.after(step)

    return once


INSTRUMENTS = ("neither", "canary", "canary_graphed", "gediff")  # notebook 02's rows


def replay_times(
    dev: "Device",
    model: Mapping[str, Any],
    bucket: int,
    replays: int = 50,
    warmup: int | None = None,
    index_dtype: str = "bf16",
    overlap: str = "on",
    logits_policy: str = "transient",
    seed: int = 0,
    instruments: tuple[str, ...] = INSTRUMENTS,
    ctx: int | None = None,
) -> list[dict[str, Any]]:
    """Median replay time (ms) for each of `instruments`, neither first: neither, canary,
    canary_graphed (the canary in CUDA graphs of its own, nblib.instruments.canary_graph, captured
    before timing) and gediff. ratio: median over neither's median
    (None for neither itself, the reference); calls: the instrument's own records, one per timed or
    warmup replay, so a row whose instrument never ran shows it. ctx: entries a request in the
    replayed full batch (None or 0: half the longest context, build.full_batch)."""
    unknown = [i for i in instruments if i not in INSTRUMENTS]
    if unknown or instruments[:1] != ("neither",):
        raise ValueError(f"instruments must start with 'neither' and come from {INSTRUMENTS}")
    with phases.phase("timing"):
        return _replay_times(
            dev, model, bucket, replays, warmup, index_dtype, overlap, logits_policy, seed, instruments, ctx
        )


def _replay_times(
    dev, model, bucket, replays, warmup, index_dtype, overlap, logits_policy, seed, instruments, ctx
):
    method, measure = timer(dev)
    warmup = warmups(dev, warmup, cuda=5)
    out = []
    for name in instruments:
        m = build.model(dev, model, index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy)
        inst = Canary(m) if name == "canary" else GEDiff(m) if name == "gediff" else None
        runner = Runner(m, [bucket]).capture()
        if name == "canary_graphed":
            inst = GraphedCanary(runner).capture()
        batch = full_batch(m, bucket, seed, ctx)
        times = timed(measure, _replay(runner, batch, inst), replays, warmup)
        out.append(
            dict(
                instrument=name,
                bucket=bucket,
                replays=replays,
                warmup=warmup,
                ctx=int(batch.seq_lens[0]),
                median_ms=statistics.median(times),
                calls=len(inst.records) if inst else 0,
                method=method,
            )
        )
        # free this row's graphs now: left to the garbage collector, one could be destroyed inside the
        # next row's capture, which breaks it (CUDA forbids it, and the simulator with it)
        del runner, m, inst
        gc.collect()
    base = out[0]["median_ms"]
    for r in out:
        r["ratio"] = r["median_ms"] / base if r is not out[0] else None
    return out
