"""The canary's device path against its host definitions, on random steps: the same pages watched
(live, expected, scratch, and a fresh, seeded, uniform sample of free pages), the same classes and
records for planted writes, with and without the step's live_pages. CPU tensors only."""

from types import SimpleNamespace

import pytest
import torch
from canary_steps import P, host_sets, pick, random_step

from nblib.engine.model import PAGE
from nblib.instruments import canary
from nblib.instruments.canary import CLASSES, SCRATCH_PAGE, Canary


def make(free_sample=8, seed=0):
    cache = torch.randn(P, 4, 2, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return Canary(SimpleNamespace(index_cache=cache), free_sample=free_sample, seed=seed), cache


@pytest.mark.parametrize("live_pages", [False, True])
@pytest.mark.parametrize("free_sample", [0, 8, 64, 1000])
def test_watched_pages_are_the_host_definitions(live_pages, free_sample):
    c, _ = make(free_sample)
    for seed in range(12):
        step = random_step(seed, live_pages)
        live, expected, must = host_sets(step)
        classes = canary.page_classes(*canary.step_pages(step, "cpu"), P).tolist()
        assert classes == [CLASSES.index(canary.classify([p], expected, live)[p]) + 1 for p in range(P)]
        ids = c.watched(step).tolist()
        assert ids == sorted(set(ids))  # ascending, distinct
        sampled = set(ids) - must
        assert must <= set(ids) and len(sampled) == min(free_sample, P - len(must))


def test_a_full_cache_watches_every_page_and_samples_what_is_free():
    """notebook 02's shape: nearly every page live, fewer free pages than the sample size."""
    c, _ = make(free_sample=64)
    table = torch.arange(1, 1 + 4 * 99, dtype=torch.int32).view(4, 99)
    step = dict(page_table=table, seq_lens=torch.full((4,), 99 * PAGE - 1, dtype=torch.int32))
    step["store_slots"] = table[:, 98].long() * PAGE + PAGE - 2
    assert c.watched(step).tolist() == list(range(P))  # 397 live, scratch, the 3 free ones


def test_the_free_sample_is_fresh_each_replay_reproducible_by_seed_and_uniform():
    step = random_step(1, bs=4)
    must = host_sets(step)[2]
    draws = [[set(c.watched(step).tolist()) - must for _ in range(3)] for c in (make()[0], make()[0])]
    assert draws[0] == draws[1]  # the same seed: the same samples, replay by replay
    assert len({frozenset(d) for d in draws[0]}) == 3  # drawn afresh each replay: no two alike
    assert set(make(seed=1)[0].watched(step).tolist()) - must != draws[0][0]
    c, counts = make(free_sample=10)[0], torch.zeros(P, dtype=torch.long)
    for _ in range(2000):
        counts[c.watched(step)] += 1
    free = torch.tensor(sorted(set(range(P)) - must))
    want = 2000 * 10 / len(free)  # each free page's expected count
    assert counts[free].min() > 0.6 * want and counts[free].max() < 1.4 * want
    assert counts[free].sum() == 2000 * 10


def reference_record(c, step, before, after_, ids):
    """The record the old after() makes from the same checksums and watched ids (classify)."""
    changed = [p for p in ids if before[p] != after_[p]]
    live, expected, _ = host_sets(step)
    cls = canary.classify(changed, expected, live)
    by = {k: sorted(p for p, v in cls.items() if v == k) for k in CLASSES}
    return dict(
        step=step.get("index", len(c.records)),
        bucket=step.get("bucket"),
        bs=step.get("bs"),
        watched=len(ids),
        changed=len(changed),
        expected=len(expected),
        expected_unchanged=len(expected - set(changed)),
        outside_live=len(by["scratch"]) + len(by["free_write"]),
        live_overwrites=by["live_overwrite"],
        free_writes=by["free_write"],
        scratch=bool(by["scratch"]),
    )


@pytest.mark.parametrize("live_pages", [False, True])
@pytest.mark.parametrize("free_sample", [8, None])
def test_planted_writes_get_the_old_classes_and_records(live_pages, free_sample):
    """Writes into: some expected pages (not all), the scratch page, live pages nobody stores into,
    free pages in the sample and out of it. The record equals the old after()'s."""
    for seed in range(10):
        c, cache = make(free_sample, seed)
        step = random_step(seed, live_pages)
        live, expected, must = host_sets(step)
        g = torch.Generator().manual_seed(100 + seed)
        c.before(step)
        ids = list(range(P)) if c._ids is None else c._ids.tolist()
        sampled = sorted(set(ids) - must)
        unsampled = sorted(set(range(P)) - set(ids))
        planted = pick(sorted(expected), max(len(expected) - 1, 0), g) + pick(sorted(live - expected), 3, g)
        planted += pick(sampled, 2, g) + pick(unsampled, 2, g) + ([SCRATCH_PAGE] if seed % 2 else [])
        before = canary.page_checksums(cache).tolist()
        for p in planted:
            cache[p, seed % 4, 0] += 1
        after_ = canary.page_checksums(cache).tolist()
        rec = c.after(step)
        assert rec == reference_record(c, step, before, after_, ids)
        if live - expected:
            assert rec["live_overwrites"]
        assert rec["scratch"] == bool(seed % 2)


def test_changed_pages_past_the_cap_take_a_second_transfer_with_the_same_answer():
    g = torch.Generator().manual_seed(0)
    ids = torch.unique(torch.randint(0, P, (300,), generator=g))
    changed = torch.rand(len(ids), generator=g) < 0.5
    classes = torch.randint(1, 5, (P,), generator=g)
    small, big = (canary.changed_pages(changed, ids, classes, cap=k) for k in (4, 512))
    assert small[:2] == big[:2] == (int(changed.sum()), int((classes == 1).sum()))
    assert (small[2] == big[2]).all() and (small[3] == big[3]).all()
    assert big[2].tolist() == ids[changed].tolist() and big[3].tolist() == classes[ids[changed]].tolist()


def test_the_same_step_dict_replayed_gets_fresh_pages_each_time():
    """notebook 02 replays one step dict: what before() derives from it is not kept across replays."""
    c, cache = make(8)
    step = random_step(3)
    c.before(step)
    c.after(step)
    step["store_slots"] = torch.full_like(step["store_slots"], PAGE - 1)  # now nothing is stored
    c.before(step)
    rec = c.after(step)
    assert rec["expected"] == 0 and rec["changed"] == 0
