"""The sweep on a Ray cluster: one task per grid point, `num_gpus=1` on CUDA profiles (Ray sets
each task's CUDA_VISIBLE_DEVICES). A task runs its point exactly as a local worker does
(nblib.run.sweep.run_point: a child `python -m nblib run`, one retry) in a scratch folder on
its node, then sends the point's files back; the driver writes them into its own output folder.

    python -m nblib sweep --params params/gpu.yaml --grid params/grids/policy.yaml --ray auto

`--ray auto` joins the cluster this machine belongs to (`ray start --head` first; RAY_ADDRESS is
honoured), `--ray local` starts a private one for this sweep, `--ray HOST:PORT` (or ray://...)
joins that cluster and ships this repository's code to it (outputs and .venv left behind).
"""

import tempfile
from pathlib import Path

import ray

from nblib.core.files import write_bytes
from nblib.core.paths import ROOT

SHIP_EXCLUDES = ["outputs/", ".venv/", ".git/", "**/.ipynb_checkpoints/"]


STARTUP_TIMEOUT = "timed out during startup"  # what Ray raises when its own node is late


def start_local(tries=3, **init):
    """A private Ray on this machine: ray.init(**init), tried again when the node's start runs out
    of time. Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py), which a
    machine busy with other work (a 2-core host running notebooks) can miss; Ray then raises a bare
    Exception before anything has run, and a second start usually makes it."""
    for attempt in range(tries):
        try:
            return ray.init(**init)
        except Exception as e:
            ray.shutdown()  # whatever of the late node was started
            if STARTUP_TIMEOUT not in str(e) or attempt == tries - 1:
                raise


def connect(address):
    """Join (or start) the cluster; returns its dashboard URL ("" when the dashboard is off)."""
    if ray.is_initialized():  # the caller (a test, a notebook) already started or joined one
        ctx = ray.init(ignore_reinit_error=True)
    elif address == "local":
        ctx = start_local()
    else:
        remote = address != "auto"
        runtime_env = {"working_dir": str(ROOT), "excludes": SHIP_EXCLUDES} if remote else None
        try:
            ctx = ray.init(address=address, runtime_env=runtime_env)
        except ConnectionError as e:
            raise RuntimeError(
                f"no Ray cluster at {address!r} ({e}): start one with `ray start --head`, or use --ray local"
            ) from None
    url = ctx.dashboard_url or ""
    return f"http://{url}" if url and "://" not in url else url


def _point_files(run_point, point, notebooks, timeout):
    """Inside a Ray task: run the point in a scratch folder with run_point (sweep.run_point, handed
    in so this module does not import the sweep that imports it); return (outcome, {path: bytes})."""
    with tempfile.TemporaryDirectory(prefix="nblib-point-") as d:
        where = Path(d) / point.id
        gpus = ",".join(map(str, ray.get_gpu_ids()))
        worker = f"ray node {ray.util.get_node_ip_address()}" + (f" GPU {gpus}" if gpus else "")
        outcome = run_point(point, notebooks, where, env=None, timeout=timeout, worker=worker)
        files = {
            str(f.relative_to(where)): f.read_bytes()
            for f in sorted(where.rglob("*"))
            if f.is_file() and ".references" not in f.parts
        }
    return outcome, files


def run(todo, notebooks, out, profile, address, timeout, bar, run_point):
    """Yield each point's Outcome as its task finishes, its files written under out/points/<id>/."""
    url = connect(address)
    print(f"Ray dashboard: {url}" if url else "Ray dashboard: not running (pip install 'ray[default]')")
    backend = profile.get("backend", "auto")
    gpu = backend == "cuda" or (backend == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    task = ray.remote(_point_files).options(num_gpus=1 if gpu else 0, num_cpus=1)
    pending = [task.remote(run_point, p, notebooks, timeout) for p in todo]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        outcome, files = ray.get(ready[0])
        for rel, data in files.items():
            write_bytes(Path(out) / "points" / outcome.point.id / rel, data)
        bar.update()
        yield outcome
