"""The canary on the simulator: a hand-planted live-page overwrite is classed as one; clean runs are quiet."""

import pytest
import torch
from models import CANARY, CANARY_WORKLOAD

from nblib.backends import device
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.instruments import canary
from nblib.instruments.canary import Canary, page_checksums


def _setup(overlap="off", bucket=2):
    dev = device.get("sim")
    m = build.model(dev, CANARY, overlap=overlap)
    runner = Runner(m, [bucket]).capture()
    args = build.full_batch(m, bucket)
    return m, runner, args, args.step()


def test_planted_writes_are_classed():
    m, runner, args, step = _setup()
    c = Canary(m, free_sample=None)  # every page
    live = canary.batch_live_pages(step["page_table"], step["seq_lens"])
    expected = canary.expected_pages(step["store_slots"])
    victim = min(live - expected)
    free = max(set(range(1, m.cfg.num_pages)) - live)
    c.before(step)
    runner.run(*args)
    m.index_cache[victim, 5, 0] += 1  # the plant: a live page nobody stores into this step
    m.index_cache[free, 0, 0] = 3.0  # and a page no request holds
    rec = c.after(step)
    assert rec["live_overwrites"] == [victim] and rec["free_writes"] == [free]
    assert rec["expected"] == len(expected) == 2 and rec["expected_unchanged"] == 0
    assert rec["changed"] == 2 + 2 and not rec["scratch"]  # the two stores, the two plants
    s = c.summary()
    assert (s["live_overwrites"], s["free_page_writes"], s["steps_with_live_overwrite"]) == (1, 1, 1)
    assert "1 live-page overwrites" in canary.describe(s)


def test_the_watched_pages_catch_every_live_overwrite_and_sample_the_free_ones():
    m, runner, args, step = _setup()
    c = Canary(m, free_sample=8, seed=3)
    live = canary.batch_live_pages(step["page_table"], step["seq_lens"])
    expected = canary.expected_pages(step["store_slots"])
    ids = c.watched(step)
    must = live | expected | {canary.SCRATCH_PAGE}
    sampled = set(ids.tolist()) - must
    assert must <= set(ids.tolist()) and len(sampled) == 8 and not sampled & live
    assert set(c.watched(step).tolist()) - must != sampled  # drawn afresh each replay
    victim = min(live - expected)
    free_in = min(sampled)
    c._rng.manual_seed(3)  # the same draw as `ids` for this replay
    c.before(step)
    assert torch.equal(c._ids, ids)
    free_out = max(set(range(1, m.cfg.num_pages)) - must - sampled)
    runner.run(*args)
    m.index_cache[victim, 5, 0] += 1  # a live page nobody stores into: always watched
    m.index_cache[free_in, 0, 0] = 3.0  # a sampled free page: caught
    m.index_cache[free_out, 0, 0] = 3.0  # an unsampled one: not seen this replay
    rec = c.after(step)
    assert rec["live_overwrites"] == [victim] and rec["free_writes"] == [free_in]
    assert rec["watched"] == len(ids) < m.cfg.num_pages
    assert c.summary()["pages_watched"] == len(ids)


def test_no_alarm_without_writes_and_checksum_sees_a_swap():
    m, runner, args, step = _setup()
    c = Canary(m)
    c.before(step)
    rec = c.after(step)  # nothing ran in between
    assert rec["changed"] == 0 and not rec["live_overwrites"]
    before = page_checksums(m.index_cache)
    m.index_cache[7, [0, 1]] = m.index_cache[7, [1, 0]]  # same words, moved
    assert torch.nonzero(page_checksums(m.index_cache) != before).flatten().tolist() == [7]


def test_refuses_any_tensor_but_the_index_cache():
    dev = device.get("sim")
    m = build.model(dev, CANARY)
    Canary(m, m.index_cache)
    with pytest.raises(ValueError, match="index-K cache only"):
        Canary(m, m.kv_cache)
    with pytest.raises(ValueError, match="index-K cache only"):
        Canary(m, m.index_cache.clone())


def test_clean_run_is_quiet_and_counts_add_up():
    dev = device.get("sim")
    rows = canary.watch(dev, CANARY, [1, 2], {**CANARY_WORKLOAD, "seed": 1}, overlaps=["off"], progress=None)
    for r in rows:
        assert r["corrupted_sessions"] == 0 and r["live_overwrites"] == 0 and r["free_page_writes"] == 0
        assert r["pages_changed"] == r["pages_expected"] - r["expected_unchanged"] + r["scratch_writes"]
        assert r["pages_expected"] > 0
    # overlap off corrupts nothing, so the verdict must say so and count every replay as quiet
    replays = sum(r["replays"] for r in rows)
    assert replays == sum(r["steps"] + r["tail_steps"] for r in rows) > 0
    watched = sum(r["pages_watched"] for r in rows) / replays
    assert canary.verdict(rows) == (
        "no session was corrupted, so the canary had nothing to explain. "
        f"Clean runs: 0 live or free-page alarms over {replays} replays "
        f"({watched:.0f} pages checksummed a replay: live, expected, scratch and 64 sampled free)."
    )


def test_a_passive_instrument_leaves_the_verdicts_alone():
    """With instruments, each step replays before its reference; nothing either computes changes."""

    class Passive:
        def before(self, step):
            assert step["live_pages"] and 0 not in step["live_pages"]

        def after(self, step):
            pass

    out = []
    for inst in ((), (Passive(),)):
        dev = device.get("sim")
        m = build.model(dev, CANARY, overlap="on")
        r, _ = build.bucket_run(Runner(m, [1, 2]).capture(), CANARY_WORKLOAD, 2, inst, seed=2)
        out.append((r["corrupted_ids"], [s["bad_rows"] for s in r["step_log"]]))
    assert out[0] == out[1]
