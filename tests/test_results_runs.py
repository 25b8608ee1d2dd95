"""docs/results.md's sweep and suite-speed sections, from files written the way the sweep and the
speed table write them."""

import json

import pandas as pd

from nblib.publish import results_runs


def _sweep(root):
    folder = root / "outputs" / "sweeps" / "demo"
    folder.mkdir(parents=True)
    common = dict(notebook="00_reproduce", device="NVIDIA H200", commit="097b0ba6c5f7", seed=0)
    limits = dict(cannot_show="the eager clean check")
    rows = [
        dict(point="00aa", logits_policy="transient", attempts=1, worker="GPU 0", status="ok", **limits,
             arm="bf16 graph overlap on", corrupted_sessions=27, sessions=160, lo=0.119, hi=0.234),
        dict(point="00bb", logits_policy="persistent", attempts=2, worker="GPU 1", status="failed", **limits,
             arm=None, corrupted_sessions=None, sessions=None, lo=None, hi=None),
    ]  # fmt: skip
    cols = ["point", "seed", "logits_policy", "attempts", "worker", "notebook", "status", "device", "commit"]
    rows = [{**common, **r} for r in rows]
    df = pd.DataFrame(rows)
    df = df[cols + [c for c in df.columns if c not in cols]]
    df.to_csv(folder / "sweep.csv", index=False)
    points = [dict(point=r["point"], status=r["status"], worker=r["worker"],
                   values=dict(seed=0, logits_policy=r["logits_policy"])) for r in rows]  # fmt: skip
    record = dict(params="params/gpu.yaml", grid=dict(seed=[0], logits_policy=["transient", "persistent"]),
                  notebooks=["00_reproduce"], points=points)  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(record))


def test_a_sweep_reads_as_its_knobs_its_limits_and_a_row_per_point(tmp_path):
    _sweep(tmp_path)
    [block] = results_runs.sweeps(tmp_path)
    head = "`outputs/sweeps/demo/`: NVIDIA H200, commit 097b0ba, notebook 00_reproduce"
    assert block.title.startswith(head)
    assert "cannot test: the eager clean check (the rate, not the verdict)" in block.title
    lines = block.body.splitlines()
    assert lines[2] == (
        "| 00aa | seed 0, logits_policy transient | bf16 graph overlap on | 27/160 [11.9%, 23.4%] | GPU 0 |"
    )
    assert lines[3] == "| 00bb | seed 0, logits_policy persistent | - | failed | GPU 1 |"


def test_a_speed_table_of_some_notebooks_says_what_its_ratio_covers(tmp_path):
    folder = tmp_path / "outputs" / "bench-suite" / "gpu-x-abc"
    folder.mkdir(parents=True)
    nb = [dict(notebook="03_stream_overlap", status="ok", seconds=95.3, cpu_seconds=1.0, phases={})]
    table = dict(machine="gpu", commit="097b0ba6c5f7", profile="params/gpu.yaml", total_seconds=95.3,
                 notebooks=nb, previous="gpu-old", total_ratio=0.3, wall_seconds=96.0, lanes=1,
                 compared=["03_stream_overlap"])  # fmt: skip
    (folder / "speed.json").write_text(pd.Series(table).to_json())
    row = results_runs.suite_speeds(tmp_path).splitlines()[2]
    assert row == (
        "| `gpu-x-abc/` | gpu | params/gpu.yaml | 097b0ba | 03 | 95.3 | 96.0 on 1 lane(s) "
        "| 0.30x of `gpu-old` (over 1 notebooks both list) |"
    )


def test_a_bench_folders_notes_take_the_commit_from_its_name_whatever_follows_it():
    from nblib.publish import results_figures as rf

    names = ("h200-b6db959-topk", "h200-a80b02c", "h200-28675cc-badrows", "h200-notes")
    assert [rf._folder_commit(n) for n in names] == ["b6db959", "a80b02c", "28675cc", "h200-notes"]
    notes = rf.bench_notes(rf.ROOT / "outputs" / "bench")
    assert {n.commit for n in notes if "/h200-b6db959-topk/" in n.path} == {"b6db959"}
