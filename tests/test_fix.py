"""nblib.studies.fix: the speed checks are two-sided and fail (never vanish) when the overlap's gain
is lost; the timed replays interleave the variants; the plan floors each bucket at its share of the
sessions the zero-failure bound needs, and a variant tops a bucket up to its floor."""

import math

from nblib.studies import fix


def times(by_bucket):
    """{bucket: (on, off, persistent, record_stream)} -> step_times rows (ms)."""
    names = (fix.BUGGY, "overlap off", "persistent buffer", "record_stream")
    return [
        dict(variant=v, bucket=b, median_ms=ms) for b, row in by_bucket.items() for v, ms in zip(names, row)
    ]


def verdicts(by_bucket):
    return {c["check"].split(":")[0]: c["holds"] for c in fix.speed_checks(fix.speed(times(by_bucket)))}


def test_a_gain_kept_by_both_fixes_holds():
    got = verdicts({2: (0.40, 0.50, 0.401, 0.402), 32: (0.60, 0.70, 0.60, 0.605), 48: (0.80, 0.82, 0.8, 0.8)})
    assert got == {"overlap worth keeping": True, "persistent buffer": True, "record_stream": True}


def test_a_slowed_fix_fails():
    # persistent as slow as overlap off at bucket 32: it keeps none of the gain there
    got = verdicts({2: (0.40, 0.50, 0.401, 0.40), 32: (0.60, 0.70, 0.70, 0.60)})
    assert got["persistent buffer"] is False and got["record_stream"] is True


def test_a_fix_faster_than_the_overlap_it_fixes_fails():
    got = verdicts({2: (0.40, 0.50, 0.36, 0.40), 32: (0.60, 0.70, 0.60, 0.60)})
    assert got["persistent buffer"] is False


def test_no_gain_fails_every_speed_check():
    got = verdicts({2: (0.50, 0.50, 0.50, 0.50), 32: (0.70, 0.69, 0.70, 0.70)})
    assert got == {"overlap worth keeping": False, "persistent buffer": False, "record_stream": False}


def test_speed_rows_carry_the_keys_results_json_promises():
    row = fix.speed(times({8: (0.4, 0.5, 0.41, 0.42)}))[0]
    assert {"bucket", "overlap_on_ms", "overlap_off_ms", "persistent_ms", "record_stream_ms"} <= set(row)
    assert abs(row["overlap_gain"] - 0.25) < 1e-12 and abs(row["persistent_kept"] - 0.9) < 1e-9


def test_step_times_interleave_the_variants_replay_by_replay():
    """Each round times one replay of every variant, so a drift during the measurement cannot
    favour the variant timed first; every row has its own replays and none of the warm-up."""
    from nblib.backends.sim import SimDevice
    from nblib.schema import params as P

    prof = P.load(P.ROOT / "params" / "ci.yaml")
    order, clock = [], iter(range(10_000))

    def measure(fn):
        fn()
        order.append(id(fn.func.__self__))  # the runner this replay ran on
        return float(next(clock))

    variants = [fix.BUGGY, "persistent buffer"]
    rows = fix.step_times(SimDevice(), prof["model"], [1, 2], variants, replays=3, warmup=2, measure=measure)
    assert [(r["variant"], r["bucket"], r["replays"]) for r in rows] == [
        (fix.BUGGY, 1, 3),
        ("persistent buffer", 1, 3),
        (fix.BUGGY, 2, 3),
        ("persistent buffer", 2, 3),
    ]
    runners = order[:2]
    assert runners[0] != runners[1] and order == runners * 10  # alternating, 5 rounds x 2 buckets
    # the clock ticks once per replay: bucket 1's timed replays are rounds 3-5 (ticks 4-9)
    assert rows[0]["median_ms"] == 6.0 and rows[1]["median_ms"] == 7.0


def test_step_times_warm_up_once_on_the_simulator():
    """step_times takes its warm-up count from overhead.warmups: on the simulator, one untimed
    replay before the timed ones."""
    from nblib.backends.sim import SimDevice
    from nblib.schema import params as P

    prof = P.load(P.ROOT / "params" / "ci.yaml")
    calls = []

    def measure(fn):
        fn()
        calls.append(1)
        return 1.0

    fix.step_times(SimDevice(), prof["model"], [1], [fix.BUGGY], replays=3, measure=measure)
    assert len(calls) == 3 + 1  # the timed replays and one warm-up


def test_the_timed_batches_hold_timing_ctx_entries_a_request_or_half_the_longest_context():
    from nblib.backends.sim import SimDevice
    from nblib.schema import params as P

    shapes = P.load(P.ROOT / "params" / "ci.yaml")["model"]

    def measure(fn):
        fn()
        return 1.0

    for ctx, want in ((None, shapes["max_ctx"] // 2), (0, shapes["max_ctx"] // 2), (320, 320)):
        rows = fix.step_times(SimDevice(), shapes, [2], [fix.BUGGY], replays=2, measure=measure, ctx=ctx)
        assert [r["ctx"] for r in rows] == [want], ctx


def test_the_plan_floors_each_bucket_at_its_share_of_the_need():
    """The pooled buckets together must count the sessions the zero-failure bound needs, whatever
    the sessions asked for lose to the tails (0/380 read 1.00% against a 1% target on the H200)."""
    from scipy.stats import binomtest

    def wilson_upper(k, n):  # Wilson's score interval at 95 %, scipy's
        return binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson").high

    buggy = [dict(bucket=b, corrupted_sessions=int(b >= 24)) for b in (1, 8, 24, 32, 40)]
    p = fix.plan(buggy, 0.01)
    # the fewest sessions whose Wilson upper bound at 0 corrupted is below 1%: z^2 / (n + z^2) < 0.01
    need = math.floor(1.959963984540054**2 * (1 / 0.01 - 1)) + 1
    assert wilson_upper(0, need) < 0.01 <= wilson_upper(0, need - 1)
    assert p["pooled_buckets"] == [24, 32, 40] and p["needed"] == need
    assert sum(p["floor"].values()) >= need and all(p["floor"][b] <= p["sessions"][b] for b in (24, 32, 40))
    assert wilson_upper(0, sum(p["floor"].values())) < 0.01


def test_a_variant_tops_a_bucket_up_to_its_floor_with_new_seeds():
    """A chunk's last sessions decode alone in a smaller bucket and do not count for this one; the
    floor adds chunks until the bucket counts it."""
    from nblib.backends.sim import SimDevice
    from nblib.schema import params as P

    prof = P.load(P.ROOT / "params" / "ci.yaml")
    w = {**prof["workload"], "sessions": 3, "rounds": 1, "out_min": 2, "out_max": 3, "seed": 0}
    plain = fix.run_variant(SimDevice(), prof["model"], [1, 2], w, "overlap off", {2: 3}, progress=None)
    assert plain[1]["bucket"] == 2 and plain[1]["sessions"] < 5
    topped = fix.run_variant(
        SimDevice(), prof["model"], [1, 2], w, "overlap off", {2: 3}, progress=None, floor={2: 5}
    )
    assert topped[1]["sessions"] >= 5 and topped[0]["sessions"] == plain[0]["sessions"]
