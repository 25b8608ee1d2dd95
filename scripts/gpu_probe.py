"""Where do aliases form on this GPU? Capture every bucket for a few MLP widths and report the
transients that share bytes across streams, a short corruption check, and the allocator trace.
Usage: python scripts/gpu_probe.py OUTDIR [ffn ...]"""

import sys
import time

import torch

from nblib.backends import device
from nblib.core.files import write_json
from nblib.engine.model import DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, run_sessions

out = sys.argv[1]
ffns = [int(x) for x in sys.argv[2:]] or [16384, 32768]
dev = device.get("cuda")
buckets = [1, 2, 4, 8, 16, 32, 64]
report = {}
for ffn in ffns:
    for dtype, overlap in (("bf16", "on"), ("bf16", "off"), ("fp8", "on")):
        cfg = ModelConfig(ffn=ffn, num_pages=20000, index_dtype=dtype, overlap=overlap)
        m = DecodeModel(cfg, dev)
        r = Runner(m, buckets, "graph")
        trace = dtype == "bf16" and overlap == "on"
        if trace:
            dev.memory_history(True)
        t0 = time.perf_counter()
        r.capture()
        cap_s = time.perf_counter() - t0
        if trace:
            snap = dev.memory_snapshot()
            dev.memory_history(False)
            ev = [
                dict(
                    action=e["action"],
                    addr=e["addr"],
                    size=e["size"],
                    stream=e["stream"],
                    frame=(e.get("frames") or [{}])[0].get("name", "") if e.get("frames") else "",
                )
                for dt in snap["device_traces"]
                for e in dt
            ]
            write_json(f"{out}/alloc_trace_ffn{ffn}.json", ev)
        al = r.aliases()
        key = f"ffn={ffn} {dtype} overlap={overlap}"
        rec = dict(capture_s=round(cap_s, 2), aliases=al, runs={})
        for c in (2, 8, 16, 32, 40):
            w = WorkloadConfig(
                sessions=max(c, 8),
                rounds=1,
                concurrency=min(c, 64),
                ctx_min=4096,
                ctx_max=49152,
                out_min=8,
                out_max=24,
            )
            t0 = time.perf_counter()
            res = run_sessions(r, w)
            rec["runs"][c] = dict(
                sessions=res["sessions"],
                bad=res["corrupted_sessions"],
                steps=res["steps"],
                bad_steps=res["corrupted_steps"],
                buckets=sorted({s["bucket"] for s in res["step_log"]}),
                ms_per_step=round(1000 * (time.perf_counter() - t0) / max(1, res["steps"]), 2),
            )
        report[key] = rec
        print(key, "aliases:", [(a["bucket"], a["first"], a["second"], a["shared_bytes"]) for a in al])
        print("   ", rec["runs"], flush=True)
        del r, m
        torch.cuda.empty_cache()
write_json(f"{out}/probe.json", report)
