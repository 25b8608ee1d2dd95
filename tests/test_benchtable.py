"""nblib.run.benchtable: the speed table compares with the previous table of the same machine and
profile, the newest by its record, over the notebooks both tables list, and records the suite's wall
time and lanes beside the notebooks' sum."""

from nblib.run import benchtable


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
