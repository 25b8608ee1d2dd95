"""The graphed canary's fixed-shape functions against the eager canary, on CPU tensors: the same
classes and watched pages from a padded StaticBatch as from the step, the same packed answer, and
the same records for planted writes (off CUDA the "graphs" run eagerly, drawing the free sample from
the canary's seeded generator, so the graphed and eager canaries watch the very same pages). The
capture itself: one GPU test against the eager canary."""

from types import SimpleNamespace

import pytest
import torch
from canary_steps import WIDTH, P, host_sets, pick, random_step
from models import CANARY, CANARY_WORKLOAD, TINY

from nblib.engine.runner import StaticBatch
from nblib.instruments import canary
from nblib.instruments import canary_graph as G
from nblib.instruments.canary import SCRATCH_PAGE, Canary

BUCKET = 12  # random_step's batches have at most 11 rows: always some padding


def static_of(step, bucket=BUCKET):
    st = StaticBatch(bucket, WIDTH, "cpu")
    st.fill(step["tokens"], step["page_table"], step["seq_lens"], step["store_slots"])
    return st


def live_inputs(step):
    """(use_table, live_mask) as GraphedCanary sets them for the step."""
    live = torch.zeros(P, dtype=torch.bool)
    given = step.get("live_pages")
    if given is not None:
        live[sorted(given)] = True
    return torch.tensor([given is None]), live


@pytest.mark.parametrize("live_pages", [False, True])
def test_classes_from_the_padded_static_batch_are_the_steps(live_pages):
    for seed in range(20):
        step = random_step(seed, live_pages)
        st = static_of(step)
        got = G.batch_classes(st.page_table, st.seq_lens, st.store_slots, P, *live_inputs(step))
        assert torch.equal(got, canary.page_classes(*canary.step_pages(step, "cpu"), P))


@pytest.mark.parametrize("free_sample", [0, 8, 64, 1000, None])
def test_the_watched_mask_is_the_eager_watched_set(free_sample):
    """The same generator state gives the same sample: the mask holds exactly watched()'s ids."""
    c = Canary(SimpleNamespace(index_cache=torch.zeros(P, 4, 2)), free_sample=free_sample, seed=3)
    gen = torch.Generator().manual_seed(3)
    for seed in range(8):
        step = random_step(seed, live_pages=seed % 2 == 1)
        st = static_of(step)
        classes = G.batch_classes(st.page_table, st.seq_lens, st.store_slots, P, *live_inputs(step))
        mask = G.watched_mask(classes, free_sample, gen)
        ids = c.watched(step)
        want = list(range(P)) if ids is None else ids.tolist()
        assert torch.nonzero(mask).flatten().tolist() == want
        if free_sample is not None:
            assert int(mask.sum()) == len(host_sets(step)[2]) + min(free_sample, P - len(host_sets(step)[2]))


@pytest.mark.parametrize("cap", [4, 512])
def test_the_packed_answer_is_changed_pages(cap):
    g = torch.Generator().manual_seed(cap)
    watched = torch.rand(P, generator=g) < 0.7
    changed = (torch.rand(P, generator=g) < 0.3) & watched
    classes = torch.randint(1, 5, (P,), generator=g)
    n_changed, n_expected, n_watched, pages, codes = G.unpack(
        G.pack_changed(changed, classes, watched, cap).numpy(), cap
    )
    ids = torch.nonzero(watched).flatten()
    want = canary.changed_pages(changed[ids], ids, classes, cap)
    assert (n_changed, n_expected, n_watched) == (*want[:2], int(watched.sum()))
    if cap < n_changed:
        assert pages is None and codes is None  # GraphedCanary takes the second transfer
    else:
        assert pages.tolist() == want[2].tolist() and codes.tolist() == want[3].tolist()


def pair(free_sample, seed, cap=canary.CHANGED_CAP):
    """An eager and a graphed canary (off CUDA: its functions run eagerly) on one cache, and the
    static batch that stands for runner.run's."""
    cache = torch.randn(P, 4, 2, generator=torch.Generator().manual_seed(seed)).bfloat16()
    model = SimpleNamespace(index_cache=cache)
    static = {BUCKET: StaticBatch(BUCKET, WIDTH, "cpu")}
    runner = SimpleNamespace(model=model, buckets=[BUCKET], static=static)
    eager = Canary(model, free_sample=free_sample, seed=seed)
    return eager, G.GraphedCanary(runner, free_sample=free_sample, seed=seed, cap=cap), cache, runner


def replay(eager, graphed, runner, step, plant=()):
    """Both canaries around one 'replay': fill the static batch, write the planted pages."""
    eager.before(step)
    graphed.before(step)
    runner.static[BUCKET].fill(step["tokens"], step["page_table"], step["seq_lens"], step["store_slots"])
    for p in plant:
        eager.cache[p, 1, 0] += 1
    want = eager.after(step)
    assert graphed.after(step) is None  # the record is built later, when read
    return want, graphed.records[-1]


@pytest.mark.parametrize("cap", [2, 512])
@pytest.mark.parametrize("live_pages", [False, True])
@pytest.mark.parametrize("free_sample", [8, None])
def test_planted_writes_give_the_eager_records(free_sample, live_pages, cap):
    """Writes into some expected pages, live pages nobody stores into, free pages (sampled or not)
    and the scratch page: the graphed record equals the eager one, past the cap too."""
    for seed in range(8):
        eager, graphed, cache, runner = pair(free_sample, seed, cap)
        step = random_step(seed, live_pages)
        live, expected, must = host_sets(step)
        g = torch.Generator().manual_seed(100 + seed)
        free = sorted(set(range(P)) - must)
        plant = pick(sorted(expected), max(len(expected) - 1, 0), g) + pick(sorted(live - expected), 3, g)
        plant += pick(free, 6, g) + ([SCRATCH_PAGE] if seed % 2 else [])
        a, b = replay(eager, graphed, runner, step, plant)
        assert a == b
        if live - expected:
            assert b["live_overwrites"]
    assert graphed.summary() == eager.summary()


def test_switching_between_steps_with_and_without_live_pages():
    """run_sessions' steps carry live_pages, build.full_batch's do not: each replay reads its own."""
    eager, graphed, cache, runner = pair(8, 0)
    for seed in range(6):
        step = random_step(seed, live_pages=seed in (1, 2, 4))
        live, expected, _ = host_sets(step)
        plant = pick(sorted(live - expected), 2, torch.Generator().manual_seed(seed))
        a, b = replay(eager, graphed, runner, step, plant)
        assert a == b and len(b["live_overwrites"]) == len(plant)


def test_a_record_is_built_at_the_next_after_or_when_read():
    """after() leaves the answer in flight: the next after() builds the last replay's record (its
    buffers are reused), reading `records` builds the rest; the same records as the eager canary."""
    eager, graphed, _, runner = pair(8, 0)
    steps = [random_step(seed, live_pages=True) for seed in range(3)]
    for i, step in enumerate(steps):
        eager.before(step)
        graphed.before(step)
        runner.static[BUCKET].fill(step["tokens"], step["page_table"], step["seq_lens"], step["store_slots"])
        eager.cache[sorted(host_sets(step)[0])[0], 1, 0] += 1
        eager.after(step)
        graphed.after(step)
        assert len(graphed._records) == i  # built so far: every replay's but the last
    assert graphed.records == eager.records and len(graphed._records) == 3


def test_after_without_before_and_before_without_a_step_refuse():
    _, graphed, _, _ = pair(8, 0)
    with pytest.raises(RuntimeError, match="without canary.before"):
        graphed.after(random_step(0))
    with pytest.raises(ValueError, match="needs the step"):
        graphed.before()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_cuda_graphed_canary_matches_the_eager_one(dtype):
    """Captured per bucket, the graphed canary gives the eager canary's records around real replays:
    a write planted in a live page between before and after (and in a free page when the whole
    cache is watched), a second replay of the same batch, and a smaller batch in
    a smaller bucket; more changed pages than the cap take the second transfer."""
    from nblib.backends.device import get
    from nblib.engine.build import full_batch
    from nblib.engine.model import DecodeModel, ModelConfig
    from nblib.engine.runner import Runner

    dev = get("cuda")
    m = DecodeModel(ModelConfig(**TINY, index_dtype=dtype, overlap="off"), dev)
    runner = Runner(m, [2, 8]).capture()
    batch = full_batch(m, 8)
    small = type(batch)(*(x[:2] for x in batch))
    torch.cuda.manual_seed(0)
    for free_sample, cap in ((canary.FREE_SAMPLE, canary.CHANGED_CAP), (None, 2)):
        eager = Canary(m, free_sample=free_sample)
        graphed = G.GraphedCanary(runner, free_sample=free_sample, cap=cap).capture()
        for i, (b, live) in enumerate(((batch, [3, 9]), (batch, []), (small, [1]))):
            step = b.step(i)
            free = [m.cfg.num_pages - 1] if free_sample is None else []  # the batches hold pages 1..56
            plant = live + free
            eager.before(step)
            graphed.before(step)
            runner.run(*b)
            for p in plant:
                m.index_cache[p].view(torch.uint8)[7] += 1
            graphed.after(step)
            want, got = eager.after(step), graphed.records[-1]
            assert got == want, (i, got, want)
            assert set(live) <= set(got["live_overwrites"]) and got["free_writes"] == free
        assert graphed.records[0]["expected"] == 8  # one store page per row


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_on_the_simulator_run_sessions_gives_both_canaries_the_same_records(overlap):
    """The whole workload (steps with live_pages, several buckets, the race's configuration too):
    the graphed canary's records, step for step, are the eager canary's."""
    from nblib.backends import device
    from nblib.engine import build
    from nblib.engine.runner import Runner

    m = build.model(device.get("sim"), CANARY, overlap=overlap)
    runner = Runner(m, [2, 4]).capture()
    eager, graphed = Canary(m, seed=5), G.GraphedCanary(runner, seed=5)
    build.bucket_run(runner, CANARY_WORKLOAD, 4, [eager, graphed])
    assert graphed.records == eager.records and len(eager.records) > 10
    assert sum(r["changed"] for r in graphed.records) > 0


def test_captured_through_the_simulator_no_host_sync_and_the_eager_records():
    """The simulator's capture refuses what CUDA's refuses for host syncs (.item(), nonzero, a
    blocking copy): the graphed canary's two graphs capture there, and their replays give the eager
    canary's records over the workload (no free-page writes with overlap off, so the different
    free samples cannot tell them apart)."""
    from nblib.backends import device
    from nblib.engine import build
    from nblib.engine.runner import Runner

    m = build.model(device.get("sim"), CANARY, overlap="off")
    runner = Runner(m, [2, 4]).capture()
    eager, graphed = Canary(m), G.GraphedCanary(runner, capture=True).capture()
    assert all(g.graph is not None for pair in graphed._graphs.values() for g in pair)
    build.bucket_run(runner, CANARY_WORKLOAD, 4, [eager, graphed])
    assert graphed.records == eager.records and len(eager.records) > 10
