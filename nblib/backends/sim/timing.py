"""The replay timing model, in one place: how long each captured node runs.

    duration = (LAUNCH_LATENCY + bytes moved / BANDWIDTH) * lognormal(0, JITTER_SIGMA)

A node starts when the last of its dependencies ends; two nodes on different streams with no path
between them overlap, and the order of their reads and writes follows from these durations. The
constants are chosen, not measured: a calibration from the H200 replaces them by giving SimDevice a
Timing with measured values (Timing(latency=..., bandwidth=..., sigma=...)).
"""

from dataclasses import dataclass
from typing import NamedTuple

LAUNCH_LATENCY = 4e-6  # seconds per kernel launch
BANDWIDTH = 1e11  # bytes per second
JITTER_SIGMA = 0.25  # lognormal sigma of the per-replay jitter


@dataclass(frozen=True)
class Timing:
    """Per-node duration = (latency + nbytes / bandwidth) * lognormal(0, sigma), a new draw per replay."""

    latency: float = LAUNCH_LATENCY
    bandwidth: float = BANDWIDTH
    sigma: float = JITTER_SIGMA

    def durations(self, nbytes, rng):
        """Seconds for nodes moving `nbytes` (a float array), jittered by `rng` (numpy Generator)."""
        return (self.latency + nbytes / self.bandwidth) * rng.lognormal(0.0, self.sigma, len(nbytes))


class Schedule(NamedTuple):
    """When each node of one replay started and ended, in simulated seconds, by node index."""

    starts: list
    ends: list


def schedule(deps, durations):
    """Each node starts when the last of its dependencies (node indices, all earlier) ends."""
    n = len(deps)
    starts, ends = [0.0] * n, [0.0] * n
    for i, (ds, d) in enumerate(zip(deps, durations)):
        s = max((ends[j] for j in ds), default=0.0)
        starts[i], ends[i] = s, s + d
    return Schedule(starts, ends)
