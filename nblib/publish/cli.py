"""python -m nblib run [--params params/gpu.yaml] [--out outputs/gpu] [--only 00 01]
python -m nblib cells   (rewrite each notebook's parameters cell from the profile schema)"""

import argparse
import sys

import nbformat

from nblib.core.paths import NOTEBOOK_DIR
from nblib.publish import params, suite


def write_cells():
    """Each notebook's parameters cell, rewritten from the schema (run `make lint` after)."""
    for name in params.DECLARES:
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        nb = nbformat.read(path, 4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source = params.parameters_cell(name)
        nbformat.write(nb, path)
        print(f"{path}: parameters cell written from the schema")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m nblib", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute the notebooks headlessly into outputs/<run>/")
    r.add_argument("--params", help="profile file (default: params/gpu.yaml with CUDA, else params/sim.yaml)")
    r.add_argument("--out", help="output folder (default: outputs/<profile name>)")
    r.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 00 01")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    sub.add_parser("cells", help="rewrite each notebook's parameters cell from the profile schema")
    args = ap.parse_args(argv)
    if args.cmd == "cells":
        write_cells()
        return
    try:
        recs = suite.run(args.params, args.out, args.only, args.timeout)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    for rec in recs:
        print(f"{rec['notebook']:26s} {rec['status']:6s} {rec['seconds']:7.1f} s  {rec.get('verdict') or ''}")
    out = suite.output_dir(args.params, args.out)
    print(f"outputs: {out}/index.html (every verdict), {out}/writeup.md (the writeup)")


if __name__ == "__main__":
    main()
