"""Where is the race's window on this GPU? One call measures, for several trunk depths:
- the side branch alone (indexer + top-k) and the main branch alone (trunk + MLP) per bucket and
  context, as CUDA-graph replays (median of N);
- the decode step with overlap on and off per bucket and context;
- the agentic workload through the overlapped graphs: every step's contexts and verdict.
  python scripts/gpu_window_probe.py OUTDIR [--trunks 8 16 24] [--rounds 3]
"""

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import yaml

from kernels.harness import replay_ms
from nblib.backends import device
from nblib.backends.device import cuda_graph_seconds
from nblib.core import results
from nblib.engine.build import full_batch
from nblib.engine.model import PAGE, DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, run_sessions


def graph_ms(fn, reps):
    ts = [1e3 * x for x in cuda_graph_seconds(fn, reps, warmup=3)]
    return statistics.median(ts), statistics.pstdev(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--trunks", nargs="+", default=["8", "16", "24"], help="LAYERS or LAYERS:WIDTH")
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 2, 8, 32, 64])
    ap.add_argument("--ctxs", type=int, nargs="+", default=[2048, 8192, 24576])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--run-buckets", type=int, nargs="+", help="buckets to run the workload in (default: all)"
    )
    ap.add_argument(
        "--programs", type=int, nargs="+", default=[0], help="indexer programs per request (0: fill the GPU)"
    )
    ap.add_argument("--no-branch", action="store_true", help="skip the branch-alone timings")
    ap.add_argument("--topk-kernel", default="torch", choices=("torch", "triton"), help="the model's top-k")
    ap.add_argument(
        "--workload",
        default='{"sessions": 40, "rounds": 3, "ctx_min": 2048, "ctx_max": 24576, '
        '"turn_ctx": 4096, "out_min": 16, "out_max": 48, "think_min": 1, "think_max": 8}',
    )
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = device.get("cuda")
    prof = yaml.safe_load(Path("params/gpu.yaml").read_text())
    # set per probed trunk below
    shape_keys = ("trunk_layers", "trunk_width", "indexer_programs", "topk_kernel")
    base = dict(
        {k: v for k, v in prof["model"].items() if k not in shape_keys},
        num_pages=max(prof["model"]["num_pages"], 1 + max(a.buckets) * max(a.ctxs) // PAGE + 64, 30000),
    )
    wl = json.loads(a.workload)
    res = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        commit=results.commit(),
        base=base,
        workload=wl,
        trunks={},
    )

    for layers_spec, progs in [(tr, p) for p in a.programs for tr in a.trunks]:
        trunk = f"{layers_spec}/p{progs}"
        t0 = time.time()
        r = res["trunks"][trunk] = dict(branch={}, step={}, runs={}, aliases=[])
        for ov in ("on", "off"):
            layers, _, width = str(trunk).split("/")[0].partition(":")
            shape = dict(
                trunk_layers=int(layers),
                trunk_width=int(width or base.get("trunk_width", 2048)),
                indexer_programs=progs,
                topk_kernel=a.topk_kernel,
            )
            m = DecodeModel(ModelConfig(**base, **shape, overlap=ov), dev)
            if ov == "on" and not a.no_branch:
                for b in a.buckets:
                    for ctx in a.ctxs:
                        tok, table, lens, stores = full_batch(m, b, ctx=ctx)
                        x = m.embed[tok]
                        q = (x @ m.w_q).view(-1, m.cfg.heads, m.cfg.dim)
                        hw = (x @ m.w_head).float()
                        logits = torch.empty(b, m.cfg.max_ctx, device="cuda")
                        side = graph_ms(partial(m.indexer, q, hw, table, lens, logits), a.reps)
                        main = graph_ms(partial(m.main_branch, x), a.reps)
                        trunk_only = graph_ms(partial(m.trunk, x), a.reps)
                        r["branch"][f"{b}/{ctx}"] = dict(
                            side_ms=side[0],
                            main_ms=main[0],
                            trunk_ms=trunk_only[0],
                            side_sd=side[1],
                            main_sd=main[1],
                        )
            runner = Runner(m, a.buckets, "graph").capture()
            if ov == "on":
                r["aliases"] = [
                    dict(bucket=x["bucket"], first=x["first"], second=x["second"], shared=x["shared_bytes"])
                    for x in runner.aliases()
                ]
            for b in a.buckets:
                for ctx in a.ctxs:
                    args = full_batch(m, b, ctx=ctx)
                    st = runner.static[b]
                    st.fill(*args)
                    ts = replay_ms(runner.graphs[b][0], a.reps, warmup=3)
                    r["step"].setdefault(f"{b}/{ctx}", {})[ov] = statistics.median(ts)
            if ov == "on":
                for b in a.run_buckets or a.buckets:
                    w = WorkloadConfig(**{**wl, "concurrency": b})
                    res_b = run_sessions(runner, w)
                    steps = [
                        dict(
                            bucket=s["bucket"],
                            bs=s["bs"],
                            ctx_sum=s["ctx_sum"],
                            ctx_max=s["ctx_max"],
                            bad=s["bad_rows"],
                        )
                        for s in res_b["step_log"]
                    ]
                    r["runs"][b] = dict(
                        sessions=res_b["sessions"],
                        corrupted_sessions=res_b["corrupted_sessions"],
                        steps=res_b["steps"],
                        corrupted_steps=res_b["corrupted_steps"],
                        step_log=steps,
                    )
                    print(
                        f"trunk {trunk} bucket {b}: "
                        f"sessions {res_b['corrupted_sessions']}/{res_b['sessions']} "
                        f"steps {res_b['corrupted_steps']}/{res_b['steps']}",
                        flush=True,
                    )
            del runner, m
            torch.cuda.empty_cache()
        for k, v in r["step"].items():
            bb = r["branch"].get(k, {})
            print(
                f"trunk {trunk} {k:>9s}: step on {v['on']:.3f} off {v['off']:.3f} "
                f"gain {1 - v['on'] / v['off']:+.1%} side {bb.get('side_ms', 0):.3f} "
                f"main {bb.get('main_ms', 0):.3f} trunk {bb.get('trunk_ms', 0):.3f}",
                flush=True,
            )
        print(
            f"trunk {trunk}: aliases {sorted({(x['bucket'], x['second']) for x in r['aliases']})} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
        (out / "probe.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
