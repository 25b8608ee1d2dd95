"""The graph-vs-eager differential on the simulator: a planted logits mismatch is caught; clean is clean."""

import pytest
import torch
from models import CANARY, CANARY_WORKLOAD

from nblib.backends import device
from nblib.engine import build
from nblib.engine.build import full_batch
from nblib.engine.runner import Runner
from nblib.instruments import gediff
from nblib.instruments.gediff import GEDiff


def _captured(bucket=2):
    dev = device.get("sim")
    m = build.model(dev, CANARY, overlap="off")
    gd = GEDiff(m)
    runner = Runner(m, [bucket]).capture()
    args = full_batch(m, bucket)
    runner.run(*args)
    return m, gd, runner, args


def test_clean_replay_agrees_then_a_planted_mismatch_is_caught():
    m, gd, runner, args = _captured()
    rec = gd.compare(2, rows=2)
    assert not rec["diverged"] and rec["max_abs"] == 0
    logits = gd.stash[2]["logits"]
    top = set(gd.recompute(2)[0].topk(m.cfg.topk).indices.tolist())
    j = next(t for t in range(int(args[2][0])) if t not in top)
    logits[0, j] = 1e30  # the plant: one entry of row 0 jumps to the top
    rec = gd.compare(2, rows=2)
    assert rec["diverged"] and rec["max_abs"] > 1e29
    assert (rec["argmax_rows"], rec["topk_rows"]) == (1, 1)
    assert len(gd.lines) == 2 and "argmax differs 1/2" in gd.lines[-1]
    assert gd.table()[0]["diverged"] == 1


def test_replay_refreshes_the_stash():
    m, gd, runner, args = _captured()
    gd.stash[2]["logits"].fill_(7.0)  # stale stash...
    runner.run(*args)  # ...overwritten by the captured clone
    assert not gd.compare(2, rows=2)["diverged"]


def test_unknown_bucket_names_the_captured_ones():
    m, gd, runner, args = _captured()
    with pytest.raises(KeyError, match=r"bucket 4.*\[2\]"):
        gd.lookup(4)
    with pytest.raises(ValueError, match="already"):
        GEDiff(m)


def test_metrics_nan_and_inf():
    g = torch.tensor([[float("-inf"), 1.0, float("nan")]])
    e = torch.tensor([[float("-inf"), 1.0, 2.0]])
    m = gediff.metrics(g, e, 2)
    assert m["max_abs"] == float("inf") and m["diverged"]
    assert gediff.metrics(e, e.clone(), 2) == dict(max_abs=0.0, argmax_rows=0, topk_rows=0, diverged=False)


def test_clean_workload_no_divergence():
    dev = device.get("sim")
    m = build.model(dev, CANARY, overlap="off")
    gd = GEDiff(m)
    r, _ = build.bucket_run(Runner(m, [1, 2]).capture(), CANARY_WORKLOAD, 2, [gd], seed=1)
    s = gd.summary()
    assert r["corrupted_sessions"] == 0 and s["comparisons"] == r["steps"] and s["diverged"] == 0
