"""Phase timing (nblib.core.phases), the speed table (nblib.run.benchtable) and the shared
eager references (nblib.engine.references)."""

import json

import pytest
import torch
from models import PHASES

from nblib.backends import device
from nblib.core import phases
from nblib.core.results import Results
from nblib.engine import build, references
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, run_sessions
from nblib.run import benchtable

WORKLOAD = dict(sessions=3, rounds=1, ctx_min=64, ctx_max=200, turn_ctx=64, out_min=4, out_max=6)


def test_nested_phases_are_exclusive_and_add_up_to_the_wall_time():
    clock = phases.PhaseClock()
    with clock.phase("capture"):
        sum(range(200_000))
        with clock.phase("replays"):
            sum(range(200_000))
    wall = clock.wall()
    rows = {r.name: r for r in clock.times(wall)}
    assert set(rows) == {"capture", "replays", "other"}
    assert rows["capture"].calls == rows["replays"].calls == 1
    assert sum(r.seconds for r in rows.values()) == pytest.approx(wall, abs=5e-3)


def test_unknown_phase_fails_in_one_line():
    with pytest.raises(ValueError, match="unknown phase 'replay'"), phases.PhaseClock().phase("replay"):
        pass


def test_phase_end_synchronizes_except_while_capturing():
    calls = []
    capturing = [False]
    clock = phases.PhaseClock(sync=lambda: calls.append(1), capturing=lambda: capturing[0])
    with clock.phase("timing"):
        pass
    capturing[0] = True
    with clock.phase("capture"):
        pass
    assert calls == [1]


def test_per_step_phases_never_synchronize():
    calls = []
    clock = phases.PhaseClock(sync=lambda: calls.append(1), capturing=lambda: False)
    for name in phases.PER_STEP:
        with clock.phase(name):
            pass
    assert calls == []
    with clock.phase("setup"):
        pass
    assert calls == [1]


def test_results_finish_records_the_phases(tmp_path):
    dev = device.get("sim")
    clock = phases.start()
    with clock.phase("audit"):
        sum(range(100_000))
    res = Results("01_canary", tmp_path, dev, {})
    res.finish()
    data = json.loads((tmp_path / "01_canary.results.json").read_text())
    names = [p["name"] for p in data["phases"]]
    assert names == ["audit", "other"] and data["wall_seconds"] > 0


def _records(seconds):
    phase = [dict(name="replays", seconds=seconds / 2, cpu_seconds=seconds / 2, calls=3)]
    return [dict(notebook="00_reproduce", status="ok", seconds=seconds, phases=phase)]


def test_speed_table_compares_with_the_previous_table_of_the_machine(tmp_path):
    first, folder = benchtable.build(_records(10.0), "sim", "params/ci.yaml", tmp_path)
    assert first.previous is None and first.notebooks[0].ratio is None
    old = first.model_copy(update=dict(machine=first.machine))
    (tmp_path / f"{first.machine}-old").mkdir(exist_ok=True)
    (tmp_path / f"{first.machine}-old" / "speed.json").write_text(old.model_dump_json())
    table, _ = benchtable.write(_records(25.0), "sim", "params/ci.yaml", tmp_path)
    assert table.previous == f"{first.machine}-old"
    assert table.notebooks[0].ratio == 2.5 and table.total_ratio == 2.5
    md = (folder / "speed.md").read_text()
    assert "2.50x" in md and "| 00_reproduce | ok | 25.0 |" in md


def test_the_previous_table_is_the_newest_by_its_record_not_by_its_file(tmp_path):
    """A fresh clone gives every file the checkout's time: the table's own record decides."""
    first, _ = benchtable.build(_records(10.0), "sim", "params/ci.yaml", tmp_path)
    for name, when, seconds in (
        ("newer", "2026-12-02T01:00:00+00:00", 30.0),
        ("older", "2026-12-01T01:00:00+00:00", 5.0),
    ):
        t = first.model_copy(update=dict(written=when))
        t.notebooks = [r.model_copy(update=dict(seconds=seconds)) for r in t.notebooks]
        (tmp_path / f"{first.machine}-{name}").mkdir()
        (tmp_path / f"{first.machine}-{name}" / "speed.json").write_text(
            t.model_dump_json()
        )  # older written last
    table, _ = benchtable.build(_records(15.0), "sim", "params/ci.yaml", tmp_path)
    assert table.previous == f"{first.machine}-newer" and table.notebooks[0].ratio == 0.5
    assert table.written is not None


def test_a_table_with_its_record_outranks_one_without_copied_later(tmp_path):
    """Tables from before the record have none; copied into a tree without git (the GPU machine's),
    such a table's file is the newest: the one that records when it was written still wins."""
    first, _ = benchtable.build(_records(10.0), "sim", "params/ci.yaml", tmp_path)
    recorded = first.model_copy(update=dict(written="2026-12-02T01:00:00+00:00"))
    bare = first.model_copy(update=dict(written=None))
    bare.notebooks = [r.model_copy(update=dict(seconds=99.0)) for r in bare.notebooks]
    for name, t in (("recorded", recorded), ("bare", bare)):  # the bare one written last
        (tmp_path / f"{first.machine}-{name}").mkdir()
        (tmp_path / f"{first.machine}-{name}" / "speed.json").write_text(t.model_dump_json())
    table, _ = benchtable.build(_records(15.0), "sim", "params/ci.yaml", tmp_path)
    assert table.previous == f"{first.machine}-recorded" and table.notebooks[0].ratio == 1.5


def test_speed_table_compares_only_with_a_table_of_the_same_profile(tmp_path):
    """A sim-profile run is not a regression of a ci-profile run on the same machine."""
    ci, ci_folder = benchtable.write(_records(10.0), "sim", "params/ci.yaml", tmp_path)
    sim, sim_folder = benchtable.write(_records(40.0), "sim", "params/sim.yaml", tmp_path)
    assert ci_folder != sim_folder and "-ci-" in ci_folder.name and "-sim-" in sim_folder.name
    assert sim.previous is None and sim.total_ratio is None
    (tmp_path / f"{ci.machine}-ci-earlier").mkdir()
    (tmp_path / f"{ci.machine}-ci-earlier" / "speed.json").write_text(ci.model_dump_json())
    again, _ = benchtable.write(_records(20.0), "sim", "params/ci.yaml", tmp_path)
    assert again.previous == f"{ci.machine}-ci-earlier" and again.total_ratio == 2.0


def _run(refs, overlap, seed=0):
    dev = device.get("sim")
    m = build.model(dev, PHASES, overlap=overlap)
    runner = Runner(m, [1, 2], references=refs).capture()
    w = WorkloadConfig(**WORKLOAD, concurrency=2, seed=seed)
    return run_sessions(runner, w)


def test_references_are_computed_once_per_workload_and_give_the_same_verdicts():
    refs = references.References()
    alone = _run(None, "off")
    first = _run(refs, "on")
    assert refs.hits == 0 and refs.misses == first["steps"]
    second = _run(refs, "off")  # another configuration, the same workload: every step reused
    assert refs.hits == second["steps"] and refs.misses == first["steps"]
    assert second["step_log"] == alone["step_log"]
    _run(refs, "off", seed=1)  # another workload: computed afresh
    assert refs.misses > first["steps"]


def test_a_step_with_other_inputs_is_never_looked_up():
    refs = references.References()
    dev = device.get("sim")
    m = build.model(dev, PHASES)
    runner = Runner(m, [2], "eager", references=refs)
    batch = build.full_batch(m, 2, ctx=100)
    w = WorkloadConfig(**WORKLOAD, concurrency=2)
    a = refs.get(runner, w, 0, tuple(batch))
    other = (batch.tokens + 1, batch.page_table, batch.seq_lens, batch.store_slots)
    b = refs.get(runner, w, 0, other)
    assert refs.misses == 2 and refs.hits == 0
    assert not torch.equal(a.out, b.out)


def test_references_in_a_folder_are_read_by_the_next_process_and_give_the_same_verdicts(tmp_path):
    alone = _run(None, "off")
    first = references.References(tmp_path)
    a = _run(first, "on")  # computes every step, then writes its group (run_sessions flushes)
    assert first.misses == a["steps"] and len(list(tmp_path.glob("*.pt"))) == 1
    later = references.References()  # as a later notebook's process would
    later.attach(tmp_path)
    b = _run(later, "off")
    assert later.read == a["steps"] and later.hits == b["steps"] and later.misses == 0
    assert b["step_log"] == alone["step_log"]  # the steps read back give the verdicts computing gives
    _run(later, "on", seed=1)  # another workload: computed afresh and written beside the first
    assert later.misses > 0 and len(list(tmp_path.glob("*.pt"))) == 2


def test_a_references_file_of_another_group_is_never_trusted(tmp_path):
    refs = references.References(tmp_path)
    _run(refs, "on")
    [path] = tmp_path.glob("*.pt")
    data = torch.load(path, weights_only=True)
    data["group"] = "another group"
    torch.save(data, path)
    later = references.References(tmp_path)
    run = _run(later, "on")
    assert later.read == 0 and later.misses == run["steps"]


def test_speed_table_records_the_suites_wall_time_and_lanes_beside_the_notebooks_sum(tmp_path):
    one, _ = benchtable.write(_records(30.0), "sim", "params/sim.yaml", tmp_path, wall_seconds=31.0)
    assert one.wall_seconds == 31.0 and one.lanes == 1 and one.wall_ratio is None
    two, folder = benchtable.write(
        _records(30.0), "sim", "params/sim.yaml", tmp_path / "x", wall_seconds=15.5, lanes=2
    )
    assert two.wall_seconds == 15.5 and two.lanes == 2
    (tmp_path / "x" / f"{one.machine}-one-lane").mkdir()
    (tmp_path / "x" / f"{one.machine}-one-lane" / "speed.json").write_text(one.model_dump_json())
    again, folder = benchtable.write(_records(30.0), "sim", "params/sim.yaml", tmp_path / "x", 15.5, 2)
    assert again.wall_ratio == 0.5 and again.total_ratio == 1.0  # the lanes halved the wall, not the work
    md = (folder / "speed.md").read_text()
    assert "wall time 15.5 s on 2 lane(s) (0.50x of" in md and "add up to 30.0 s" in md


def test_speed_table_compares_totals_only_over_the_notebooks_both_tables_list(tmp_path):
    """A run of some notebooks (--only) beside a whole suite: its total and wall are not a speedup."""
    phase = [dict(name="replays", seconds=1.0, cpu_seconds=1.0, calls=1)]
    suite = [dict(notebook=n, status="ok", seconds=s, phases=phase) for n, s in (("00", 10.0), ("03", 40.0))]
    whole, _ = benchtable.write(suite, "sim", "params/sim.yaml", tmp_path / "a", wall_seconds=50.0)
    (tmp_path / "b" / f"{whole.machine}-whole").mkdir(parents=True)
    (tmp_path / "b" / f"{whole.machine}-whole" / "speed.json").write_text(whole.model_dump_json())
    some, folder = benchtable.write(suite[1:], "sim", "params/sim.yaml", tmp_path / "b", wall_seconds=20.0)
    assert some.compared == ["03"] and some.total_ratio == 1.0 and some.wall_ratio is None
    md = (folder / "speed.md").read_text()
    assert "1.00x of" in md and "over the 1 notebook(s) both list: 03" in md
    same, _ = benchtable.write(suite, "sim", "params/sim.yaml", tmp_path / "b", wall_seconds=25.0)
    assert same.compared is None and same.total_ratio == 1.0 and same.wall_ratio == 0.5


def test_the_step_profile_script_times_each_path_and_compares_the_indexers_bits(tmp_path):
    """scripts/profile_gpu_steps.py on the simulator (the ci profile): three timed rows a bucket,
    and the logits with one program a request against programs filling the device, bit for bit."""
    import subprocess
    import sys

    from nblib.core.paths import ROOT

    cmd = [sys.executable, "scripts/profile_gpu_steps.py", "--params", "params/ci.yaml", "--sessions", "2"]
    cmd += ["--buckets", "1", "8", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    lines = (tmp_path / "steps.txt").read_text().splitlines()
    for b in (1, 8):
        rows = [ln for ln in lines if ln.startswith(f"bucket {b}: ")]
        assert [r.split(": ")[1].split(" row")[0] for r in rows] == ["graph", "graph", "eager"], rows
        assert all(" ms a step" in r for r in rows)
        bits = [ln for ln in lines if ln.startswith(f"bucket {b} ctx ")]
        assert bits and all(ln.endswith("same bits: True") for ln in bits), bits
