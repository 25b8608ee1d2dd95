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
node lasts what the calibration measured for that call (`topk_seconds`, one affine fit in the input's
bytes per k), so the window in which a late write can reach the top-k's reads is the GPU's.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nblib.core.paths import ROOT

CALIBRATION = ROOT / "params" / "calibration" / "h200.json"


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
    # torch.topk as the GPU times it: (k, fixed seconds, input bytes per second), one fit per k
    # measured; empty: a top-k node is timed by its bytes like any other
    topk: tuple[tuple[int, float, float], ...] = ()
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
        topk = tuple(sorted((int(k), f["fixed_s"], f["Bps"]) for k, f in c.get("topk", {}).items()))
        return cls(
            c["latency_s"], c["bandwidth_Bps"], c["program_bandwidth_Bps"], c["sigma"], str(path), topk
        )

    def seconds(self, nbytes):
        return self.latency + np.asarray(nbytes, dtype=np.float64) / self.bandwidth

    def jitter(self, n, rng):
        return rng.lognormal(0.0, self.sigma, n)

    def topk_seconds(self, in_bytes, k, nbytes):
        """One torch.topk call over `in_bytes` of input: the calibrated fit of the nearest measured k
        (nearest on a log scale: the final sort grows with k), or, with none, nbytes moved."""
        if not self.topk:
            return float(self.seconds(nbytes))
        _, fixed, bps = min(self.topk, key=lambda f: abs(np.log(f[0] / max(k, 1))))
        return fixed + in_bytes / bps

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
