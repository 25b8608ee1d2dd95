"""cProfile of the simulator on one piece of a study, the top of the profile written as text.

    python scripts/profile_sim.py --params params/sim.yaml --piece protocol --out outputs/profile/after

Pieces (each one a part of notebook 00's matrix, small enough to profile in minutes):
  protocol   the protocol's first seed on bf16 + graph + overlap on, then on bf16 + graph + overlap
             off (the same workload on a configuration that never forks)
  bucket1    the matrix's bucket-1 row on bf16 + graph + overlap on, with --sessions sessions
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


PIECES = {"protocol": piece_protocol, "bucket1": piece_bucket1}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params/sim.yaml")
    ap.add_argument("--piece", choices=sorted(PIECES), default="protocol")
    ap.add_argument("--sessions", type=int, default=10, help="bucket1: sessions of the workload")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", required=True, help="folder for <piece>.txt")
    args = ap.parse_args()
    profile = yaml.safe_load(Path(args.params).read_text())
    dev = device.get("sim")
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    PIECES[args.piece](dev, profile, args)
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    buf = io.StringIO()
    buf.write(f"piece {args.piece}, profile {args.params}: {wall:.1f} s wall, {cpu:.1f} s CPU\n")
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{args.piece}.txt.tmp"
    tmp.write_text(buf.getvalue())
    tmp.replace(out / f"{args.piece}.txt")  # atomic: the old file or the new one
    print(buf.getvalue().splitlines()[0])


if __name__ == "__main__":
    main()
