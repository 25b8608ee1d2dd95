"""The campaign's protocol on a profile and its variants, and the differential's designs, on one GPU.

    python scripts/gpu_protocol_probe.py OUTDIR [--params params/gpu.yaml] [--runs 5] [--blocks 0 100]
        [--variants "trunk_layers=25" "trunk_layers=26;out_min=32;out_max=64;buckets=1,8,16,24"]
        [--designs] [--topk-fit K:FIXED_S:BPS ...] [--topk-grid FILE] [--calibration FILE]

Each variant overrides model or workload keys of the profile, or its buckets (`key=value`,
`;`-separated), and runs the protocol (every session decoding together, every step counted) for
`--runs` seeds from each base seed of `--blocks` (default: the profile's seed): each run's corrupted
sessions, the pooled rate, the dispersion test, the sessions one corrupted step hit, and each bucket's
steps and corrupted steps.
`--designs` then runs notebook 02's arms on each variant, from the profile's seed. Writes
OUTDIR/protocol.json and OUTDIR/protocol.md, with the commit (NBLIB_COMMIT, else git's HEAD) and the device.
`--topk-fit` (simulator only, a counterfactual the suite never uses) times each torch.topk call as
FIXED_S + input bytes / BPS for the nearest K instead of the calibration's fit: what the race would be
if the top-k lasted that long; the files name it. `--topk-grid` (simulator only, a counterfactual too)
times it by the grids in FILE, JSON as the calibration's `timing.topk` ({k: {rows, cols, seconds}}).
`--calibration` (simulator only) times the simulator
by another calibration file (`scripts/calibrate_sim.py`'s, from another GPU) instead of
params/calibration/h200.json.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nblib.backends import device  # noqa: E402
from nblib.core.files import write_text  # noqa: E402
from nblib.core.results import commit  # noqa: E402
from nblib.engine import build  # noqa: E402
from nblib.engine.model import ModelConfig  # noqa: E402
from nblib.engine.runner import Runner  # noqa: E402
from nblib.schema import params  # noqa: E402
from nblib.studies import designs, protocol  # noqa: E402

MODEL_KEYS = {f for f in ModelConfig.__dataclass_fields__}


def variant(profile, spec):
    """The profile's model, workload and buckets with `spec`'s overrides (key=value;key=value)."""
    shapes, work, buckets = dict(profile["model"]), dict(profile["workload"]), list(profile["buckets"])
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition("=")
        if key == "buckets":
            buckets = [int(b) for b in value.split(",")]
            continue
        (shapes if key in MODEL_KEYS else work)[key] = type((shapes | work)[key])(value)
    return shapes, work, buckets


def counterfactual_topk(profile, specs, fits):
    """The simulator's top-k grids for --topk-fit: each fit's cost at every shape the variants' top-k
    calls take (rows: any batch up to the largest bucket; row length: their max_ctx)."""
    from nblib.backends.sim.timing import TopkGrid  # the simulator's model: only a sim probe asks

    shapes = [variant(profile, s) for s in specs]
    rows = range(1, max(max(b) for _, _, b in shapes) + 1)
    cols = {m["max_ctx"] for m, _, _ in shapes}
    return tuple(sorted(TopkGrid.of_cost(k, f, b, rows, cols) for k, f, b in fits))


def calibrated(path):
    """The simulator's timing from a calibration file."""
    from nblib.backends.sim.timing import Timing  # the simulator's model: only a sim probe asks

    if not Path(path).is_file():
        sys.exit(f"error: no calibration file at {path}: give a file scripts/calibrate_sim.py wrote")
    return Timing.calibrated(path)


def grids_of(path):
    """The top-k grids in a JSON file ({k: {rows, cols, seconds}}), checked before any run."""
    from nblib.backends.sim.timing import TopkGrid  # the simulator's model: only a sim probe asks

    try:
        grids = tuple(sorted(TopkGrid.from_json(k, g) for k, g in json.loads(Path(path).read_text()).items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        sys.exit(f"error: --topk-grid {path}: not a JSON object of k -> {{rows, cols, seconds}} ({e})")
    for g in grids:
        if len(g.seconds) != len(g.rows) or any(len(r) != len(g.cols) for r in g.seconds):
            sys.exit(f"error: --topk-grid {path}: k {g.k}: seconds must be len(rows) lists of len(cols)")
    return grids


def probe(dev, profile, spec, runs, blocks):
    """The protocol for one variant, captured once, from each base seed in `blocks`."""
    shapes, work, buckets = variant(profile, spec)
    m = build.model(dev, shapes, index_dtype="bf16", overlap="on")
    runner = Runner(m, buckets).capture()
    rows = []
    for base in blocks:
        t0 = time.perf_counter()
        p = protocol.run(runner, work, protocol.seeds(base, runs), label=f"[{spec or 'profile'} @{base}] ")
        seconds = round(time.perf_counter() - t0, 1)
        rows.append(dict(variant=spec or "profile", base_seed=base, seconds=seconds, **p.model_dump()))
        print(protocol.describe(p), flush=True)
    return rows


def designs_of(dev, profile, spec, runs):
    """Notebook 02's arms on one variant, from the profile's seed: the comparison and its reading."""
    shapes, work, buckets = variant(profile, spec)
    t0 = time.perf_counter()
    r = designs.compare(dev, shapes, buckets, work, protocol.seeds(profile["seed"], runs))
    text = designs.explain(r).text
    print(text, flush=True)
    seconds = round(time.perf_counter() - t0, 1)
    return dict(variant=spec or "profile", seconds=seconds, comparison=r.model_dump(), explanation=text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--params", default="params/gpu.yaml")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--variants", nargs="*", default=[""])
    ap.add_argument("--blocks", type=int, nargs="*", default=None)
    ap.add_argument("--designs", action="store_true")
    ap.add_argument("--topk-fit", nargs="*", default=None, metavar="K:FIXED_S:BPS")
    ap.add_argument("--topk-grid", default=None, metavar="FILE")
    ap.add_argument("--calibration", default=None, metavar="FILE")
    a = ap.parse_args()
    profile = params.load(a.params)
    dev = device.get(profile["backend"])
    out = Path(a.out)
    result = dict(commit=commit(), device=dev.device_name(), params=a.params)
    if (a.topk_fit is not None or a.topk_grid or a.calibration) and profile["backend"] != "sim":
        sys.exit("error: --topk-fit, --topk-grid, --calibration time the simulator; use a sim profile")
    if a.topk_fit is not None and a.topk_grid:
        sys.exit("error: give --topk-fit or --topk-grid, not both")
    if a.calibration:
        dev.timing = calibrated(a.calibration)
        result["calibration"] = a.calibration
    if a.topk_fit is not None:
        fits = tuple((int(k), float(f), float(b)) for k, f, b in (x.split(":") for x in a.topk_fit))
        dev.timing = dataclasses.replace(dev.timing, topk=counterfactual_topk(profile, a.variants, fits))
        result["topk_fit"] = [list(f) for f in fits]
    if a.topk_grid:
        dev.timing = dataclasses.replace(dev.timing, topk=grids_of(a.topk_grid))
        result["topk_grid"] = json.loads(Path(a.topk_grid).read_text())
    blocks = a.blocks if a.blocks else [profile["seed"]]
    result["variants"] = [row for v in a.variants for row in probe(dev, profile, v, a.runs, blocks)]
    if a.designs:
        result["designs"] = [designs_of(dev, profile, v, a.runs) for v in a.variants]
    write_text(out / "protocol.json", json.dumps(result, indent=1, default=str))
    lines = [f"# Protocol probe at {result['commit']}, {result['device']}, {a.params}", ""]
    if "calibration" in result:
        lines += [f"Simulator timed by the calibration {result['calibration']}", ""]
    if "topk_grid" in result:
        lines += [
            f"Counterfactual top-k timing (k: rows, row lengths, seconds): {json.dumps(result['topk_grid'])}",
            "",
        ]
    if "topk_fit" in result:
        lines += [f"Counterfactual top-k timing (k, fixed s, input bytes/s): {result['topk_fit']}", ""]
    for v in result["variants"]:
        each = ", ".join(f"{r['corrupted_sessions']}/{r['sessions']}" for r in v["runs"])
        p = v["pooled"]
        by_bucket = ", ".join(
            f"{b['bucket']}: {b['corrupted_steps']}/{b['steps']}" for b in v["bucket_steps"]
        )
        lines.append(
            f"- {v['variant']} @ seed {v['base_seed']}: runs {each}; "
            f"pooled {p['corrupted_sessions']}/{p['sessions']} "
            f"[{100 * p['lo']:.1f}%, {100 * p['hi']:.1f}%]; steps {v['corrupted_steps']}/{v['steps']} "
            f"(by bucket {by_bucket}); dispersion p {v['dispersion_p']:.2g} ({v['seconds']} s)"
        )
    for d in result.get("designs", []):
        lines += ["", f"## Designs, {d['variant']} ({d['seconds']} s)", "", d["explanation"]]
    write_text(out / "protocol.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
