"""The differential's designs are what they say (where each stash lives, who allocated it, copies or
references), every design catches a planted divergence, and the protocol's statistics are right."""

import math

import pytest
import torch
from models import DIFFERENTIAL

from nblib.backends.device import get
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.instruments.gediff import DESIGNS, GEDiff
from nblib.studies import designs, protocol
from nblib.studies.protocol import ProtocolRun

BUCKET = 4
INPUTS = ("q", "head_w", "page_table", "seq_lens")


def _captured(design, **knobs):
    dev = get("sim")
    m = build.model(dev, DIFFERENTIAL, **{"index_dtype": "bf16", "overlap": "on", **knobs})
    gd = GEDiff(m, design=design)
    m.prepare(BUCKET)  # what Runner.capture does first; prealloc makes its stash here
    before = {k: dict(v) for k, v in gd.stash.items()}
    runner = Runner(m, [BUCKET]).capture()
    return dev, m, gd, runner, before


def _block(dev, t):
    b = dev.block_of(t)
    assert b is not None, "the stash tensor should sit on an allocated block"
    return b


def test_campaign_allocates_copies_in_the_graph_pool_on_the_side_stream():
    dev, m, gd, runner, before = _captured("campaign")
    assert not before
    s = gd.stash[BUCKET]
    assert s["page_table"].data_ptr() != runner.static[BUCKET].page_table.data_ptr()  # a copy
    for name in (*INPUTS, "logits"):
        b = _block(dev, s[name])
        assert b.pool.pool_id == runner.pool and b.stream is m.side, name


def test_prealloc_stash_is_made_before_capture_outside_the_graph_pool():
    dev, m, gd, runner, before = _captured("prealloc")
    s = gd.stash[BUCKET]
    assert set(before) == {BUCKET}
    for name in (*INPUTS, "logits"):
        assert s[name] is before[BUCKET][name], name  # the same buffers, filled by captured copies
        # made outside capture: not a block of the capture's allocator (the simulator's arena)
        assert not dev.arena.owns(s[name]) and dev.block_of(s[name]) is None, name
    # the copies are captured: a replay fills the buffer with that replay's page table
    batch = build.full_batch(m, BUCKET, ctx=256)
    runner.run(*batch)
    assert torch.equal(s["page_table"], runner.static[BUCKET].page_table)


def test_main_stash_clones_the_inputs_on_the_main_stream_and_the_logits_on_the_side():
    dev, m, gd, runner, _ = _captured("main_stash")
    s = gd.stash[BUCKET]
    for name in INPUTS:
        b = _block(dev, s[name])
        assert b.pool.pool_id == runner.pool and b.stream is not m.side, name
    b = _block(dev, s["logits"])
    assert b.pool.pool_id == runner.pool and b.stream is m.side


def test_refs_keeps_the_graphs_own_tensors_and_so_the_logits_block():
    dev, m, gd, runner, _ = _captured("refs")
    s = gd.stash[BUCKET]
    assert s["page_table"] is runner.static[BUCKET].page_table
    assert s["seq_lens"] is runner.static[BUCKET].seq_lens
    noted = [n for n in m.captures if n["tensor"] == "indexer.logits" and n["bucket"] == BUCKET]
    assert [n["addr"] for n in noted] == [s["logits"].data_ptr()]  # the engine's own transient
    assert _block(dev, s["logits"]).allocated  # kept: the allocator cannot hand it on
    assert not runner.aliases()
    # without the differential the same capture hands the freed logits block to the main stream
    off = build.model(get("sim"), DIFFERENTIAL, index_dtype="bf16", overlap="on")
    assert any(a["first"] == "indexer.logits" for a in Runner(off, [BUCKET]).capture().aliases())


@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_design_catches_a_planted_divergence(design):
    knobs = dict(index_dtype="bf16", overlap="off", logits_policy="transient")  # no race: only the plant
    dev = get("sim")
    assert designs.planted_caught(dev, DIFFERENTIAL, knobs, design, BUCKET)
    # the control: the same capture without the plant compares equal
    m = build.model(dev, DIFFERENTIAL, **knobs)
    gd = GEDiff(m, design=design)
    runner = Runner(m, [BUCKET]).capture()
    runner.run(*build.full_batch(m, BUCKET, ctx=256))
    assert not gd.compare(BUCKET, rows=BUCKET)["diverged"]


def test_an_unknown_design_or_arm_fails_in_one_line():
    m = build.model(get("sim"), DIFFERENTIAL)
    with pytest.raises(ValueError, match="unknown differential design 'clone'.*campaign"):
        GEDiff(m, design="clone")
    with pytest.raises(ValueError, match="arms must include 'off'"):
        designs.check_arms(["refs"])


def _run(seed, k, n=40):
    return ProtocolRun(
        seed=seed,
        sessions=n,
        corrupted_sessions=k,
        steps=10,
        corrupted_steps=min(k, 10),
        rows=100,
        corrupted_rows=k,
        rows_per_corrupted_step=None,
        concurrency=n,
        buckets=[],
    )


def test_dispersion_p_is_pearsons_chi_square_over_the_runs():
    from scipy.stats import chi2

    runs = [_run(i, k) for i, k in enumerate([24, 15, 15, 0, 14])]
    pooled = sum(r.corrupted_sessions for r in runs) / 200
    stat = sum((r.corrupted_sessions - 40 * pooled) ** 2 / (40 * pooled * (1 - pooled)) for r in runs)
    assert protocol.dispersion_p(runs) == pytest.approx(chi2.sf(stat, 4), rel=1e-9)
    assert protocol.dispersion_p(runs) < 1e-4  # the over-dispersed runs the issue saw
    assert protocol.dispersion_p([_run(i, k) for i, k in enumerate([9, 7, 9, 7, 9])]) > 0.9
    assert protocol.dispersion_p([_run(i, 0) for i in range(5)]) == 1.0  # nothing to test


def test_each_buckets_steps_are_pooled_over_the_runs_with_their_rate_and_interval():
    from nblib.studies.protocol import BucketSteps

    a, b = _run(0, 3), _run(1, 5)
    a.buckets = [
        BucketSteps(bucket=8, steps=4, corrupted_steps=0),
        BucketSteps(bucket=24, steps=9, corrupted_steps=7),
    ]
    b.buckets = [
        BucketSteps(bucket=24, steps=11, corrupted_steps=9),
        BucketSteps(bucket=32, steps=5, corrupted_steps=1),
    ]
    p = protocol.summarise([a, b])
    assert [(x.bucket, x.steps, x.corrupted_steps) for x in p.bucket_steps] == [
        (8, 4, 0),
        (24, 20, 16),
        (32, 5, 1),
    ]
    (row,) = [r for r in protocol.bucket_rows(p) if r["bucket"] == 24]
    # Wilson's score interval for 16 of 20 at z = 1.96, from the textbook formula
    z, n, ph = 1.959963984540054, 20, 0.8
    mid, half = (ph + z * z / (2 * n)), z * ((ph * (1 - ph) / n + z * z / (4 * n * n)) ** 0.5)
    assert row["step_rate"] == 0.8
    assert (row["lo"], row["hi"]) == pytest.approx(
        ((mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n))
    )


def _seed_block(base, counts, n=40):
    runs = [
        protocol.ProtocolRun(
            seed=base + i,
            sessions=n,
            corrupted_sessions=k,
            steps=10,
            corrupted_steps=min(k, 10),
            rows=0,
            corrupted_rows=0,
            rows_per_corrupted_step=None,
            concurrency=8,
            buckets=[],
        )  # fmt: skip
        for i, k in enumerate(counts)
    ]
    return protocol.block(base, protocol.summarise(runs))


def test_seed_blocks_are_compared_with_each_other_by_their_pooled_counts():
    same = [_seed_block(0, [8, 10, 9]), _seed_block(100, [9, 8, 10])]
    apart = [_seed_block(0, [8, 10, 9]), _seed_block(100, [30, 28, 31])]
    # Pearson's chi-square for a 2x2 table, by hand: 27/120 against 89/120 corrupted
    a, b, c, d = 27, 93, 89, 31
    n = a + b + c + d
    chi2 = n * (a * d - b * c) ** 2 / ((a + b) * (c + d) * (a + c) * (b + d))
    assert protocol.between_blocks_p(apart) == pytest.approx(math.erfc(math.sqrt(chi2 / 2)))  # 1 dof
    assert protocol.between_blocks_p(same) > 0.5 and protocol.between_blocks_p(same[:1]) == 1.0
    said = protocol.blocks_verdict(apart)
    assert "0: 27/120" in said and "100: 89/120" in said
    assert "the blocks differ" in said and "runs 20%-25%" in said
    assert "differ no more than chance makes them differ" in protocol.blocks_verdict(same)
    rows = protocol.block_rows(apart)
    assert [(r["base_seed"], r["corrupted_sessions"], r["sessions"]) for r in rows] == [
        (0, 27, 120),
        (100, 89, 120),
    ]
    assert rows[1]["runs"] == "30/40 28/40 31/40"


def test_seed_blocks_that_share_seeds_are_refused_in_one_line():
    from nblib.schema import params as P

    with pytest.raises(
        ValueError, match="seed_blocks 0 and 3 share seeds: each block runs protocol_runs"
    ) as e:
        P.validate({"seed_blocks": [0, 3], "protocol_runs": 5})
    assert "\n" not in str(e.value).strip().splitlines()[0]


def test_the_protocol_runs_every_session_together_and_counts_every_step():
    dev = get("sim")
    m = build.model(dev, DIFFERENTIAL, index_dtype="bf16", overlap="on")
    runner = Runner(m, [1, 2, 4]).capture()
    work = dict(sessions=6, rounds=2, ctx_min=64, ctx_max=1024, turn_ctx=256, out_min=3, out_max=5)
    p = protocol.run(runner, work, protocol.seeds(7, 2), progress=None)
    assert [r.seed for r in p.runs] == [7, 8] and all(r.concurrency == 4 for r in p.runs)
    for r in p.runs:  # every step is in some bucket; none is left out of the run's count
        assert sum(b.steps for b in r.buckets) == r.steps
        assert sum(b.corrupted_steps for b in r.buckets) == r.corrupted_steps
    assert sum(b.steps for b in p.bucket_steps) == p.steps
    assert p.pooled.sessions == 12 and p.steps == sum(r.steps for r in p.runs)
    with pytest.raises(ValueError, match="at least one run"):
        protocol.seeds(0, 0)


def test_configurations_are_the_corrupting_one_and_its_one_knob_changes():
    got = protocol.configurations(["bf16", "fp8"], ["graph", "eager"], ["on", "off"])
    assert got == [
        ("bf16", "graph", "on"),
        ("bf16", "graph", "off"),
        ("bf16", "eager", "on"),
        ("fp8", "graph", "on"),
    ]


def _arm(
    design,
    k,
    side_us=100.0,
    pairs=("indexer.logits / mlp.up",),
    kept=1000,
    steps=((24, 20, 100), (40, 0, 300)),
    main_us=50.0,
    diverged=0,
    planted=True,
):
    """An arm as notebook 02 records it: k of 200 sessions corrupted, the bucket-8 evidence (pairs,
    blocks kept, branch times), and (bucket, corrupted steps, steps) pooled over its runs."""
    from nblib.core import stats

    p = None if design == "off" else stats.fisher(40, 200, k, 200)["p"]
    mech = [
        designs.Mechanism(
            bucket=24,
            hazards=2 * len(pairs),
            pairs=list(pairs),
            side_ms=side_us / 1e3,
            main_ms=main_us / 1e3,
            kept_bytes=kept,
        )
    ]
    bucket_steps = [protocol.BucketSteps(bucket=b, corrupted_steps=c, steps=n) for b, c, n in steps]
    return designs.Arm(
        design=design, description="", sessions=200, corrupted_sessions=k, rate=k / 200, lo=0.0, hi=1.0,
        fisher_p=p, runs=[k], dispersion_p=1.0, steps=sum(n for _, _, n in steps),
        corrupted_steps=sum(c for _, c, _ in steps), comparisons=100, diverged=diverged, max_abs=0.0,
        planted_caught=planted if design != "off" else None, hazards=2 * len(pairs), pairs=len(pairs),
        side_ms={24: side_us / 1e3}, main_ms={24: main_us / 1e3}, buckets=mech, bucket_steps=bucket_steps,
        kept_bytes=kept,
    )  # fmt: skip


def _explained(*arms):
    result = designs.Designs(arms=[_arm("off", 40), *arms], seeds=[0], method="given")
    return result, designs.explain(result)


def test_each_mechanism_is_named_from_its_own_evidence():
    """off: 20 of 100 steps in bucket 24 corrupted, 300 clean steps in bucket 40, 1000 B kept."""
    result, why = _explained(
        # the same pairs and steps per bucket; a step in bucket 24 loses the race three times as often
        _arm("campaign", 90, side_us=110.0, steps=((24, 60, 100), (40, 0, 300))),
        # the same per-step rate in bucket 24 (20 %), three times the steps there
        _arm("prealloc", 90, steps=((24, 60, 300), (40, 0, 100))),
        # no pair left and 4 kB more kept: lifetime
        _arm("refs", 0, pairs=(), kept=5096, steps=((24, 0, 100), (40, 0, 300))),
        # no pair left, nothing more kept: layout
        _arm("main_stash", 0, pairs=(), steps=((24, 0, 100), (40, 0, 300))),
        _arm("canary", 42, steps=((24, 21, 100), (40, 0, 300))),
    )
    got = {f.design: (f.effect, f.mechanism) for f in why.findings}
    assert got == {
        "campaign": ("raises", "in-step timing"),
        "prealloc": ("raises", "batch dynamics"),
        "refs": ("lowers", "lifetime"),
        "main_stash": ("lowers", "layout"),
        "canary": ("unchanged", "none"),
    }
    by = {f.design: f for f in why.findings}
    assert (
        by["campaign"].why.startswith("in-step timing")
        and "60/100 against off's 20/100" in by["campaign"].why
    )
    assert "300/400 against off's 100/400" in by["prealloc"].why
    assert "+4096 B" in by["refs"].lifetime
    assert why.signature == ["refs", "main_stash"] and why.recommended is None


def test_an_effect_no_evidence_accounts_for_reads_not_separated():
    _, why = _explained(_arm("campaign", 80))  # the rate doubled, nothing else moved
    assert [(f.effect, f.mechanism) for f in why.findings] == [("raises", "not separated")]


def test_the_campaign_sentence_says_whether_the_campaigns_drop_is_reproduced():
    result, why = _explained(_arm("campaign", 90, side_us=110.0, steps=((24, 60, 100), (40, 0, 300))))
    s = designs.campaign_sentence(result, why)
    assert (
        "does not reproduce the campaign's drop" in s
        and "in-step timing" in s
        and "90/200 against 40/200" in s
    )
    result, why = _explained(_arm("campaign", 8, steps=((24, 4, 100), (40, 0, 300))))
    s = designs.campaign_sentence(result, why)
    assert "it reproduces the campaign's drop. The mechanism, in-step timing:" in s
    result, why = _explained(_arm("refs", 8, pairs=(), kept=9000))
    assert designs.campaign_sentence(result, why) is None  # no campaign arm


def test_the_bucket_table_sets_each_arms_steps_beside_offs():
    result, _ = _explained(_arm("prealloc", 90, steps=((24, 60, 300), (32, 1, 10))))
    assert designs.bucket_table(result) == [
        {"bucket": 24, "off": "20/100", "prealloc": "60/300"},
        {"bucket": 32, "off": "0/0", "prealloc": "1/10"},
        {"bucket": 40, "off": "0/300", "prealloc": "0/0"},
    ]


def test_kept_bytes_count_the_blocks_a_design_holds_past_the_capture():
    """The audit's record of each arm's captures: clones and references keep pool blocks that off hands
    back; a stash made before capture keeps none in the pool."""
    dev = get("sim")
    shapes, work = dict(DIFFERENTIAL), dict(sessions=4, rounds=1, ctx_min=64, ctx_max=128, turn_ctx=64,
                                           out_min=1, out_max=2, think_min=1, think_max=1)  # fmt: skip
    knobs, kept = dict(index_dtype="bf16", overlap="on", logits_policy="transient"), {}
    for arm in ("off", "campaign", "prealloc", "refs"):
        _, _, mech, _, _ = designs.run_arm(
            dev, shapes, [BUCKET], work, arm, [0], knobs, replays=1, progress=None
        )
        kept[arm] = mech[0].kept_bytes
    m = build.model(dev, shapes, index_dtype="bf16", overlap="on")
    logits = BUCKET * m.cfg.max_ctx * 4  # fp32 logits rows of the bucket
    assert kept["prealloc"] == kept["off"]
    assert kept["refs"] >= kept["off"] + logits  # the logits block, at least
    assert kept["campaign"] >= kept["off"] + logits  # its clone of them, at least


def test_the_branches_are_measured_on_batches_of_the_entries_asked_for():
    """The simulated side branch lasts as long as the batch's longest request: fewer entries a
    request, a shorter side branch; the main branch does not read the cache."""
    dev = get("sim")
    m = build.model(dev, DIFFERENTIAL, index_dtype="bf16", overlap="on")
    short = designs.branch_ms(dev, m, 2, replays=2, ctx=128)
    default = designs.branch_ms(dev, m, 2, replays=2)  # half the longest context
    assert short[0] < default[0] and short[1] == pytest.approx(default[1])
