"""Measure on a CUDA GPU the numbers the simulator's timing model uses, and write them as JSON.

    python scripts/calibrate_sim.py OUTDIR   # -> OUTDIR/h200.json: commit it as params/calibration/h200.json

On another GPU the file is named after it (h100.json, else gpu.json): the simulator reads the H200's.

Each figure is a median over CUDA-graph replays timed with CUDA events:
  latency_s              one kernel node of a graph: a graph of N tiny kernels, divided by N
  bandwidth_Bps          a graph holding one large device-to-device copy (read + write bytes)
  program_bandwidth_Bps  one indexer program streaming its request's keys: the bf16 indexer with one
                         program per request at bs 1, the slope between two context lengths
  sigma                  the per-node jitter: std of log(replay time) of the N-kernel graph, times
                         sqrt(N) (independent per-node jitter adds up in quadrature)
  topk                   torch.topk over fp32 rows, one grid per k: the seconds of a call for each
                         number of rows (the profiles' buckets) and row length (the graph holds the
                         several kernels torch runs for one call: radix passes, then a sort of the
                         k found), so a simulated top-k lasts what the GPU's does. No fit: how torch
                         spreads a call over the GPU changes with its shape, and a call over a few
                         long rows can outlast one over many
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from kernels import indexer as kx
from nblib.backends.device import cuda_graph_seconds
from nblib.core.results import commit

N_TINY = 64
REPLAYS = 300


def graph_times(fn, replays=REPLAYS):
    return cuda_graph_seconds(fn, replays)


def indexer_seconds(ctx, heads=64, dim=128):
    pages = -(-ctx // kx.PAGE)
    cache = torch.randn(pages + 1, kx.PAGE, dim, device="cuda").to(torch.bfloat16)
    q = torch.randn(1, heads, dim, device="cuda").to(torch.bfloat16)
    w = torch.rand(1, heads, device="cuda")
    table = torch.arange(1, pages + 1, dtype=torch.int32, device="cuda").view(1, -1)
    lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    out = torch.empty(1, pages * kx.PAGE, device="cuda")
    return statistics.median(graph_times(lambda: kx.indexer_logits_bf16(q, w, cache, table, lens, out, 1)))


TOPK_ROWS = (1, 8, 16, 20, 24, 28, 32, 36, 40, 48)
TOPK_COLS = (16384, 65536, 131072, 262144)
TOPK_KS = (16, 512)


def topk_seconds(rows, cols, k):
    x = torch.randn(rows, cols, device="cuda")
    return statistics.median(graph_times(lambda: torch.topk(x, k, dim=-1), replays=100))


def topk_grids():
    """{k: {rows, cols, seconds}}: seconds[i][j] the median call over rows[i] rows of cols[j]."""
    return {
        str(k): dict(
            rows=list(TOPK_ROWS),
            cols=list(TOPK_COLS),
            seconds=[[topk_seconds(r, c, k) for c in TOPK_COLS] for r in TOPK_ROWS],
        )
        for k in TOPK_KS
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: needs a CUDA GPU (the calibration is a measurement)")
    x = torch.zeros(1, device="cuda")
    tiny = graph_times(lambda: [x.add_(1) for _ in range(N_TINY)])
    big = torch.empty(1 << 28, device="cuda")  # 1 GiB
    dst = torch.empty_like(big)
    copy = statistics.median(graph_times(lambda: dst.copy_(big), replays=50))
    short, long_ = 2048, 32768
    t_short, t_long = indexer_seconds(short), indexer_seconds(long_)
    logs = [math.log(t) for t in tiny]
    topk = topk_grids()
    timing = dict(
        latency_s=statistics.median(tiny) / N_TINY,
        bandwidth_Bps=2 * big.numel() * big.element_size() / copy,
        program_bandwidth_Bps=(long_ - short) * 128 * 2 / (t_long - t_short),
        sigma=statistics.pstdev(logs) * math.sqrt(N_TINY),
        topk=topk,
    )
    rec = dict(
        timing=timing,
        measured=dict(
            tiny_graph_s=statistics.median(tiny),
            copy_s=copy,
            indexer_s={short: t_short, long_: t_long},
        ),
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        commit=commit(),
        date=time.strftime("%Y-%m-%d"),
        how=__doc__,
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = next((g for g in ("h200", "h100") if g in rec["device"].lower()), "gpu")
    (out / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(timing))


if __name__ == "__main__":
    main()
