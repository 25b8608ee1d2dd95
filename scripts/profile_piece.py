"""cProfile of one piece of a study, on the simulator or on CUDA, the top of the profile written as text.

    python scripts/profile_piece.py --params params/sim.yaml --piece protocol --out outputs/profile/after

Pieces (parts of notebook 00's matrix and its replays, each small enough to profile in minutes):
  protocol   the protocol's first seed on bf16 + graph + overlap on, then on bf16 + graph + overlap
             off (the same workload on a configuration that never forks)
  bucket1    the matrix's bucket-1 row on bf16 + graph + overlap on, with --sessions sessions
  replays    on bf16 + graph + overlap on, each bucket's full batch (--ctx entries a request, about
             the workload's longest) replayed and its eager reference computed, --replays times
  audit      notebook 03's audit of one configuration (bf16 + transient + overlap on): every bucket
             captured under the recorder, the report, the graphs read back and cross-checked, then
             the zoo of planted races
  setup      building the model (weights and caches) --replays times
  matrix     notebook 00's study whole: the corruption matrix with the protocol's runs on the
             configurations it checks (the phase table of the run is written above the profile)
Writes <out>/<piece>.txt: wall and CPU seconds, then the top functions by cumulative and by own
time. Runs on any checkout of the project (it uses only the studies' public functions), so the
same piece can be profiled on two commits and the files compared.
"""

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path.cwd()))  # the checkout the script is run from

from nblib.backends import device  # noqa: E402
from nblib.engine import build  # noqa: E402
from nblib.engine.runner import Runner  # noqa: E402
from nblib.studies import protocol  # noqa: E402


def _runner(dev, profile, overlap):
    try:  # a checkout with shared eager references gives its runners the process's store
        from nblib.engine import references

        kw = dict(references=references.shared())
    except ImportError:
        kw = {}
    m = build.model(dev, profile["model"], index_dtype="bf16", overlap=overlap)
    return Runner(m, profile["buckets"], "graph", **kw).capture()


def piece_protocol(dev, profile, args):
    for overlap in ("on", "off"):
        protocol.run(_runner(dev, profile, overlap), profile["workload"], [profile.get("seed", 0)])


def piece_bucket1(dev, profile, args):
    build.bucket_run(_runner(dev, profile, "on"), profile["workload"], 1, sessions=args.sessions)


def _cpu_ms(fn, n):
    c0 = time.process_time()
    for _ in range(n):
        fn()
    return 1e3 * (time.process_time() - c0) / n


def piece_replays(dev, profile, args):
    """Returns a line per bucket: CPU ms of one replay and of one eager reference (the profiler's
    own cost included, the same on any checkout)."""
    r = _runner(dev, profile, "on")
    lines = []
    for b in profile["buckets"]:
        batch = build.full_batch(r.model, b, ctx=args.ctx)
        replay = _cpu_ms(lambda batch=batch: r.run(*batch), args.replays)
        reference = _cpu_ms(lambda batch=batch: r.reference(*batch), args.replays)
        lines.append(f"bucket {b}: replay {replay:.2f} ms CPU, eager reference {reference:.2f} ms CPU\n")
    return lines


def piece_audit(dev, profile, args):
    from nblib.studies import overlap

    rep, runner, _ = overlap.audit_model(
        dev, profile["model"], profile["buckets"], "bf16", "on", "transient", keep_graph=True
    )
    config = dict(logits_policy="transient", index_dtype="bf16", overlap="on")
    rows = overlap.graph_rows(rep, runner, config)
    zoo = overlap.zoo_rows(dev)
    return [f"{rep.summary()}; {len(rows)} graphs read; zoo {len(zoo)} scenarios\n"]


def piece_setup(dev, profile, args):
    for _ in range(args.replays):
        build.model(dev, profile["model"], index_dtype="bf16", overlap="on")


def piece_matrix(dev, profile, args):
    from nblib.core import phases
    from nblib.studies import reproduce

    clock = phases.start(sync=dev.synchronize)
    w = {**profile["workload"], "seed": profile.get("seed", 0)}
    knobs = reproduce.Knobs(
        profile["index_dtypes"],
        profile["modes"],
        profile["overlaps"],
        profile.get("logits_policy", "transient"),
    )
    seeds = protocol.seeds(profile.get("seed", 0), profile["protocol_runs"])
    reproduce.corruption_matrix(dev, profile["model"], profile["buckets"], w, knobs, seeds)
    wall = clock.wall()
    return [phases.table(clock.times(wall), wall) + "\n"]


PIECES = {
    "protocol": piece_protocol,
    "bucket1": piece_bucket1,
    "replays": piece_replays,
    "audit": piece_audit,
    "setup": piece_setup,
    "matrix": piece_matrix,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params/sim.yaml")
    ap.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    ap.add_argument("--piece", choices=sorted(PIECES), default="protocol")
    ap.add_argument("--sessions", type=int, default=10, help="bucket1: sessions of the workload")
    ap.add_argument("--replays", type=int, default=50, help="replays: replays and references per bucket")
    ap.add_argument("--ctx", type=int, default=600, help="replays: entries per request of the full batch")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", required=True, help="folder for <piece>.txt")
    args = ap.parse_args()
    profile = yaml.safe_load(Path(args.params).read_text())
    dev = device.get(args.backend)
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    lines = PIECES[args.piece](dev, profile, args) or []
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    head = f"piece {args.piece}, profile {args.params}, backend {dev.name}"
    lines = [f"{head}: {wall:.1f} s wall, {cpu:.1f} s CPU\n", *lines]
    print(write_profile(prof, lines, args.top, Path(args.out) / f"{args.piece}.txt"))


def write_profile(prof, lines, top, path):
    """`lines`, then the top `top` functions of `prof` by cumulative and by own time, written to
    path atomically (the old file or the new one); returns the first line."""
    buf = io.StringIO()
    buf.writelines(lines)
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(buf.getvalue())
    tmp.replace(path)
    return buf.getvalue().splitlines()[0]


if __name__ == "__main__":
    main()
