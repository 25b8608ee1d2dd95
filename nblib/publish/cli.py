"""python -m nblib run [--params params/gpu.yaml] [--out outputs/gpu] [--only 00 01]"""

import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m nblib", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute the notebooks headlessly into outputs/<run>/")
    r.add_argument("--params", help="profile file (default: params/gpu.yaml with CUDA, else params/sim.yaml)")
    r.add_argument("--out", help="output folder (default: outputs/<profile name>)")
    r.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 00 01")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        from nblib.publish import suite

        try:
            recs = suite.run(args.params, args.out, args.only, args.timeout)
        except (ValueError, RuntimeError, FileNotFoundError) as e:
            sys.exit(f"error: {e}")
        for rec in recs:
            print(f"{rec['notebook']:28s} {rec['status']:6s} {rec.get('verdict') or ''}")


if __name__ == "__main__":
    main()
