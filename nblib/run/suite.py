"""The main job: execute the notebooks headlessly with papermill, render each to HTML with the
code hidden, and write an index page with every notebook's verdict.

A notebook counts as done only when its results.json says status "ok" (its last cell writes that):
papermill's own success is not enough, since a cell timeout leaves no error in the notebook.
A failed notebook stops the run, is marked failed with its failing cell, and earlier results stay.

With lanes (`--lanes N`), notebooks 00 to 04 run in N processes side by side, one GPU each on CUDA
(CUDA_VISIBLE_DEVICES), so the H200 suite finishes in about half the time on a two-GPU machine; each lane's
notebooks still run in order, and 05 runs last because it reads every result.
"""

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import papermill as pm
from tqdm.auto import tqdm

from nblib.core.paths import NOTEBOOK_DIR, NOTEBOOKS, ROOT
from nblib.publish import runindex
from nblib.run import warm as warm_kernel
from nblib.run.errors import Interrupted, LaneFailed, NotebookFailed, Stopped
from nblib.schema import params as P

# Which notebook reads which one's results in the same output folder: notebook 03 reads 00's
# (nblib.schema.results.load_if_any) and reuses its replays when they ran on the same commit with the
# same parameters (nblib.studies.overlap.measured_matrix). 05 reads every result: it runs after the lanes.
NEEDS: dict[str, str] = {"03": "00"}


def with_needs(lanes: tuple[tuple[str, ...], ...], needs: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """Each lane with every notebook that needs one of its notebooks right after that one, so a lane runs
    what a notebook reads before the notebook itself."""
    after = lambda n: tuple(m for m, need in needs.items() if need == n)
    return tuple(tuple(x for n in lane for x in (n, *after(n))) for lane in lanes)


# two lanes of about the same length on the simulator's 2-core machine (00 and 03 against 01, 02 and 04)
LANES = with_needs((("00", "06", "07"), ("01", "02", "04")), NEEDS)


def available(only=None):
    """The notebooks to run, in order; an unknown --only prefix fails here, before anything exists."""
    nbs = [n for n in NOTEBOOKS if (NOTEBOOK_DIR / f"{n}.ipynb").exists()]
    if only:
        unknown = [o for o in only if not any(n.startswith(o) for n in NOTEBOOKS)]
        if unknown:
            raise ValueError(f"unknown notebook {unknown[0]!r}: choose among {', '.join(NOTEBOOKS)}")
        nbs = [n for n in nbs if any(n.startswith(o) for o in only)]
    return nbs


def output_dir(params_path=None, out=None):
    """Where a run writes: --out, else outputs/<profile name>."""
    params_path = Path(params_path or P.default_profile())
    return Path(out or ROOT / "outputs" / params_path.stem).resolve()


def run(params_path=None, out=None, only=None, timeout=1800, lanes=1, fresh=False):
    """Execute the suite; returns the list of per-notebook records written to index.json.
    Everything that can be checked is checked before the output folder is created: the notebook
    selection, the whole profile against the schema, the backend, and the GPUs the lanes need.
    fresh: first drop the eager steps an earlier run of the same source stored in the folder
    (its .references), so the run computes what a first run computes (a speed table's run)."""
    notebooks = available(only)
    params_path = Path(params_path or P.default_profile())
    profile = P.load(params_path)  # one line naming the bad key, before anything runs
    dev = P.resolve_backend(profile["backend"])  # a missing GPU fails here, in one line
    note = tuning_note(params_path, dev)
    if note:
        print(note)
    lanes = resolve_lanes(lanes, dev.name)
    plan = lane_plan(notebooks, lanes)
    gpus = _lane_gpus(dev, len(plan)) if len(plan) > 1 else []
    out = output_dir(params_path, out)
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        shutil.rmtree(out / ".references", ignore_errors=True)
    print(f"suite: {len(notebooks)} notebook(s), profile {params_path}, outputs in {out}")
    first = None
    if len(plan) > 1:
        notebooks = [n for n in notebooks if not any(n in lane for lane in plan)]
        first = _lanes_then_warm(plan, gpus, params_path, out, timeout, notebooks)
    with stop_on_sigterm():
        # the kernel started during the lanes is _run_each's from here on: it closes it
        return _run_each(notebooks, profile, params_path, out, timeout, first) or runindex.load_index(out)


def _lanes_then_warm(plan, gpus, params_path, out, timeout, rest):
    """The lanes, with the kernel of the first notebook after them (05) started and importing
    while they run: the parent only waits on the lanes, and that kernel's start and imports (about
    7 s on the 2-core machine) would otherwise follow the last lane. Returns that kernel (None
    when there is no notebook after the lanes or it could not start); closed if a lane fails."""
    first = _warm(rest[0]) if rest else None
    try:
        _run_lanes(plan, gpus, params_path, out, timeout)
    except BaseException:
        if first is not None:
            first.close()
        raise
    return first


# seconds a notebook waits for its warm kernel's imports before it runs without their check
WARM_WAIT = 300
TUNED_ON = "H200"  # the GPU params/gpu.yaml's trunk depth was measured on


def tuning_note(params_path, dev):
    """One line when the gpu profile runs on a CUDA GPU other than the one it was tuned on: the race
    is intermittent at a trunk depth set by the GPU's timing, so there it lies elsewhere."""
    if dev.name != "cuda" or Path(params_path).resolve() != (ROOT / "params" / "gpu.yaml").resolve():
        return None
    name = dev.device_name()
    if TUNED_ON in name:
        return None
    return (
        f"note: params/gpu.yaml was tuned on an NVIDIA {TUNED_ON} and this GPU is {name}; "
        "`python -m nblib window --params params/gpu.yaml` tunes it for this GPU"
    )


@contextlib.contextmanager
def stop_on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(f"stopped by signal {signum} (a time limit?) before the notebook finished")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except Stopped as e:  # out of papermill's loop: from here on, a SuiteError like any other
        raise Interrupted(str(e.code)) from None
    finally:
        signal.signal(signal.SIGTERM, old)


def kernels_ahead(cores=None):
    """How many notebooks' kernels start ahead of the one running: one where the host has fewer
    than 8 cores (on two, a second kernel importing beside the notebook only shares its cores),
    else two, so a notebook shorter than its successor's imports (05 before 06, whose kernel
    imports transformers) does not leave that kernel to finish them on the clock."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if cores < 8 else 2


def _run_each(notebooks, profile, params_path, out, timeout, first=None):
    """Each notebook in turn, the next ones' kernels started ahead; first: the first notebook's
    kernel when it was started earlier (_lanes_then_warm)."""
    records = None
    bar = tqdm(notebooks, desc="suite", unit="nb")
    # kernels started for the notebooks after the one running
    ahead = collections.deque([] if first is None else [first])
    started = len(ahead)

    def start_upto(n):  # the kernels of notebooks[:n], those not started yet
        nonlocal started
        while started < min(n, len(notebooks)):
            ahead.append(_warm(notebooks[started]))
            started += 1

    try:
        start_upto(1)
        if ahead and ahead[0] is not None:
            # the first kernel's imports before the next one's start: at once, the two would share
            # the cores for nothing (the first notebook waits for its own imports either way)
            ahead[0].ready()
        n_ahead = kernels_ahead()
        for i, name in enumerate(bar):
            bar.set_postfix_str(name)
            # the next notebooks' kernels start and import while this one runs (nblib.run.warm);
            # started before this one's leaves the queue, so an interrupt here still closes it
            start_upto(i + 1 + n_ahead)
            kernel = ahead.popleft()
            rec, records = _run_one(name, kernel, profile, params_path, out, timeout)
            if rec["status"] != "ok":
                bar.close()
                raise NotebookFailed(
                    f"{name} failed: {rec['error']}\n(executed copy: {out / f'{name}.ipynb'}; "
                    f"earlier results kept in {out})"
                )
    finally:
        for kernel in ahead:
            if kernel is not None:
                kernel.close()
    return records


def _warm(name):
    try:
        return warm_kernel.WarmKernel(NOTEBOOK_DIR / f"{name}.ipynb", ROOT)
    except Exception:  # no kernel ahead: papermill starts its own, and says why if it cannot
        return None


def _run_one(name, kernel, profile, params_path, out, timeout):
    """Execute one notebook (in `kernel`, a WarmKernel, when it is alive), record it; returns the
    record and the index's records."""
    dest = out / f"{name}.ipynb"
    rec = dict(notebook=name, status="failed", html=f"{name}.html", error=None)
    t0 = time.perf_counter()
    # each notebook gets the keys it declares, defaults applied, so results.json records them
    values = {k: v for k, v in profile.items() if k in P.DECLARES[name]}
    extra = dict(km=kernel.km) if kernel is not None and kernel.alive() else {}
    # the warm-up checked every import statement, a panel's under `if INTERACTIVE:` too: one that
    # fails fails the notebook here, before its heavy cells run (nblib.run.warm)
    if extra and kernel.ready(WARM_WAIT) and kernel.failure():
        rec["error"] = f"{name}: {kernel.failure()}"
    try:
        if rec["error"] is None:
            pm.execute_notebook(
                str(NOTEBOOK_DIR / f"{name}.ipynb"),
                str(dest),
                parameters={**values, "output_dir": str(out)},
                cwd=str(ROOT),
                progress_bar=False,
                execution_timeout=timeout,
                kernel_name="python3",
                **extra,
            )
    except Exception as e:  # papermill raises PapermillExecutionError with the cell
        rec["error"] = _describe(e)
    except Stopped as e:
        rec["error"] = str(e)
    finally:
        if kernel is not None:
            kernel.close()
    res = _results(out, name)
    if rec["error"] is None and res.get("status") != "ok":
        rec["error"] = f"results.json says status {res.get('status')!r}: the notebook did not finish"
    rec.update(
        status="ok" if rec["error"] is None else "failed",
        seconds=round(time.perf_counter() - t0, 1),
        verdict=res.get("verdict"),
        backend=res.get("backend"),
        device=res.get("device"),
        commit=res.get("commit"),
        wall_seconds=res.get("wall_seconds"),  # setup to finish, inside the kernel
        phases=res.get("phases") or [],
    )
    if dest.exists():
        rec["phases"] = rec["phases"] + [runindex.render_html(dest, out / rec["html"]).model_dump()]
    return rec, runindex.record(out, rec, runindex.shown_path(params_path))


def lane_plan(notebooks, lanes):
    """The notebooks each lane runs, in order: LANES folded onto `lanes` processes (lane i on
    process i mod lanes), keeping only the selected notebooks; what no lane holds (05) runs after
    them. One lane (or fewer than two non-empty ones): [], the plain sequential run."""
    if not isinstance(lanes, int) or lanes < 1:
        raise ValueError(f"--lanes must be a positive integer, got {lanes!r}")
    plan = [[] for _ in range(min(lanes, len(LANES)))]
    for i, lane in enumerate(LANES):
        plan[i % len(plan)] += [n for n in notebooks if n[:2] in lane]
    plan = [sorted(p, key=notebooks.index) for p in plan if p]
    return plan if len(plan) > 1 else []


def resolve_lanes(lanes, backend):
    """--lanes as a number: "auto" is one lane per GPU on CUDA, one per CPU core on the simulator
    (whose notebooks run on one core each), at most len(LANES)."""
    if lanes != "auto":
        return lanes
    if backend == "cuda":
        from nblib.backends import device  # lazily: it imports torch

        have = device.gpu_count()
    else:
        have = os.cpu_count() or 1
    return max(1, min(len(LANES), have))


def _lane_gpus(dev, n):
    """One GPU per lane on CUDA (a lane's timings and races need its GPU to itself); none on the
    simulator, whose time is simulated, so lanes only share the CPU."""
    if getattr(dev, "name", "") != "cuda":
        return [None] * n
    from nblib.backends import device  # lazily: it imports torch

    have = device.gpu_count()
    if have < n:
        raise ValueError(f"--lanes {n} needs {n} GPUs, this machine has {have}: pass --lanes {have or 1}")
    return [str(i) for i in range(n)]


def lane_env(environ, gpu, lanes, cores):
    """A lane's environment: its GPU, and its share of the CPU's cores for torch's threads
    (OMP_NUM_THREADS, unless already set). Otherwise torch's CPU ops take a thread per core in
    every lane: on the 2-core machine, two lanes' four threads on two cores."""
    env = dict(environ, TQDM_DISABLE="1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // lanes)))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _run_lanes(plan, gpus, params_path, out, timeout):
    """Each lane as `python -m nblib run --only ...` in its own process (and GPU), side by side;
    its log in out/lane-<i>.log. Every lane runs to its end; then a failed one stops the suite."""
    procs = []
    for i, (lane, gpu) in enumerate(zip(plan, gpus)):
        env = lane_env(os.environ, gpu, len(plan), os.cpu_count() or 1)
        cmd = [sys.executable, "-m", "nblib", "run", "--params", str(params_path), "--out", str(out)]
        cmd += ["--timeout", str(timeout), "--only", *(n[:2] for n in lane)]
        log = out / f"lane-{i}.log"
        print(f"lane {i}{'' if gpu is None else f' (GPU {gpu})'}: {' '.join(lane)}, log {log}")
        with open(log, "w") as f:  # the child holds its own copy of the descriptor
            proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append((i, log, proc))
    failed = []
    for i, log, proc in procs:
        rc = proc.wait()
        print(f"lane {i}: rc {rc}")
        if rc != 0:
            last = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
            failed.append(f"lane {i} (log {log}): {last}")
    if failed:
        lines = "\n".join(failed)
        raise LaneFailed(f"a lane failed, 05 not run:\n{lines}\n(earlier results kept in {out})")


def _describe(e):
    cell = getattr(e, "exec_count", None)
    ename, evalue = getattr(e, "ename", type(e).__name__), getattr(e, "evalue", str(e))
    return f"cell {cell}: {ename}: {evalue}" if cell is not None else f"{ename}: {evalue}"


def _results(out, name):
    path = out / f"{name}.results.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
