"""Where a notebook's wall time goes: a clock that charges each second to one named phase.

    clock = phases.start(sync=dev.synchronize)       # nblib.setup does this for every notebook
    with phases.phase("capture"):
        runner.capture()
    clock.times()                                     # [PhaseTime(name, seconds, calls)], "other" last

Phases nest, and time is exclusive: while an inner phase runs the outer one is paused, so the
phases and "other" (what no phase covered) add up to the clock's wall time. That keeps a table of
them a partition, whichever study wraps whichever. On CUDA, kernels run after the host queues them:
`sync` (the device facade's synchronize) is called at the end of each coarse phase, so the phase
that queued the work is the one charged for it. While a graph captures, synchronizing is forbidden,
so a phase that ends inside a capture is not synchronized (its work was only recorded, not run).
The per-step phases (PER_STEP: replays, eager references, instruments) never synchronize: a wait
per step would hold the host until each replay drained, serialising the host's work with the GPU's
and changing the timing between steps that the measurement runs under. Their device work is
charged where the host next waits on it (the run's closing synchronize is a replays phase).

Each phase records wall seconds and the process's CPU seconds: on a machine other processes load,
the wall time of one notebook swings with them, its CPU time much less (a regression check compares
both).
"""

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from pydantic import BaseModel

__all__ = ["OTHER", "PER_STEP", "PHASES", "PhaseClock", "PhaseTime", "clock", "phase", "start", "table"]

# The vocabulary: a typo in a phase name fails at once rather than making a new row.
PHASES = (
    "setup",  # the device, the models' weights and caches
    "capture",  # warm-up and graph capture (Runner.capture)
    "replays",  # runner.run: graph replays (or the eager run of mode "eager")
    "eager references",  # runner.reference: the single-stream step every replay is compared with
    "instruments",  # instruments' before/after around each replay (canary, differential)
    "audit",  # trace analysis: happens-before, hazards, graph checks
    "timing",  # timed replays: overhead, step times, branch times
    "figures",  # plots saved
    "nbconvert",  # the executed notebook rendered to HTML (the suite, after the notebook)
)
OTHER = "other"
# phases entered once per decode step: timed on the host only (see the module docstring)
PER_STEP = ("replays", "eager references", "instruments")


class PhaseTime(BaseModel):
    """Seconds charged to one phase (exclusive of the phases nested in it), the process's CPU
    seconds in that time, and how often it ran."""

    name: str
    seconds: float
    cpu_seconds: float
    calls: int


class PhaseClock:
    """Exclusive time per phase since the clock started; see the module docstring."""

    def __init__(self, sync: Callable[[], None] | None = None, capturing: Callable[[], bool] | None = None):
        self.sync, self.capturing = sync, capturing
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self._seconds: dict[str, float] = {}
        self._cpu: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._stack: list[list] = []  # [name, when it last resumed]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: choose one of {', '.join(PHASES)}")
        now = _now()
        if self._stack:  # the outer phase pauses here
            self._charge(self._stack[-1], now)
        self._stack.append([name, now])
        try:
            yield
        finally:
            if self.sync is not None and name not in PER_STEP and not (self.capturing and self.capturing()):
                self.sync()  # the device's queued work belongs to this phase
            now = _now()
            self._charge(self._stack.pop(), now)
            self._calls[name] = self._calls.get(name, 0) + 1
            if self._stack:  # the outer phase resumes
                self._stack[-1][1] = now

    def _charge(self, entry, now):
        name, since = entry
        self._seconds[name] = self._seconds.get(name, 0.0) + (now[0] - since[0])
        self._cpu[name] = self._cpu.get(name, 0.0) + (now[1] - since[1])
        entry[1] = now

    def wall(self) -> float:
        return time.perf_counter() - self.started

    def cpu(self) -> float:
        return time.process_time() - self.cpu_started

    def times(self, wall: float | None = None) -> list[PhaseTime]:
        """Every phase that ran, in PHASES order, then "other": the wall time no phase covered."""
        wall = self.wall() if wall is None else wall
        rows = [
            PhaseTime(
                name=n,
                seconds=round(self._seconds[n], 3),
                cpu_seconds=round(self._cpu[n], 3),
                calls=self._calls.get(n, 0),
            )
            for n in PHASES
            if n in self._seconds
        ]
        rest = wall - sum(self._seconds.values())
        rest_cpu = self.cpu() - sum(self._cpu.values())
        rows.append(
            PhaseTime(
                name=OTHER,
                seconds=round(max(0.0, rest), 3),
                cpu_seconds=round(max(0.0, rest_cpu), 3),
                calls=1,
            )
        )
        return rows


_CURRENT = [PhaseClock()]  # the process-wide clock, so studies need no handle; nblib.setup restarts it


def start(sync: Callable[[], None] | None = None, capturing: Callable[[], bool] | None = None) -> PhaseClock:
    """A new process-wide clock (the notebook's): sync and capturing from the device facade."""
    _CURRENT[0] = PhaseClock(sync, capturing)
    return _CURRENT[0]


def clock() -> PhaseClock:
    return _CURRENT[0]


def phase(name: str) -> AbstractContextManager[None]:
    """`with phase("capture"): ...` on the process-wide clock."""
    return _CURRENT[0].phase(name)


def table(rows: list[PhaseTime], wall: float) -> str:
    """A plain-text table: phase, seconds, share of the wall time, calls."""
    lines = [f"{'phase':18s} {'seconds':>9s} {'share':>6s} {'cpu s':>9s} {'calls':>7s}"]
    for r in rows:
        share = 100 * r.seconds / wall if wall else 0.0
        lines.append(f"{r.name:18s} {r.seconds:9.2f} {share:5.1f}% {r.cpu_seconds:9.2f} {r.calls:7d}")
    return "\n".join(lines)


def _now():
    return (time.perf_counter(), time.process_time())
