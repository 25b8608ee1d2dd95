"""nblib.studies.designs: every differential design catches a planted divergence, the arms include
off, each mechanism is named from its own evidence, and the sentences and tables say what the arms
measured."""

import pytest
from models import DIFFERENTIAL

from nblib.backends.device import get
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.instruments.gediff import DESIGNS, GEDiff
from nblib.studies import designs, protocol

BUCKET = 4


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


def test_an_arm_list_without_off_fails_in_one_line():
    with pytest.raises(ValueError, match="arms must include 'off'"):
        designs.check_arms(["refs"])


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
