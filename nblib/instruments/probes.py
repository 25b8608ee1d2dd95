"""The graph-vs-eager differential on your own step, at points you name.

    from nblib.instruments.probes import Differential, probe

    def forward(x):                      # your code: probe() is a no-op unless a differential runs
        h = shared_expert_in(x)
        probe("shared_expert.in", h)
        ...

    d = Differential(dev, design="main_stash")
    rep = d.run(step, replays=20)        # capture, then each replay against one eager run
    rep.probes                           # per probe: replays, differing, max_abs, first replay
    print(rep.text())

`step` is a TARGET's step (docs/audit.md): a zero-argument callable, built and warmed up. The step is
captured once under the recorder (so the report also names the audit's hazards; prealloc captures a
first time to learn the probes' shapes), run once eagerly in host order (`dev.serial()`) for the
reference, and replayed `replays` times; before each run the persistent state the step writes is
restored, so every run starts alike, and it is left as it was found. After each replay every
probe, and the step's return value, is compared with the eager run's, bit for bit.

How a probe keeps its value is the design, as notebook 02 measures them on the miniature:

  main_stash  a clone at the probe point, on the stream the tensor is used on (default: on the H200,
              notebook 02's recommended design); new graph-pool blocks, kept
  prealloc    a copy into a buffer made before capture (shapes from the eager run), outside the pool
  refs        a reference to the graph's own tensor, no copy: its block stays allocated, so the
              allocator cannot hand it on, which can hide the very race you look for

Each design changes the capture it watches (memory, work, lifetime): the campaign's own differential
moved its bug. Run the differential with and without probes and compare the counts (the audit's
`--confirm` tells whether a hazard is real regardless).
"""

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from nblib.instruments import audit as A
from nblib.instruments.audit.confirm import StepState, beyond_rounding, persistent_writes

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["DESIGNS", "Differential", "DifferentialReport", "ProbeCheck", "probe", "probing"]

DESIGNS = ("main_stash", "prealloc", "refs")

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("nblib_probes", default=None)  # a _Session


def probe(name: str, t: torch.Tensor) -> torch.Tensor:
    """Mark `t` as the probe `name` (returns `t`). A no-op unless a Differential is running."""
    session = _ACTIVE.get()
    if session is not None:
        session.see(name, t)
    return t


@contextlib.contextmanager
def probing(session: "_Session") -> Iterator["_Session"]:
    """probe() reports to `session` inside the block."""
    token = _ACTIVE.set(session)
    try:
        yield session
    finally:
        _ACTIVE.reset(token)


class _Session:
    """What probe() does in one run: in eager mode, keep a copy; while capturing, stash by design."""

    def __init__(self, design, capturing, buffers=None):
        self.design, self.capturing, self.buffers = design, capturing, buffers or {}
        self.values = {}  # name -> the tensor to read after the run
        self.order = []

    def see(self, name, t):
        key = (
            name if name not in self.values else f"{name}#{sum(k.split('#')[0] == name for k in self.order)}"
        )
        self.order.append(key)
        if not self.capturing:
            self.values[key] = t.detach().clone()
            if key in self.buffers:  # the eager run writes the stash as the graph does
                self.buffers[key].copy_(t)
        elif self.design == "refs":
            self.values[key] = t
        elif self.design == "prealloc":
            buf = self.buffers.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                raise RuntimeError(
                    f"probe {key!r} is {tuple(t.shape)} {t.dtype} in the capture but was not seen so in "
                    "the eager run: a probe's shape must not depend on capturing"
                )
            buf.copy_(t)
            self.values[key] = buf
        else:
            self.values[key] = t.clone()


class ProbeCheck(BaseModel):
    name: str
    replays: int
    differing: int = 0
    max_abs: float | None = None
    nonfinite: bool = False
    first_replay: int | None = None  # the first replay (0-based) where it differed


class DifferentialReport(BaseModel):
    design: str
    replays: int
    probes: list[ProbeCheck]
    output: ProbeCheck  # the step's return value and the persistent state it writes
    hazards: int  # the audit's hazards in the capture
    seconds: float

    def text(self) -> str:
        lines = [
            f"graph-vs-eager differential ({self.design}), {self.replays} replays, {self.hazards} hazard(s)"
        ]
        for p in [*self.probes, self.output]:
            if p.differing:
                diff = f"max |diff| {p.max_abs:.3g}" if p.max_abs is not None else "no finite difference"
                nan = ", non-finite values" if p.nonfinite else ""
                lines.append(
                    f"  {p.name}: {p.differing} of {p.replays} replays differ from eager "
                    f"({diff}{nan}; first at replay {p.first_replay})"
                )
            else:
                lines.append(f"  {p.name}: equal to eager in every replay")
        return "\n".join(lines)


class Differential:
    """Capture a step with its probes stashed by `design`, then compare each replay with eager."""

    def __init__(self, dev: "Device", design: str = "main_stash"):
        if design not in DESIGNS:
            raise ValueError(f"unknown probe design {design!r}: choose one of {', '.join(DESIGNS)}")
        self.dev, self.design = dev, design

    def _buffers(self, step):
        """prealloc: one buffer per probe, made outside any capture, shaped as a first capture of the
        step (probes holding references only, the capture then dropped) shows each probe."""
        seen = _Session("refs", capturing=True)
        with probing(seen):
            A.audit_capture(step, device=self.dev)
        d = self.dev.torch_device
        return {
            k: torch.empty(shape, dtype=dtype, device=d) for k, (shape, dtype) in _shapes(seen.values).items()
        }

    def run(self, step: Callable[[], Any], replays: int = 20) -> DifferentialReport:
        if replays < 1:
            raise ValueError(f"replays must be at least 1, got {replays}")
        t0, dev = time.perf_counter(), self.dev
        buffers = self._buffers(step) if self.design == "prealloc" else {}
        graphed = _Session(self.design, capturing=True, buffers=buffers)
        with probing(graphed):
            rep = A.audit_capture(step, device=dev)
        # a capture runs nothing: the state saved now is the caller's, restored after the check
        state = StepState(dev, persistent_writes(rep.traces[0]))
        try:
            state.restore()
            ref = _Session(self.design, capturing=False, buffers=buffers)
            with probing(ref), dev.serial():
                result = step()
            dev.synchronize()
            missing = [k for k in ref.values if k not in graphed.values]
            if missing:
                raise RuntimeError(
                    f"probes {missing} ran eagerly but not in the capture: a probe must run in both"
                )
            want_probes, want_out = list(ref.values.items()), state.values(result)
            checks = {k: ProbeCheck(name=k, replays=replays) for k in ref.values}
            out = ProbeCheck(name="the step's output and the state it writes", replays=replays)
            for i in range(replays):
                state.restore()
                rep.graph.replay()
                dev.synchronize()
                got = [(k, graphed.values[k].detach().clone()) for k in ref.values]
                for d in beyond_rounding(got, want_probes):
                    _count(checks[d.name], d, i)
                for d in beyond_rounding(state.values(rep.result), want_out)[:1]:
                    _count(out, d, i)
        finally:
            state.restore()
        return DifferentialReport(
            design=self.design,
            replays=replays,
            probes=list(checks.values()),
            output=out,
            hazards=len(rep.hazards),
            seconds=round(time.perf_counter() - t0, 3),
        )


def _shapes(session_values):
    return {k: (tuple(t.shape), t.dtype) for k, t in session_values.items()}


def _count(check, d, replay):
    check.differing += 1
    check.first_replay = replay if check.first_replay is None else check.first_replay
    check.nonfinite = check.nonfinite or d.nonfinite
    if d.max_abs is not None:
        check.max_abs = d.max_abs if check.max_abs is None else max(check.max_abs, d.max_abs)
