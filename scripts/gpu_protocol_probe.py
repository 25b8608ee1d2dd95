"""The campaign's protocol on a profile and its variants, and the differential's designs, on one GPU.

    python scripts/gpu_protocol_probe.py OUTDIR [--params params/gpu.yaml] [--runs 5]
        [--variants "trunk_layers=25" "trunk_layers=26;out_min=32;out_max=64"] [--designs]

Each variant overrides model or workload keys of the profile (`key=value`, `;`-separated) and runs the
protocol (every session decoding together, every step counted) for `--runs` seeds: each run's
corrupted sessions, the pooled rate, the dispersion test, the sessions one corrupted step hit.
`--designs` then runs notebook 02's arms on the profile itself. Writes OUTDIR/protocol.json and
OUTDIR/protocol.md, with the commit (NBLIB_COMMIT) and the device.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nblib.backends import device  # noqa: E402
from nblib.core.files import write_text  # noqa: E402
from nblib.engine import build  # noqa: E402
from nblib.engine.model import ModelConfig  # noqa: E402
from nblib.engine.runner import Runner  # noqa: E402
from nblib.schema import params  # noqa: E402
from nblib.studies import designs, protocol  # noqa: E402

MODEL_KEYS = {f for f in ModelConfig.__dataclass_fields__}


def variant(profile, spec):
    """The profile's model and workload with `spec`'s overrides (key=value;key=value)."""
    shapes, work = dict(profile["model"]), dict(profile["workload"])
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition("=")
        (shapes if key in MODEL_KEYS else work)[key] = type((shapes | work)[key])(value)
    return shapes, work


def probe(dev, profile, spec, runs):
    shapes, work = variant(profile, spec)
    m = build.model(dev, shapes, index_dtype="bf16", overlap="on")
    runner = Runner(m, profile["buckets"]).capture()
    t0 = time.perf_counter()
    p = protocol.run(runner, work, protocol.seeds(profile["seed"], runs), label=f"[{spec or 'profile'}] ")
    row = dict(variant=spec or "profile", seconds=round(time.perf_counter() - t0, 1), **p.model_dump())
    print(protocol.describe(p), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--params", default="params/gpu.yaml")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--variants", nargs="*", default=[""])
    ap.add_argument("--designs", action="store_true")
    a = ap.parse_args()
    profile = params.load(a.params)
    dev = device.get(profile["backend"])
    out = Path(a.out)
    result = dict(commit=os.environ.get("NBLIB_COMMIT", "unknown"), device=dev.device_name(), params=a.params)
    result["variants"] = [probe(dev, profile, v, a.runs) for v in a.variants]
    if a.designs:
        t0 = time.perf_counter()
        seeds = protocol.seeds(profile["seed"], a.runs)
        r = designs.compare(dev, profile["model"], profile["buckets"], profile["workload"], seeds)
        result["designs"] = r.model_dump()
        result["designs_seconds"] = round(time.perf_counter() - t0, 1)
        result["explanation"] = designs.explain(r).text
        print(result["explanation"], flush=True)
    write_text(out / "protocol.json", json.dumps(result, indent=1, default=str))
    lines = [f"# Protocol probe at {result['commit']}, {result['device']}, {a.params}", ""]
    for v in result["variants"]:
        each = ", ".join(f"{r['corrupted_sessions']}/{r['sessions']}" for r in v["runs"])
        p = v["pooled"]
        lines.append(
            f"- {v['variant']}: runs {each}; pooled {p['corrupted_sessions']}/{p['sessions']} "
            f"[{100 * p['lo']:.1f}%, {100 * p['hi']:.1f}%]; steps {v['corrupted_steps']}/{v['steps']}; "
            f"dispersion p {v['dispersion_p']:.2g} ({v['seconds']} s)"
        )
    if a.designs:
        lines += ["", "## Designs", "", result["explanation"]]
    write_text(out / "protocol.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
