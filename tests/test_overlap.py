"""Notebook 03 reuses notebook 00's replays only when they are the same runs it would make; its hazard
table is every racy configuration's hazards, each after its configuration."""

from types import SimpleNamespace

import pytest

from nblib.studies import overlap

MODEL = {"heads": 4, "dim": 128}
WORKLOAD = {"sessions": 4, "rounds": 1}
COUNTS = dict(
    corrupted_sessions=1, sessions=4, steps=8, corrupted_steps=1, tail_steps=2, tail_corrupted_steps=0
)
RATES = dict(session_rate=0.25, session_lo=0.05, session_hi=0.7, step_rate=0.125, step_lo=0.02, step_hi=0.5)
ROWS = [
    dict(index_dtype="bf16", mode="graph", overlap="on", bucket=2, **COUNTS, buckets_replayed=[2], **RATES),
    dict(index_dtype="bf16", mode="eager", overlap="on", bucket=2, **COUNTS, buckets_replayed=[2], **RATES),
]


def _reproduced(**change):
    r = dict(
        status="ok",
        commit="abc",
        params=dict(
            model=MODEL,
            buckets=[1, 2],
            workload=WORKLOAD,
            seed=0,
            logits_policy="transient",
            modes=["graph", "eager"],
            index_dtypes=["bf16", "fp8"],
            overlaps=["on", "off"],
        ),
        matrix=ROWS,
    )
    r.update(change)
    return overlap.Reproduced.model_validate(r)


def _read(reproduced, model=MODEL, policy="transient"):
    wl = {**WORKLOAD, "seed": 0}
    return overlap.measured_matrix(reproduced, model, [1, 2], wl, ["bf16"], ["on", "off"], policy)


@pytest.fixture
def at_commit(monkeypatch):
    monkeypatch.setenv("NBLIB_COMMIT", "abc")


def test_the_same_commit_and_parameters_give_00s_graph_rows(at_commit):
    assert _read(_reproduced()) == ROWS[:1]


@pytest.mark.parametrize(
    "change",
    [dict(status="running"), dict(commit="def"), dict(params=dict(model=MODEL))],
    ids=["not finished", "another commit", "other parameters"],
)
def test_any_difference_means_replay(at_commit, change):
    assert _read(_reproduced(**change)) is None


def test_other_model_or_policy_or_no_run_means_replay(at_commit):
    assert _read(None) is None
    assert _read(_reproduced(), model={**MODEL, "heads": 8}) is None
    assert _read(_reproduced(), policy="persistent") is None


def test_an_unknown_commit_is_never_taken_for_the_same(monkeypatch):
    monkeypatch.setenv("NBLIB_COMMIT", "unknown")
    monkeypatch.setattr(overlap.results, "commit", lambda: "unknown")
    assert _read(_reproduced(commit="unknown")) is None


HAZARD = dict(
    kind="read-after-write", first_op="aten::mm", first_stream="main", first_tensor="a", first_site="f.py:1",
    second_op="aten::topk", second_stream="side", second_tensor="b", second_site="f.py:2", addr="0x100",
    nbytes=64, reused=True, first_alloc="f.py:3", first_free="f.py:4", second_alloc="f.py:5",
    second_free="-", pairs=2,
)  # fmt: skip


def _report(rows):
    return SimpleNamespace(ok=not rows, rows=lambda: rows)


def test_the_hazard_table_has_each_racy_configurations_rows_after_its_configuration():
    reports = {
        ("transient", "bf16", "on"): _report([dict(bucket=8, **HAZARD), dict(bucket=24, **HAZARD)]),
        ("persistent", "bf16", "on"): _report([]),
    }
    rows = [h.model_dump() for h in overlap.hazard_rows(reports)]
    where = dict(logits_policy="transient", index_dtype="bf16", overlap="on")
    assert rows == [{**where, "bucket": 8, **HAZARD}, {**where, "bucket": 24, **HAZARD}]
    assert list(rows[0])[:5] == ["logits_policy", "index_dtype", "overlap", "bucket", "kind"]


def test_a_hazard_row_with_a_field_the_model_does_not_know_fails():
    with pytest.raises(ValueError, match="surprise"):
        overlap.hazard_rows({("transient", "bf16", "on"): _report([dict(bucket=8, surprise=1, **HAZARD)])})


def _graph_row(agree=True, hazards=1, confirmed=1, missed=0, bucket=8, error=None):
    row = dict(logits_policy="transient", index_dtype="bf16", overlap="on", bucket=bucket)
    if error:
        return dict(row, agree=None, error=error)
    return dict(row, hazards=hazards, source="CUDA driver", confirmed=confirmed, missed=missed, agree=agree)


def test_the_graph_verdict_names_a_disagreement_and_a_blocked_route():
    zoo = [dict(right=True, graph_agrees=True, graph_error="")]
    ok = overlap.graph_verdict([_graph_row(), _graph_row(hazards=0, confirmed=0, bucket=2)], zoo)
    assert ok.startswith("the graphs as built (CUDA driver) agree with the audit in 2 of 2")
    assert "DISAGREE" not in ok
    bad = overlap.graph_verdict([_graph_row(agree=False, missed=3, bucket=24)], zoo)
    assert "in 0 of 1 forked" in bad and "3 unordered" in bad
    assert "DISAGREE at transient/bf16/bucket 24" in bad
    blocked = overlap.graph_verdict([_graph_row(error="cuGraphGetEdges returned 1")], zoo)
    assert "none read" in blocked and "Reading the graph failed: cuGraphGetEdges returned 1" in blocked


def test_the_hazard_told_first_is_in_the_bucket_whose_replays_corrupted_most():
    hz = {b: SimpleNamespace(label={"capture": 0, "bucket": b}) for b in (48, 24, 32)}
    report = SimpleNamespace(hazards=[hz[48], hz[24], hz[32]])
    key = ("transient", "bf16", "on")

    def row(bucket, k, policy="transient"):
        return dict(
            logits_policy=policy, index_dtype="bf16", overlap="on", bucket=bucket, corrupted_sessions=k
        )

    rows = [row(24, 22), row(32, 4), row(48, 0), row(32, 30, policy="persistent")]
    assert overlap.telling_hazard(report, rows, key) is hz[24]
    assert overlap.telling_hazard(report, [row(24, 0), row(32, 4)], key) is hz[32]
    # no replay corrupted (or none in a bucket with a hazard): the first hazard, a latent race
    assert overlap.telling_hazard(report, [row(24, 0), row(8, 5)], key) is hz[48]
