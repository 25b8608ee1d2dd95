"""What every kernel benchmark shares: timing, the copy-bandwidth yardstick, tables, and the
record of what produced them (commit, device, versions), written atomically."""

import contextlib
import contextvars
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import torch
import triton

from nblib.core import collector, tables
from nblib.core.paths import ROOT
from nblib.core.results import commit

__all__ = [
    "FLUSHES",
    "FLUSH_BYTES",
    "copy_row",
    "flushing",
    "markdown",
    "median_us",
    "meta",
    "project_commit",
    "replay_ms",
    "write_atomic",
    "write_table",
]

FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 (H200: 50 MB), as do_bench's own flush
# How the L2 is emptied before each timed call. "dirty" is do_bench's flush, a zero_ of FLUSH_BYTES:
# it leaves the L2 full of dirty lines, so the timed kernel's first reads also write back about
# 50 MB of the flush's own data (on the H200: 6 us more for the fp8 and the bf16 logits kernels,
# 3.3 for a copy of the same bytes; the bench table's us_dirty_l2 against us, and the fp8 probe's
# batch table). "clean" then reads the buffer back, so the write-back lands in the flush and the
# kernel starts on a cold, clean L2, as a decode step's kernel does after kernels that wrote a few
# MB. Tables take "clean" and record "dirty" beside it.
FLUSHES = ("clean", "dirty")
_FLUSH = contextvars.ContextVar("flush", default="clean")  # median_us's flush when it is given none


def _checked(flush):
    if flush not in FLUSHES:
        raise ValueError(f"flush {flush!r}: choose one of {', '.join(FLUSHES)}")
    return flush


@contextlib.contextmanager
def flushing(flush: str) -> Iterator[None]:
    """with flushing("dirty"): median_us calls inside (that pass no flush) use that flush."""
    token = _FLUSH.set(_checked(flush))
    try:
        yield
    finally:
        _FLUSH.reset(token)


def median_us(
    fn: Callable[..., object],
    rep_ms: float = 100,
    calls: int = 10,
    replays: int = 25,
    flush: str | None = None,
) -> float:
    """GPU time of one call of fn in microseconds, L2 cold, without the host's launch cost.

    do_bench times each call between two events recorded from Python, so when the launcher's host
    work (argument checks, Triton's binder) outlasts do_bench's L2 flush on the GPU, the figure is
    the CPU's, and it moved 2x between runs on one H200. So: capture `calls` x (flush, fn) in one
    CUDA graph and the flushes alone in another, replay them in `replays` pairs, and take the median
    of the pairs' differences per call. A graph replay launches from the GPU, as the decode step's
    graph does.
    flush: "clean" or "dirty" (FLUSHES; default: the enclosing flushing(), else "clean").
    fn must be capturable; one that is not (a host sync) falls back to do_bench (rep_ms)."""
    flush = _checked(flush or _FLUSH.get())
    if not torch.cuda.is_available():
        return triton.testing.do_bench(fn, rep=rep_ms, return_mode="median") * 1e3
    try:
        per_replay = _paired_ms(fn, calls, replays, flush)
    except RuntimeError:  # not capturable: host sync or query inside fn
        return triton.testing.do_bench(fn, rep=rep_ms, return_mode="median") * 1e3
    return max(0.0, statistics.median(per_replay)) / calls * 1e3


def _paired_ms(fn, calls, replays, flush):
    """Milliseconds fn adds to a replay of `calls` x (L2 flush, fn), one figure per pair of replays:
    that graph's and the flushes' alone, back to back, so a drift in clocks over the run (the
    bench's rows run minutes apart) moves both of a pair alike."""
    cache = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = cache.view(torch.float32).view(4096, -1)
    sink = torch.empty(4096, device="cuda")
    fn()  # compile, autotune and allocate outside the capture
    torch.cuda.synchronize()
    graphs = []
    for with_fn in (True, False):
        graph = torch.cuda.CUDAGraph()
        with collector.paused(), torch.cuda.graph(graph):  # as every capture: nblib.core.collector
            for _ in range(calls):
                cache.zero_()
                if flush == "clean":  # read it back: its dirty lines leave the L2 now, not in fn
                    torch.sum(rows, dim=1, out=sink)
                if with_fn:
                    fn()
        graphs.append(graph)
    for graph in graphs:
        graph.replay()  # warm-up
    pairs = [tuple(replay_ms(g, 1, warmup=0)[0] for g in graphs) for _ in range(replays)]
    del graphs
    return [b - a for b, a in pairs]


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int, warmup: int = 1) -> list[float]:
    """Milliseconds of each of `replays` replays of a captured CUDA graph, timed with CUDA events
    after `warmup` untimed ones: the one timing loop every graph measurement here uses."""
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def copy_row(nbytes: int = 2 << 30, device: str = "cuda") -> dict:
    """The yardstick: nbytes read and written by an elementwise kernel on the SMs, as a bench row.
    (A plain copy_ becomes a memcpy node in a CUDA graph, which the copy engines run at about two
    thirds of the SMs' bandwidth: 2.78 TB/s on the H200, a yardstick no kernel should be held to.)"""
    src = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    us = median_us(lambda: torch.neg(src, out=dst))
    return dict(name="copy", us=us, bytes=2 * nbytes, gbps=2 * nbytes / us * 1e-3)


def project_commit() -> str:
    """This project's commit: NBLIB_COMMIT when set, else git's, but only when git's work tree is
    this project (a copy inside some other repository would report that repository's commit);
    "unknown" otherwise, never a wrong commit."""
    given = os.environ.get("NBLIB_COMMIT", "")
    if given and given != "unknown":
        return given
    top = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    if not top or os.path.realpath(top) != os.path.realpath(ROOT):
        return "unknown"
    return commit() or "unknown"  # git's HEAD (+dirty); "" when NBLIB_COMMIT is set but empty


def meta(**extra: object) -> dict:
    """Commit (project_commit), device and versions: what produced a table."""
    return dict(
        commit=project_commit(),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        **extra,
    )


def markdown(rows: list[dict], cols: list[str]) -> str:
    """A markdown table of the dicts in rows, one column per key in cols (missing -> blank)."""

    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return tables.from_dicts(rows, cols, fmt=fmt, empty=None)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write text to path through a temporary file in the same folder: never half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_table(
    out_dir: str | os.PathLike[str] | None, name: str, info: dict, rows: list[dict], cols: list[str]
) -> str:
    """<out_dir>/<name>.json (meta + rows) and <name>.md (meta line + table); returns the markdown."""
    md = f"{json.dumps(info)}\n\n{markdown(rows, cols)}\n"
    if out_dir:
        write_atomic(os.path.join(out_dir, f"{name}.json"), json.dumps(dict(meta=info, rows=rows), indent=2))
        write_atomic(os.path.join(out_dir, f"{name}.md"), md)
    return md
