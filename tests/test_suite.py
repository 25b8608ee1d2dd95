"""nblib.run.suite: the lane plan (a notebook that reads another's results runs after it, in the same
lane; 05 last), each lane's environment and GPU; a failed notebook is marked failed and earlier
results stay; a profile for a missing backend fails before anything runs; a bench run's fresh
references; a SIGTERM or a time limit stops the run and marks the notebook in flight failed; the
output folder; the note on a GPU the profile was not tuned on."""

import json
import shutil
import types

import pytest
import yaml

from nblib.core.paths import ROOT
from nblib.run import errors, suite
from nblib.schema import params as P

CI = P.ROOT / "params" / "ci.yaml"

NOTEBOOKS = list(suite.NOTEBOOKS)


def _lane_of(plan, name):
    [lane] = [lane for lane in plan if name in lane]
    return lane


@pytest.mark.parametrize("lanes", [2, 3, 8])
def test_03_runs_after_00_in_the_same_lane(lanes):
    lane = _lane_of(suite.lane_plan(NOTEBOOKS, lanes), "03_stream_overlap")
    assert lane.index("00_reproduce") < lane.index("03_stream_overlap")


def test_the_plan_names_what_03_reads():
    assert suite.NEEDS == {"03": "00"}


def test_each_needer_follows_its_need_in_the_lane_that_holds_the_need():
    lanes = (("a", "c"), ("b",))
    assert suite.with_needs(lanes, {"x": "a", "y": "b"}) == (("a", "x", "c"), ("b", "y"))


def test_lanes_without_needs_stay_as_given():
    assert suite.with_needs((("a", "b"), ("c",)), {}) == (("a", "b"), ("c",))


def test_a_failed_notebook_is_marked_failed_and_earlier_results_stay(ci_suite, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(ci_suite, out)
    bad = tmp_path / "bad.yaml"
    # a profile the schema accepts but the engine cannot run: too few cache pages for the sessions
    prof = {k: v for k, v in P.load(CI).items()}
    bad.write_text(yaml.safe_dump({**prof, "model": {**prof["model"], "num_pages": 4}}))
    with pytest.raises(errors.NotebookFailed, match="00_reproduce failed: cell .*out of cache pages"):
        suite.run(bad, out, only=["00"])
    index = json.loads((out / "index.json").read_text())["notebooks"]
    rec = index[0]
    assert rec["status"] == "failed" and "out of cache pages" in rec["error"]
    assert [r["status"] for r in index[1:]] == ["ok"] * (len(suite.NOTEBOOKS) - 1)  # earlier results stay
    assert "failed" in (out / "index.html").read_text()


def test_profile_for_a_missing_backend_fails_before_running(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="use backend 'sim'"):
        suite.run(P.ROOT / "params" / "gpu.yaml", tmp_path)
    assert not any(tmp_path.iterdir())


def test_lanes_keep_03_after_00_and_leave_05_for_last():
    nbs = list(suite.NOTEBOOKS)
    plan = suite.lane_plan(nbs, 2)
    assert plan == [
        ["00_reproduce", "03_stream_overlap", "06_audit_your_engine", "07_method_on_your_engine"],
        ["01_canary", "02_graph_vs_eager", "04_persistent_buffer_fix"],
    ]
    assert suite.lane_plan(nbs, 1) == [] and suite.lane_plan(nbs, 8) == plan  # more lanes than LANES
    assert suite.lane_plan(["00_reproduce", "05_report"], 2) == []  # one busy lane: plain run
    with pytest.raises(ValueError, match="--lanes must be a positive integer"):
        suite.lane_plan(nbs, 0)


def test_each_lane_gets_its_share_of_the_cores_for_torchs_threads_and_its_gpu():
    two = suite.lane_env({"PATH": "/bin"}, None, lanes=2, cores=2)
    assert two["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in two and two["PATH"] == "/bin"
    assert suite.lane_env({}, "1", lanes=2, cores=16)["OMP_NUM_THREADS"] == "8"
    assert suite.lane_env({}, "1", lanes=2, cores=16)["CUDA_VISIBLE_DEVICES"] == "1"
    assert suite.lane_env({}, None, lanes=4, cores=2)["OMP_NUM_THREADS"] == "1"  # never 0
    assert suite.lane_env({"OMP_NUM_THREADS": "3"}, None, 2, 2)["OMP_NUM_THREADS"] == "3"  # the user's


def test_auto_lanes_are_one_per_core_on_the_simulator_and_one_per_gpu_on_cuda(monkeypatch):
    from nblib.backends import device

    monkeypatch.setattr(suite.os, "cpu_count", lambda: 1)
    assert suite.resolve_lanes("auto", "sim") == 1
    monkeypatch.setattr(suite.os, "cpu_count", lambda: 16)
    assert suite.resolve_lanes("auto", "sim") == len(suite.LANES)
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    assert suite.resolve_lanes("auto", "cuda") == 1  # 16 cores, one GPU: one lane
    assert suite.resolve_lanes(3, "cuda") == 3  # a number stays as given


def test_lanes_ask_for_one_gpu_each_before_running(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="--lanes 2 needs 2 GPUs, this machine has 1: pass --lanes 1"):
        suite._lane_gpus(type("Dev", (), {"name": "cuda"})(), 2)
    assert suite._lane_gpus(type("Dev", (), {"name": "sim"})(), 2) == [None, None]


def test_a_bench_run_drops_the_stored_eager_steps_and_a_plain_run_keeps_them(tmp_path, monkeypatch):
    """A speed table must time what a first run computes: eager steps an earlier run of the same
    source stored in the folder would make the references phase look free."""
    ran = []
    monkeypatch.setattr(suite, "_run_each", lambda notebooks, *a: ran.append(list(notebooks)) or [])
    store = tmp_path / "run" / ".references" / "digest"
    for fresh, kept in ((False, True), (True, False)):
        store.mkdir(parents=True, exist_ok=True)
        (store / "steps.pt").write_bytes(b"x")
        suite.run(P.ROOT / "params" / "ci.yaml", tmp_path / "run", ["05"], lanes=1, fresh=fresh)
        assert store.exists() == kept
    assert ran == [["05_report"], ["05_report"]]


def test_a_sigterm_inside_one_of_the_event_loops_tasks_stops_the_run():
    """papermill waits in an asyncio loop; SIGTERM lands in whichever task is running. There the
    suite's stop must come out of the loop, not stay as that task's result, which nothing reads,
    while the notebook runs on to the end (seen once as a run that finished ok after SIGTERM)."""
    import asyncio
    import os
    import signal

    from nblib.run import suite

    async def side():  # nbclient's output poll, say: the handler runs inside this task's step
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0)

    tasks = []

    async def cell():
        tasks.append(asyncio.ensure_future(side()))
        await asyncio.sleep(0.5)
        return "ran on"

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(errors.Interrupted, match="stopped by signal 15"), suite.stop_on_sigterm():
            loop.run_until_complete(cell())
    finally:
        loop.close()
    assert isinstance(tasks[0].exception(), errors.Stopped)  # read: asyncio logs an unread one


def test_a_notebook_stopped_by_a_time_limit_is_marked_failed(tmp_path):
    """`timeout` (SIGTERM) around a run: the notebook in flight is recorded failed, saying why."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "nblib", "run", "--params", str(CI), "--out", str(out), "--only", "00"]
    p = subprocess.Popen(cmd, cwd=P.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "00_reproduce.results.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the notebook has started once its results.json says "running"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "stopped by signal 15" in err
    rec = json.loads((out / "index.json").read_text())["notebooks"][0]
    assert rec["notebook"] == "00_reproduce" and rec["status"] == "failed"
    assert "stopped by signal 15" in rec["error"]


def test_output_dir_is_printed_and_resolved(tmp_path):
    assert suite.output_dir(CI, tmp_path / "x") == (tmp_path / "x").resolve()
    assert suite.output_dir(CI) == ROOT / "outputs" / "ci"


def gpu(name):
    return types.SimpleNamespace(name="cuda", device_name=lambda: name)


def test_the_gpu_profile_on_another_gpu_prints_how_to_tune_it():
    note = suite.tuning_note(ROOT / "params" / "gpu.yaml", gpu("NVIDIA A100-SXM4-80GB"))
    assert note == (
        "note: params/gpu.yaml was tuned on an NVIDIA H200 and this GPU is NVIDIA A100-SXM4-80GB; "
        "`python -m nblib window --params params/gpu.yaml` tunes it for this GPU"
    )
    assert suite.tuning_note(ROOT / "params" / "gpu.yaml", gpu("NVIDIA H200")) is None
    assert suite.tuning_note(ROOT / "params" / "local-nvidia-a100.yaml", gpu("NVIDIA A100")) is None
    sim = types.SimpleNamespace(name="sim", device_name=lambda: "CPU simulator")
    assert suite.tuning_note(ROOT / "params" / "gpu.yaml", sim) is None


class Stop(Exception):
    """Raised where the run would next need a GPU, so the test stops before anything runs."""


def test_the_run_prints_the_note_before_anything_runs(tmp_path, monkeypatch, capsys):
    gpu_yaml = ROOT / "params" / "gpu.yaml"
    monkeypatch.setattr(P, "resolve_backend", lambda name: gpu("NVIDIA L40S"))

    def stop(dev, n):
        raise Stop

    monkeypatch.setattr(suite, "_lane_gpus", stop)
    with pytest.raises(Stop):
        suite.run(gpu_yaml, tmp_path / "out", lanes=2)
    assert capsys.readouterr().out == suite.tuning_note(gpu_yaml, gpu("NVIDIA L40S")) + "\n"
    assert not (tmp_path / "out").exists()
