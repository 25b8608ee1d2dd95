"""The fix's speed checks: two-sided, and they fail (never vanish) when the overlap's gain is lost."""

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


def test_warm_up_replays_are_the_cuda_count_on_cuda_and_one_on_the_simulator_unless_given():
    """A simulator warm-up costs as much as a timed replay and settles nothing but the first
    call's allocations; CUDA keeps each timing's own count (clocks and caches settle)."""
    from nblib.backends.sim import SimDevice
    from nblib.instruments import overhead
    from nblib.schema import params as P

    class Cuda:
        name = "cuda"

    assert overhead.warmups(SimDevice(), None, cuda=10) == 1
    assert overhead.warmups(Cuda(), None, cuda=10) == 10 and overhead.warmups(Cuda(), None, cuda=3) == 3
    assert overhead.warmups(SimDevice(), 4, cuda=10) == 4 and overhead.warmups(Cuda(), 0, cuda=10) == 0
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
    from nblib.instruments import overhead
    from nblib.schema import params as P

    shapes = P.load(P.ROOT / "params" / "ci.yaml")["model"]

    def measure(fn):
        fn()
        return 1.0

    for ctx, want in ((None, shapes["max_ctx"] // 2), (0, shapes["max_ctx"] // 2), (320, 320)):
        rows = fix.step_times(SimDevice(), shapes, [2], [fix.BUGGY], replays=2, measure=measure, ctx=ctx)
        assert [r["ctx"] for r in rows] == [want], ctx
    cost = overhead.replay_times(SimDevice(), shapes, 2, replays=2, instruments=("neither",), ctx=320)
    assert [r["ctx"] for r in cost] == [320]
