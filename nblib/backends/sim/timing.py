"""The replay timing model, in one place: how long each captured node runs.

    duration = (latency + bytes moved / bandwidth) * lognormal(0, sigma)

A node starts when the last of its dependencies ends; two nodes on different streams with no path
between them overlap, and the order of their reads and writes follows from these durations.

The numbers are measured, not chosen: `params/calibration/h200.json` is written on an H200 by
`scripts/calibrate_sim.py` (launch latency of a graph kernel node, copy bandwidth, the rate at
which one indexer program streams its request's index keys, and the replay-to-replay jitter of a
kernel node), and `Timing.calibrated()` reads it. The indexer is data-dependent: its duration is
computed at each replay from that replay's sequence lengths (`indexer_seconds`), so a step with a
longer context really runs longer, as on the GPU. torch.topk is no single pass over its input on a
GPU: it runs radix passes over every row, then sorts what it found, several kernels of one call; its
node lasts what the calibration measured for a call of that shape (`topk_seconds`: the measured grid of
rows and row lengths for the nearest k, interpolated), so the window in which a late write can reach
the top-k's reads is the GPU's. Its time is no function of its bytes alone: on an H100
(`params/calibration/h100.json`), k = 16 over one row of 16,384 takes 64 us and over 24 such rows 55
us (torch spreads a few long rows over many blocks each), while over rows of 262,144 it grows from 70
us at one row to 209 us at 40.
"""

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nblib.core.paths import ROOT

CALIBRATION = ROOT / "params" / "calibration" / "h200.json"


class TopkGrid(NamedTuple):
    """torch.topk timed on a GPU for one k: seconds[i][j] for rows[i] rows of cols[j] fp32 each."""

    k: int
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    @classmethod
    def from_json(cls, k, d):
        return cls(int(k), tuple(d["rows"]), tuple(d["cols"]), tuple(tuple(r) for r in d["seconds"]))

    def at(self, rows, cols):
        """Piecewise linear in log rows and log cols between the measured points, the edge's value
        beyond them (a shape outside the grid is not extrapolated)."""
        lc, lr = np.log(self.cols), np.log(self.rows)
        per_row = [np.interp(np.log(max(cols, 1)), lc, r) for r in self.seconds]
        return float(np.interp(np.log(max(rows, 1)), lr, per_row))

    @classmethod
    def of_cost(cls, k, fixed_s, bps, rows, cols):
        """A grid holding fixed_s + rows * cols * 4 / bps at the given shapes (a counterfactual for a
        probe, exact at those shapes)."""
        rows, cols = tuple(sorted(set(rows))), tuple(sorted(set(cols)))
        return cls(k, rows, cols, tuple(tuple(fixed_s + r * c * 4 / bps for c in cols) for r in rows))


@dataclass(frozen=True)
class Timing:
    """Per-node duration = (latency + nbytes / bandwidth) * lognormal(0, sigma), a new draw per
    replay; program_bandwidth: bytes per second one indexer program streams (programs per request
    > 0). source: the calibration file these came from."""

    latency: float
    bandwidth: float
    program_bandwidth: float
    sigma: float
    source: str = "given"
    # torch.topk as the GPU times it, one grid per k measured; empty: a top-k node is timed by its
    # bytes like any other
    topk: tuple[TopkGrid, ...] = ()
    # ops (as the capture names them: "aten.clone.default") whose nodes off the capture's own
    # stream take no time, or with free_side_bytes only their launch latency: a counterfactual for a
    # probe (what a design's side-stream kernels cost the race, scripts/sim_copy_probe.py); the
    # suite never sets them
    free_side_ops: tuple[str, ...] = ()
    free_side_bytes: bool = False

    @classmethod
    def calibrated(cls, path=CALIBRATION):
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(
                f"no timing calibration at {path}: run scripts/calibrate_sim.py OUTDIR on a CUDA GPU "
                "and copy its h200.json there"
            )
        c = json.loads(path.read_text())["timing"]
        topk = tuple(sorted(TopkGrid.from_json(k, g) for k, g in c.get("topk", {}).items()))
        return cls(
            c["latency_s"], c["bandwidth_Bps"], c["program_bandwidth_Bps"], c["sigma"], str(path), topk
        )

    def seconds(self, nbytes):
        return self.latency + np.asarray(nbytes, dtype=np.float64) / self.bandwidth

    def jitter(self, n, rng):
        return rng.lognormal(0.0, self.sigma, n)

    @functools.lru_cache(maxsize=256)  # noqa: B019 (frozen and hashable; a node asks at every replay)
    def topk_seconds(self, rows, cols, k, nbytes):
        """One torch.topk call over rows x cols: the calibrated grid of the nearest measured k (nearest
        on a log scale: the final sort grows with k), or, with none, nbytes moved."""
        if not self.topk:
            return float(self.seconds(nbytes))
        grid = min(self.topk, key=lambda g: abs(np.log(g.k / max(k, 1))))
        return grid.at(rows, cols)

    def indexer_seconds(self, seq_lens, entry_bytes, per_request, out_bytes):
        """The paged indexer for one replay. per_request > 0: each request's programs stream its
        own entries, so the kernel lasts as long as the longest request; else the whole GPU
        streams every live entry."""
        lens = np.clip(np.asarray(seq_lens, dtype=np.float64), 0, None)
        if per_request > 0:
            return self.latency + lens.max(initial=0.0) * entry_bytes / (per_request * self.program_bandwidth)
        return self.latency + (lens.sum() * entry_bytes + out_bytes) / self.bandwidth


class Schedule(NamedTuple):
    """When each node of one replay started and ended, in simulated seconds, by node index."""

    starts: list
    ends: list


def schedule(deps, durations, delays=None):
    """Each node starts when the last of its dependencies (node indices, all earlier) ends; a node in
    `delays` (index -> seconds) starts that much later, as behind a spin kernel queued just before it
    on its stream (the audit's forced schedule)."""
    n = len(deps)
    delays = delays or {}
    starts, ends = [0.0] * n, [0.0] * n
    for i, (ds, d) in enumerate(zip(deps, durations)):
        s = max((ends[j] for j in ds), default=0.0) + delays.get(i, 0.0)
        starts[i], ends[i] = s, s + d
    return Schedule(starts, ends)
