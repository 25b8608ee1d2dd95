"""Time top-k kernel variants side by side on a CUDA GPU: each of kernels.topk.KERNELS with configs
given as JSON, the sub-chunk maxima launch alone (where the two- and three-launch kernels' time
starts), each variant first checked against ref_topk_indices, eagerly and through a CUDA-graph
replay, with the registers and spills of its kernels as the driver loaded them.

    python3 scripts/topk_variants.py --out DIR [--variants FILE.json] [--ncu]

FILE.json: a list of {"kernel": "fused", "config": {...}}; without it, VARIANTS below. Writes
DIR/variants.{json,md} (kernels.harness.write_table). --ncu: run each variant once and nothing
else, for `ncu --metrics gpu__time_duration.sum` to time each kernel on its own.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import topk, topk_fused, topk_radix  # noqa: E402
from kernels.harness import median_us, meta, write_table  # noqa: E402
from kernels.launch import run  # noqa: E402

PLANS = dict(bound=topk.plan_topk, radix=topk_radix.plan_topk_radix, fused=topk_fused.plan_topk_fused)
VARIANTS = [
    dict(kernel="bound", config={}),
    dict(kernel="radix", config={}),
    dict(kernel="fused", config={}),
]
COLS = ["kernel", "config", "rows", "ok", "graph_ok", "us", "regs", "spills"]


def _variant_fn(kernel, config, x, k, out):
    plan = PLANS[kernel]
    return lambda: [run(launch) for launch in plan(x, k, out=out, config=config)]


def _graph_ok(fn, out, want):
    """The variant captured in a CUDA graph, replayed twice over a poisoned out: the reference's."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ok = True
    for _ in range(2):
        out.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(out, want)
    return ok


def _row(v, tag, x, k):
    out = torch.empty(x.shape[0], k, dtype=torch.int32, device=x.device)
    want = topk.ref_topk_indices(x, k)
    fn = _variant_fn(v["kernel"], v["config"], x, k, out)
    compiled = fn()
    ok = bool(torch.equal(out, want))
    row = dict(kernel=v["kernel"], config=json.dumps(v["config"]), rows=tag, ok=ok)
    row.update(regs="/".join(str(c.n_regs) for c in compiled))
    row.update(spills="/".join(str(c.n_spills) for c in compiled))
    row.update(graph_ok=_graph_ok(fn, out, want), us=median_us(fn))
    return row


def _maxima_rows(x, k):
    rows = []
    for maxima in (4096, 2048, 1024):
        first = topk_fused.plan_topk_fused(x, k, config=dict(maxima=maxima))[0]
        rows.append(dict(kernel="maxima_only", config=json.dumps(dict(maxima=maxima)), rows="random"))
        rows[-1]["us"] = median_us(lambda first=first: run(first))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--variants", default=None, help="a JSON file: a list of {kernel, config}")
    p.add_argument("--ncu", action="store_true", help="only run each variant (for ncu)")
    a = p.parse_args(argv)
    variants = VARIANTS
    if a.variants:
        with open(a.variants) as f:
            variants = json.load(f)
    bs, width, k = 32, 65536, 512
    x = torch.randn(bs, width, device="cuda")
    padded = x.clone()
    padded[bs - bs // 4 :] = float("-inf")  # a graph's padded batch: the last quarter all -inf
    if a.ncu:
        out = torch.empty(bs, k, dtype=torch.int32, device="cuda")
        for v in variants:
            _variant_fn(v["kernel"], v["config"], x, k, out)()
        torch.cuda.synchronize()
        return
    rows = []
    for v in variants:
        for tag, data in [("random", x)] + ([("padded", padded)] if v.get("padded") else []):
            rows.append(_row(v, tag, data, k))
            print(rows[-1], flush=True)
    rows += _maxima_rows(x, k)
    info = meta(shape=dict(bs=bs, width=width, k=k), flush="clean")
    print(write_table(a.out, "variants", info, rows, COLS))


if __name__ == "__main__":
    main()
