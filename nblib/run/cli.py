"""python -m nblib run [--params params/gpu.yaml] [--out outputs/gpu] [--only 00 01] [--lanes 2]
python -m nblib cells   (rewrite each notebook's parameters cell from the profile schema)
python -m nblib sweep --params P --grid params/grids/G.yaml [--workers N | --ray auto|local|ADDRESS]
python -m nblib publish RUN_DIR|SWEEP_DIR [--out DIR/site] [--check]
python -m nblib window [--params P] [--out params/local-<gpu>.yaml] [--runs 2] [--depths LO:HI] [--band LO:HI]
python -m nblib audit TARGET [--backend cuda|sim] [--json] [--label L] [--confirm [--replays N]]
python -m nblib results [--check] [--out docs/results.md]   (the page of committed results)
python -m nblib stats 9/40 11/40 [--baseline 44/200] [--json]   (the protocol's statistics for your counts)"""

import argparse
import sys
import time
from pathlib import Path

from nblib.run.errors import SuiteError

# Each command imports its own modules when it runs: papermill, nbconvert and Playwright cost
# seconds to import, and `--help` or a bad argument should not pay for them.
ERRORS = (ValueError, RuntimeError, FileNotFoundError)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m nblib", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute the notebooks headlessly into outputs/<run>/")
    r.add_argument("--params", help="profile file (default: params/gpu.yaml with CUDA, else params/sim.yaml)")
    r.add_argument("--out", help="output folder (default: outputs/<profile name>)")
    r.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 00 01")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    r.add_argument(
        "--lanes",
        type=_lanes,
        default=1,
        help="run 00-04 and 06 in N processes, one GPU each on CUDA; auto: one per GPU, or per CPU core "
        "on the simulator",
    )
    r.add_argument(
        "--bench",
        action="store_true",
        help="first drop the run folder's stored eager steps, then write the speed table to "
        "outputs/bench-suite/<machine>-<profile>-<commit>/",
    )
    sub.add_parser("cells", help="rewrite each notebook's parameters cell from the profile schema")
    s = sub.add_parser("sweep", help="a notebook or the suite over a parameter grid, resumably")
    s.add_argument("--params", required=True, help="the profile every point starts from")
    s.add_argument("--grid", required=True, help="grid file (see params/grids/)")
    s.add_argument("--notebook", help="notebook prefix or 'suite' (default: the grid file's `notebook`)")
    s.add_argument("--out", help="output folder (default: outputs/sweeps/<grid>-<profile>)")
    s.add_argument("--workers", type=int, help="local workers (default: one per GPU, or one per core on sim)")
    s.add_argument("--ray", metavar="auto|local|ADDRESS", help="run one Ray task per point on this cluster")
    s.add_argument("--table", choices=("csv", "parquet"), default="csv")
    s.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    p = sub.add_parser("publish", help="build a static site from one run folder or one sweep folder")
    p.add_argument("run_dir", help="a run folder (outputs/gpu) or a sweep's (one holding sweep.json)")
    p.add_argument("--out", help="site folder (default: RUN_DIR/site)")
    p.add_argument(
        "--check", action="store_true", help="open it in headless Chromium; screenshot the landing page"
    )
    a = sub.add_parser("audit", help="capture one step of your code and name every cross-stream race in it")
    a.add_argument("target", help="module:function or path/to/file.py:function that returns the step")
    a.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto", help="default: cuda if any")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.add_argument("--label", help="the name the report gives the capture (default: TARGET)")
    a.add_argument(
        "--confirm",
        action="store_true",
        help="replay each hazard with its losing order forced and compare with eager (docs/audit.md)",
    )
    a.add_argument("--replays", type=int, default=20, help="forced replays per hazard with --confirm")
    w = sub.add_parser("window", help="the trunk depth where the race is intermittent on this GPU")
    w.add_argument("--params", help="profile to tune (default: params/gpu.yaml with CUDA, else sim.yaml)")
    w.add_argument("--out", help="profile to write (default: params/local-<gpu name>.yaml; local-sim on sim)")
    w.add_argument("--runs", type=int, default=2, help="protocol runs per depth (the confirm: protocol_runs)")
    w.add_argument("--depths", help="LO:HI, trunk depths to search (default: around the profile's, widened)")
    w.add_argument("--band", default="0.1:0.4", help="LO:HI, the intermittent share of sessions corrupted")
    d = sub.add_parser("results", help="write docs/results.md from the committed results files")
    d.add_argument("--out", help="the page (default: docs/results.md)")
    d.add_argument("--check", action="store_true", help="exit 1, naming the lines, when the page is stale")
    c = sub.add_parser("stats", help="the protocol's statistics for counts from your own runs")
    c.add_argument("runs", nargs="+", help="each run's count, CORRUPTED/SESSIONS (e.g. 9/40)")
    c.add_argument("--baseline", help="the pooled count without your change, CORRUPTED/SESSIONS")
    c.add_argument("--alpha", type=float, default=0.05, help="the tests' level (default 0.05)")
    c.add_argument("--power", type=float, default=0.8, help="for the sessions a fix needs (default 0.8)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        COMMANDS[args.cmd](args)
    except ERRORS as e:
        sys.exit(f"error: {e}")
    except SuiteError as e:  # its message names the notebook or lane and where the results are
        sys.exit(str(e))


def _lanes(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lanes takes a positive integer or auto, got {text!r}") from None


def _run(args):
    from nblib.publish import runindex
    from nblib.run import benchtable, suite
    from nblib.schema import params as P

    t0 = time.perf_counter()
    # a speed table times a first run: eager steps an earlier run stored in the folder are dropped
    records = suite.run(args.params, args.out, args.only, args.timeout, args.lanes, fresh=args.bench)
    wall = time.perf_counter() - t0
    for rec in records:
        print(f"{rec['notebook']:26s} {rec['status']:6s} {rec['seconds']:7.1f} s  {rec.get('verdict') or ''}")
    print(benchtable.text(records))  # where each notebook's time went, phase by phase
    if args.bench:
        backend = next((r["backend"] for r in records if r.get("backend")), "sim")
        n = suite.resolve_lanes(args.lanes, backend)
        lanes = len(suite.lane_plan(suite.available(args.only), n)) or 1
        table, folder = benchtable.write(
            records,
            backend,
            runindex.shown_path(args.params or P.default_profile()),
            wall_seconds=wall,
            lanes=lanes,
        )
        print(f"speed table: {folder}/speed.md (wall {wall:.1f} s on {lanes} lane(s))")
    out = suite.output_dir(args.params, args.out)
    print(f"outputs: {out}/index.html (every verdict), {out}/writeup.md (the writeup)")


def _cells(args):
    """Each notebook's parameters cell, rewritten from the schema (run `make lint` after)."""
    import nbformat

    from nblib.core.paths import NOTEBOOK_DIR
    from nblib.schema import params

    for name in params.DECLARES:
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        nb = nbformat.read(path, 4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source = params.parameters_cell(name)
        nbformat.write(nb, path)
        print(f"{path}: parameters cell written from the schema")


def _sweep(args):
    from nblib.run import sweep

    outcomes, table, fig = sweep.sweep(
        args.params, args.grid, args.out, args.workers, args.ray, args.table, args.timeout, args.notebook
    )
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        print(f"failed point {o.point.id} {o.point.values}: {o.error}")
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} points ok; table {table}, figure {fig}")
    if failed:
        sys.exit(1)


def _publish(args):
    from nblib.publish import site, sweep_site

    build = sweep_site.build if sweep_site.is_sweep(args.run_dir) else site.build
    built = build(args.run_dir, args.out)
    print(f"site: {built.root / 'index.html'} ({len(built.pages)} pages)")
    if args.check:
        from nblib.publish import browse

        shot = Path(args.run_dir) / "landing.png"
        check = browse.check(built.root, screenshot=shot)
        print(
            f"checked {len(check.pages)} pages, {check.images} images, {check.links} links; screenshot {shot}"
        )
        if not check.ok:
            sys.exit("site check failed:\n" + "\n".join(check.problems()))


def _audit(args):
    """Exit 0 clean, 1 a hazard, 2 a failed build or capture, or a bad TARGET (one line, no capture)."""
    from nblib.instruments.audit import target as audit_target

    if args.replays < 1:
        print(f"error: --replays must be at least 1, got {args.replays}", file=sys.stderr)
        sys.exit(2)
    try:
        confirm = args.replays if args.confirm else 0
        rep = audit_target.audit(args.target, args.backend, args.label, confirm=confirm)
    except audit_target.TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(rep.model_dump_json(indent=2) if args.json else rep.text())
    sys.exit(rep.exit_code)


def _window(args):
    """Exit 0 with the tuned profile written; 1 when no depth gives an intermittent rate (the points
    printed say why; nothing written). Every argument is checked before a model is built."""
    from nblib.run import window_command

    try:
        window_command.tune(args.params, args.out, args.runs, args.depths, args.band)
    except window_command.NoWindow:
        sys.exit(1)


def _results(args):
    from nblib.publish import results_doc

    out = Path(args.out) if args.out else results_doc.DOC
    if not args.check:
        print(f"wrote {results_doc.write(out)}")
        return
    diff = results_doc.differences(out)
    if diff:
        print("\n".join(diff))
        sys.exit(f"{out} differs from the committed results in the lines above: run python -m nblib results")
    print(f"{out} agrees with the committed results")


def _stats(args):
    from nblib.studies import counts

    runs = [counts.parse(r) for r in args.runs]
    base = counts.parse(args.baseline) if args.baseline else None
    if not (0 < args.alpha < 1 and 0 < args.power < 1):
        raise ValueError(f"--alpha and --power lie strictly between 0 and 1; got {args.alpha}, {args.power}")
    rep = counts.report(runs, base, alpha=args.alpha, power=args.power)
    print(rep.model_dump_json(indent=1) if args.json else rep.text)


COMMANDS = {
    "run": _run,
    "cells": _cells,
    "sweep": _sweep,
    "publish": _publish,
    "audit": _audit,
    "window": _window,
    "results": _results,
    "stats": _stats,
}

if __name__ == "__main__":
    main()
