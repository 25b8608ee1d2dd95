"""Sweeps on the simulator: keys checked before anything runs, local workers with one retry and
resume, and the same sweep as Ray tasks on a local Ray the test starts. Points are tiny (one
notebook, the ci profile's shapes, a handful of sessions) so the whole module stays around a minute."""

import json

import pandas as pd
import pytest
import yaml
from scipy.stats import binomtest

from nblib.run import cli, sweep
from nblib.schema import params as P

TINY = {
    **P.load(P.ROOT / "params" / "ci.yaml"),
    "buckets": [1, 2],
    "workload": {**P.load(P.ROOT / "params" / "ci.yaml")["workload"], "sessions": 6, "rounds": 1},
    "index_dtypes": ["bf16"],
    "modes": ["graph"],
    "overlaps": ["on"],
    "seed_blocks": [],  # the sweep's rows come from the matrix: the protocol's other blocks add time only
}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def racy_sessions(res):
    """The headline pooled by hand from notebook 00's matrix: graph, overlap on, buckets > 1."""
    sel = [r for r in res["matrix"] if r["mode"] == "graph" and r["overlap"] == "on" and r["bucket"] > 1]
    return sum(r["corrupted_sessions"] for r in sel), sum(r["sessions"] for r in sel)


@pytest.mark.parametrize(
    "profile,grid,message",
    [
        ({}, {"notebook": "00", "grid": {"fix_target": [0.1, 0.2]}}, "'fix_target' is not a parameter of 00"),
        ({"seeds": 1}, {"notebook": "00", "grid": {"seed": [0, 1]}}, "unknown key 'seeds'"),
        ({}, {"notebook": "00", "grid": {"workload.session": [4]}}, "the profile's 'workload' has sessions"),
        ({}, {"notebook": "00", "grid": {"output_dir": ["x"]}}, "'output_dir' is not a parameter"),
        ({}, {"notebook": "00", "grid": {"index_dtypes": [["int4"]]}}, "'int4' is not one of bf16, fp8"),
        ({}, {"notebook": "00", "grid": {"workload.out_min": [99]}}, "out_min 99 is above out_max"),
        ({}, {"notebook": "09", "grid": {"seed": [0]}}, "unknown notebook '09'"),
        ({}, {"notebook": "00", "grid": {"seed": 3}}, "needs a non-empty list"),
        ({}, {"notebook": "00", "grid": {"seed": [1, 1]}}, "lists a value twice"),
    ],
)
def test_a_bad_key_or_value_fails_in_one_line_before_anything_runs(tmp_path, profile, grid, message):
    params = write(tmp_path, "p.yaml", {**TINY, **profile})
    with pytest.raises(ValueError, match=message) as e:
        sweep.sweep(params, write(tmp_path, "g.yaml", grid), out=tmp_path / "out", workers=1)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_cli_says_what_is_wrong_in_one_line(tmp_path, capsys):
    # in this process: `python -m nblib` is cli.main, and a string given to sys.exit is what the
    # interpreter prints to stderr, alone, before it exits with status 1
    params = write(tmp_path, "p.yaml", TINY)
    grid = write(tmp_path, "g.yaml", {"notebook": "00", "grid": {"timing_replays": [5]}})
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--params", str(params), "--grid", str(grid)])
    assert isinstance(e.value.code, str) and e.value.code.splitlines() == [
        "error: grid key 'timing_replays' is not a parameter of 00_reproduce: choose among backend, "
        "buckets, index_dtypes, logits_policy, model, modes, overlaps, protocol_runs, seed, seed_blocks, "
        "workload"
    ]
    assert capsys.readouterr() == ("", "")


def test_local_workers_run_retry_once_record_failures_and_resume(tmp_path):
    params = write(tmp_path, "p.yaml", TINY)
    # 3 cache pages cannot hold the sessions: the notebook itself raises, a real failure of that point
    grid = write(tmp_path, "g.yaml", {"notebook": "00", "grid": {"model.num_pages": [300, 3]}})
    out = tmp_path / "sweep"
    outcomes, table, fig = sweep.sweep(params, grid, out=out, workers=2)
    by = {o.point.values["model.num_pages"]: o for o in outcomes}
    good, bad = by[300], by[3]
    assert (good.status, good.attempts) == ("ok", 1)
    assert (bad.status, bad.attempts) == ("failed", 2) and "out of cache pages" in bad.error
    assert (out / "points" / bad.point.id / "run.log").read_text().count("--- attempt") == 2
    # a done point keeps its results, not the eager steps its notebooks shared while it ran
    assert not (out / "points" / good.point.id / ".references").exists()

    res = json.loads((out / "points" / good.point.id / "00_reproduce.results.json").read_text())
    assert res["status"] == "ok" and res["params"]["model"]["num_pages"] == 300  # the grid value arrived
    df = pd.read_csv(table)
    assert sorted(df["status"]) == ["failed", "ok"]
    row = df[df["status"] == "ok"].iloc[0]
    k, n = racy_sessions(res)
    assert (row["corrupted_sessions"], row["sessions"]) == (k, n) and n > 0
    wilson = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")  # scipy's
    assert (row["lo"], row["hi"]) == pytest.approx((wilson.low, wilson.high))
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.stat().st_size > 10_000
    saved = json.loads((out / "sweep.json").read_text())
    assert {p["point"]: p["status"] for p in saved["points"]} == {good.point.id: "ok", bad.point.id: "failed"}
    assert {p["worker"] for p in saved["points"]} == {"cpu"}

    # again, with the good point alone: it is done, so nothing runs and its results stay as they were
    before = (out / "points" / good.point.id / "00_reproduce.results.json").stat().st_mtime_ns
    again = write(tmp_path, "again.yaml", {"notebook": "00", "grid": {"model.num_pages": [300]}})
    (o,), _, _ = sweep.sweep(params, again, out=out, workers=1)
    assert (o.point.id, o.status, o.attempts) == (good.point.id, "skipped", 0)
    assert (out / "points" / good.point.id / "00_reproduce.results.json").stat().st_mtime_ns == before
    assert (out / "points" / good.point.id / "run.log").read_text().count("--- attempt") == 1


def test_the_same_sweep_as_ray_tasks_brings_every_point_back(tmp_path, capsys):
    ray = pytest.importorskip("ray")
    from nblib.run import raysweep  # imports ray

    raysweep.start_local(num_cpus=2, include_dashboard=False)  # as --ray local does, with two CPUs
    try:
        params = write(tmp_path, "p.yaml", TINY)
        grid = write(tmp_path, "g.yaml", {"notebook": "00", "grid": {"seed": [0, 1]}})
        out = tmp_path / "ray"
        outcomes, table, _ = sweep.sweep(params, grid, out=out, ray="auto", table="parquet")
    finally:
        ray.shutdown()
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert all(o.worker.startswith("ray node ") for o in outcomes)
    assert "Ray dashboard" in capsys.readouterr().out
    assert table.name == "sweep.parquet"
    df = pd.read_parquet(table)
    for o in outcomes:
        point = out / "points" / o.point.id
        res = json.loads((point / "00_reproduce.results.json").read_text())
        assert res["status"] == "ok" and res["params"]["seed"] == o.point.values["seed"]
        assert (point / "00_reproduce.ipynb").stat().st_size > 10_000  # the executed notebook came back
        row = df[df["point"] == o.point.id].iloc[0]
        assert (row["corrupted_sessions"], row["sessions"]) == racy_sessions(res)


def test_a_local_ray_whose_node_is_late_is_started_again_and_nothing_else_is(monkeypatch):
    """raysweep.start_local: Ray's fixed 30 s wait for its raylet ran out (the message Ray raises)
    -> shut down and start again, at most `tries` times; any other error -> at once."""
    pytest.importorskip("ray")
    from nblib.run import raysweep

    calls, shutdowns = [], []
    late = Exception("The current node timed out during startup. This could happen because ...")

    def init(errors):
        def fake(**kw):
            calls.append(kw)
            if errors:
                raise errors.pop(0)
            return "ctx"

        return fake

    monkeypatch.setattr(raysweep.ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(raysweep.ray, "init", init([late]))
    assert raysweep.start_local(num_cpus=2) == "ctx" and len(calls) == 2 and len(shutdowns) == 1
    assert calls[0] == {"num_cpus": 2}
    calls.clear()
    monkeypatch.setattr(raysweep.ray, "init", init([late, late, late]))
    with pytest.raises(Exception, match="timed out during startup"):
        raysweep.start_local(tries=3)
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(raysweep.ray, "init", init([ValueError("bad address")]))
    with pytest.raises(ValueError, match="bad address"):
        raysweep.start_local()
    assert len(calls) == 1
