"""`python -m nblib sweep --params P --grid GRID.yaml`: a notebook (or the whole suite) over a
parameter grid, in parallel and resumably; every point's results.json gathered into one table and
one figure (the corruption rate, with Wilson 95% intervals, against the swept knob).

A grid file (params/grids/*.yaml):

    notebook: 00_reproduce          # a notebook name or prefix, or "suite"
    x: logits_policy                # the knob on the figure's x axis (default: the first key)
    grid:
      seed: [0, 1, 2]
      logits_policy: [transient, record_stream]
      index_dtypes: [[bf16], [fp8]]
      workload.sessions: [16, 40]   # a dotted key sets one field of a dict parameter

Every grid key must be a parameter the notebook declares (nblib.schema.params.DECLARES), and each
point must pass the profile schema (params.validate); a key or value that does not fails in one
line before anything runs.

Each point is one `python -m nblib run` into OUT/points/<id>/ (the id is a hash of the point's
values, so a changed grid never reuses a stale folder). Workers: one per GPU on a CUDA profile,
each child pinned with CUDA_VISIBLE_DEVICES; N processes on the simulator; or one Ray task per
point (nblib.run.raysweep). A point whose notebooks all say status ok is skipped when the sweep
runs again; a point that fails is run once more, then recorded as failed.

    OUT/sweep.json                      every point: values, status, attempts, error, seconds
    OUT/sweep.csv (or .parquet), OUT/sweep.png
"""

import hashlib
import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml
from tqdm.auto import tqdm

from nblib.core.files import write_text
from nblib.core.paths import ROOT
from nblib.core.results import write_json
from nblib.publish import runindex
from nblib.run import suite, sweep_table
from nblib.schema import params as P

RESERVED = P.NOT_IN_PROFILES  # the sweep sets output_dir; INTERACTIVE is for live sessions
ATTEMPTS = 2  # a failed point is run once more, then recorded as failed


@dataclass(frozen=True)
class Grid:
    notebooks: tuple  # the notebooks each point runs
    keys: tuple  # swept keys, in the file's order
    values: tuple  # one list of values per key
    x: str  # the figure's x axis
    name: str


@dataclass(frozen=True)
class Point:
    id: str
    values: dict  # grid key -> this point's value
    params: dict  # the whole profile for this point


class Outcome(NamedTuple):
    point: Point
    status: str  # ok | failed | skipped (already ok from an earlier sweep)
    attempts: int
    error: str | None
    seconds: float
    worker: str = ""  # where it ran: "GPU 1", "cpu", "ray node 10.0.0.2 GPU 0"
    started: float = 0.0  # unix time, so a sweep's record shows its workers overlapping


def declared(notebook):
    """The parameters a notebook declares, from the profile schema (nblib.schema.params)."""
    return frozenset(P.DECLARES[notebook])


def load_grid(path, notebook=None):
    """Read and check a grid file; `notebook` overrides the file's."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no grid file {path}: see params/grids/ for examples")
    spec = yaml.safe_load(path.read_text()) or {}
    grid = spec.get("grid") if isinstance(spec, dict) else None
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"{path} needs a mapping `grid:` of parameter names to lists of values")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ValueError(f"grid key {k!r} in {path} needs a non-empty list of values, got {v!r}")
        if len({json.dumps(x, sort_keys=True) for x in v}) < len(v):  # two points, one folder
            raise ValueError(f"grid key {k!r} in {path} lists a value twice: {v!r}")
    which = notebook or spec.get("notebook", "suite")
    notebooks = tuple(suite.available() if which == "suite" else suite.available([str(which)]))
    if not notebooks:
        raise ValueError(f"no notebook matches {which!r}: choose among {', '.join(suite.NOTEBOOKS)} or suite")
    x = spec.get("x", next(iter(grid)))
    if x not in grid:
        raise ValueError(f"x: {x!r} is not a grid key; choose one of {', '.join(grid)}")
    return Grid(notebooks, tuple(grid), tuple(grid.values()), x, path.stem)


def check_keys(profile, grid):
    """A grid key the swept notebooks do not declare fails here in one line (with a dotted key, the
    profile must already hold the dict field it sets). params.load has checked the profile's keys."""
    mine = frozenset().union(*(declared(n) for n in grid.notebooks))
    for k in grid.keys:
        base, _, field = k.partition(".")
        if base not in mine or base in RESERVED:
            names = ", ".join(sorted(mine - set(RESERVED)))
            raise ValueError(
                f"grid key {k!r} is not a parameter of {', '.join(grid.notebooks)}: choose among {names}"
            )
        if field and not (isinstance(profile.get(base), dict) and field in profile[base]):
            have = ", ".join(profile[base]) if isinstance(profile.get(base), dict) else "no fields"
            raise ValueError(f"grid key {k!r}: the profile's {base!r} has {have}")


def _set(params, key, value):
    base, _, field = key.partition(".")
    if field:
        params[base] = {**params[base], field: value}
    else:
        params[base] = value


def points(profile, grid):
    """Every combination of the grid's values applied to the profile, each validated by the profile
    schema (a bad value fails here in one line, naming the point, before anything runs)."""
    out = []
    for combo in itertools.product(*grid.values):
        values = dict(zip(grid.keys, combo))
        params = json.loads(json.dumps(profile))  # a deep copy, plain values only
        for k, v in values.items():
            _set(params, k, v)
        P.validate(params, f"grid point {values}", list(profile))
        digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]
        out.append(Point(digest, values, params))
    return out


def done(point_dir, notebooks):
    """Every notebook of the point finished: its results.json says status ok."""
    for n in notebooks:
        try:
            if json.loads((Path(point_dir) / f"{n}.results.json").read_text()).get("status") != "ok":
                return False
        except (OSError, ValueError):
            return False
    return True


def run_point(point, notebooks, point_dir, env=None, timeout=1800, worker=None):
    """Run one point with `python -m nblib run` in a child process (its own papermill kernels);
    a second attempt if the first fails. Returns an Outcome; the child's output goes to run.log."""
    point_dir, started = Path(point_dir), time.time()
    gpus = (env or os.environ).get("CUDA_VISIBLE_DEVICES")
    worker = worker or (f"GPU {gpus}" if gpus else "cpu")
    write_text(point_dir / "params.yaml", yaml.safe_dump(point.params, sort_keys=False))
    write_json(point_dir / "point.json", dict(id=point.id, values=point.values))
    cmd = [sys.executable, "-m", "nblib", "run", "--params", str(point_dir / "params.yaml")]
    cmd += ["--out", str(point_dir), "--only", *notebooks, "--timeout", str(timeout)]
    t0, error = time.perf_counter(), None
    for attempt in range(1, ATTEMPTS + 1):
        with open(point_dir / "run.log", "a") as log:
            log.write(f"--- attempt {attempt}: {' '.join(cmd)}\n")
            log.flush()
            p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
        if p.returncode == 0 and done(point_dir, notebooks):
            # the eager steps the point's notebooks shared (hundreds of MB a point on the H200
            # profile): nothing reads them once the point is done, since a later sweep skips it
            shutil.rmtree(point_dir / ".references", ignore_errors=True)
            return Outcome(point, "ok", attempt, None, round(time.perf_counter() - t0, 1), worker, started)
        error = _last_error(point_dir / "run.log") or f"exit status {p.returncode}"
    return Outcome(point, "failed", ATTEMPTS, error, round(time.perf_counter() - t0, 1), worker, started)


def _last_error(log):
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    hits = [x for x in lines if "failed:" in x or x.startswith("error:")]
    return (hits or lines or [None])[-1]


def slots(backend, workers=None):
    """The environment of each local worker: one per GPU (CUDA_VISIBLE_DEVICES) on CUDA, else
    `workers` CPU processes sharing the cores (OMP_NUM_THREADS), so N workers never oversubscribe."""
    if backend == "cuda":
        from nblib.backends import device  # lazily: it imports torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(device.gpu_count())]
        n = workers or len(gpus)
        if n > len(gpus):
            raise ValueError(f"{n} workers but {len(gpus)} GPU(s) here: one worker per GPU at most")
        return [{**os.environ, "CUDA_VISIBLE_DEVICES": g} for g in gpus[:n]]
    cores = os.cpu_count() or 1
    n = workers or cores
    return [{**os.environ, "OMP_NUM_THREADS": str(max(1, cores // n))} for _ in range(n)]


def run_local(todo, notebooks, out, envs, timeout, bar):
    """Run the points on local workers, each holding one environment (one GPU) at a time."""
    free = queue.Queue()
    for e in envs:
        free.put(e)

    def work(point):
        env = free.get()
        try:
            return run_point(point, notebooks, out / "points" / point.id, env, timeout)
        finally:
            free.put(env)

    with ThreadPoolExecutor(len(envs)) as pool:
        for f in as_completed([pool.submit(work, p) for p in todo]):
            yield f.result()
            bar.update()


def backend_of(profile):
    return P.resolve_backend(profile.get("backend", "auto")).name


def sweep(params, grid, out=None, workers=None, ray=None, table="csv", timeout=1800, notebook=None):
    """The whole sweep; returns (outcomes, table path, figure path). Checks everything first."""
    if table not in ("csv", "parquet"):
        raise ValueError(f"unknown table format {table!r}: choose csv or parquet")
    params = Path(params)
    profile = P.load(params)
    g = load_grid(grid, notebook)
    check_keys(profile, g)
    pts = points(profile, g)
    envs = None if ray else slots(backend_of(profile), workers)  # a missing GPU fails here
    out = Path(out or ROOT / "outputs" / "sweeps" / f"{g.name}-{params.stem}")
    skipped = [p for p in pts if done(out / "points" / p.id, g.notebooks)]
    todo = [p for p in pts if p not in skipped]
    print(f"sweep: {len(pts)} points x {', '.join(g.notebooks)} -> {out}; {len(skipped)} already ok, skipped")
    outcomes = [Outcome(p, "skipped", 0, None, 0.0) for p in skipped]
    with tqdm(total=len(pts), initial=len(skipped), desc="sweep", unit="point") as bar:
        if ray:
            from nblib.run import raysweep  # optional dependency: only --ray needs it

            outcomes += raysweep.run(todo, g.notebooks, out, profile, ray, timeout, bar, run_point)
        else:
            outcomes += run_local(todo, g.notebooks, out, envs, timeout, bar)
    order = {p.id: i for i, p in enumerate(pts)}
    outcomes.sort(key=lambda o: order[o.point.id])
    return (outcomes, *record(out, params, g, outcomes, table))


def record(out, params, grid, outcomes, table="csv"):
    """sweep.json (every point: values, status, worker, seconds), then the table and the figure;
    returns their paths. `python -m nblib publish OUT` reads these three files."""
    write_json(
        Path(out) / "sweep.json",
        dict(
            params=runindex.shown_path(params),
            grid=dict(zip(grid.keys, grid.values)),
            notebooks=grid.notebooks,
            points=[{**o._asdict(), "point": o.point.id, "values": o.point.values} for o in outcomes],
        ),
    )
    df = sweep_table.collect(out, grid, [o.point for o in outcomes], {o.point.id: o for o in outcomes})
    return sweep_table.save(df, grid, out, table)
