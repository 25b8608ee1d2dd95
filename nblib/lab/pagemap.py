"""A page map of the index-K cache, replay by replay: which pages each replay was expected to
write, which it changed that it should not have, which are live, free, or the scratch page.

    run = pagemap.watch(dev, model, buckets, workload, overlap="on", bucket=2)
    run.summary              # the canary's summary of this run (the numbers notebook 01 reports)
    run.steps[i].states      # one state per page for replay i (STATES)
    pagemap.figure(run.steps[i])

It is the canary's run for one (overlap, bucket), as nblib.instruments.canary.watch does it, with
a second instrument beside the canary that keeps every replay's page classes, computed by the
canary's own functions (page_checksums, expected_pages, classify).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from nblib.backends.device import Device
from nblib.engine.model import DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, in_bucket, run_sessions
from nblib.instruments import canary

__all__ = [
    "COLORS",
    "STATES",
    "PageRecorder",
    "PageRun",
    "PageStep",
    "estimated_steps",
    "figure",
    "watch",
]

STATES = ("free", "live", "expected", "scratch", "changed")  # "changed": changed and not expected
COLORS = ("#f2f2f2", "#9ecae1", "#31a354", "#bdbdbd", "#de2d26")


@dataclass
class PageStep:
    index: int
    bucket: int
    bs: int
    states: np.ndarray  # uint8 per page, an index into STATES
    corrupted_rows: int = 0  # rows of this step that differed from the eager reference

    def counts(self) -> dict[str, int]:
        return {s: int((self.states == i).sum()) for i, s in enumerate(STATES)}


@dataclass
class PageRun:
    overlap: str
    bucket: int
    summary: dict  # the canary's summary and the sessions' verdicts for this bucket
    steps: list  # PageStep per replay


class PageRecorder:
    """An instrument for run_sessions: every replay's page states, by the canary's classes."""

    def __init__(self, model: DecodeModel, tick: Callable[[], object] | None = None):
        self.cache, self.num_pages, self.tick = model.index_cache, model.cfg.num_pages, tick
        self.steps: list[PageStep] = []

    def before(self, step: dict[str, Any]) -> None:
        self._before = canary.page_checksums(self.cache).cpu()

    def after(self, step: dict[str, Any]) -> None:
        now = canary.page_checksums(self.cache).cpu()
        changed = torch.nonzero(now != self._before).flatten().tolist()
        expected = canary.expected_pages(step["store_slots"])
        live = step["live_pages"]
        states = np.zeros(self.num_pages, dtype=np.uint8)
        states[sorted(live)] = STATES.index("live")
        for page, kind in canary.classify(changed, expected, live).items():
            states[page] = STATES.index({"expected": "expected", "scratch": "scratch"}.get(kind, "changed"))
        states[sorted(expected - set(changed))] = STATES.index("expected")  # expected, rewritten in place
        states[canary.SCRATCH_PAGE] = STATES.index("scratch")
        self.steps.append(PageStep(step["index"], step["bucket"], step["bs"], states))
        if self.tick:
            self.tick()


def watch(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    workload: dict[str, Any],
    overlap: str = "on",
    bucket: int | None = None,
    index_dtype: str = "bf16",
    logits_policy: str = "transient",
    tick: Callable[[], object] | None = None,
) -> PageRun:
    """The canary's run for one overlap setting and one bucket (at most `bucket` sessions decoding
    together, every bucket captured as in notebook 01), with each replay's page map kept."""
    bucket = bucket or max(buckets)
    if bucket not in buckets:
        raise ValueError(f"bucket {bucket} is not one of the captured buckets {sorted(buckets)}")
    m = DecodeModel(
        ModelConfig(**model, index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy), dev
    )
    runner = Runner(m, buckets, "graph").capture()
    m.index_cache.zero_()
    m.kv_cache.zero_()  # a fresh engine, as canary.watch starts each run
    c, pages = canary.Canary(m), PageRecorder(m, tick)
    r = run_sessions(runner, WorkloadConfig(**{**workload, "concurrency": bucket}), [c, pages])
    for st, log in zip(pages.steps, r["step_log"]):
        st.corrupted_rows = log["bad_rows"]
    canary_summary = c.summary()
    replays = canary_summary.pop("steps")  # as canary.watch names it: steps are the bucket's own
    summary = dict(overlap=overlap, bucket=bucket, **in_bucket(r, bucket), **canary_summary, replays=replays)
    return PageRun(overlap, bucket, summary, pages.steps)


def estimated_steps(workload: dict[str, Any], bucket: int) -> int:
    """About how many replays a run takes (for a progress bar): decode tokens over the batch."""
    w = WorkloadConfig(**workload)
    return max(1, round(w.sessions * w.rounds * (w.out_min + w.out_max) / 2 / bucket))


def figure(step: PageStep, title: str | None = None) -> Figure:
    """One replay's pages as a grid of cells, coloured by state (row-major, page 0 top left)."""
    n = len(step.states)
    cols = int(np.ceil(np.sqrt(n * 2)))  # twice as wide as tall
    grid = np.full(cols * int(np.ceil(n / cols)), np.nan)
    grid[:n] = step.states
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.imshow(grid.reshape(-1, cols), cmap=ListedColormap(COLORS), vmin=-0.5, vmax=len(STATES) - 0.5)
    ax.set_xticks([])
    ax.set_yticks([])
    counts = step.counts()
    ax.legend(
        handles=[Patch(color=c, label=f"{s} ({counts[s]})") for s, c in zip(STATES, COLORS)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
    )
    ax.set_title(
        title
        or f"replay {step.index}: bucket {step.bucket}, {step.bs} request(s), "
        f"{step.corrupted_rows} row(s) corrupted; {cols} pages per row"
    )
    fig.tight_layout()
    return fig
