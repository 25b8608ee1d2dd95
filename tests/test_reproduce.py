"""nblib.studies.reproduce: the fingerprint reads what the rows say, pooled and bucket by bucket; the
verdict names a bucket the pool hides; the matrix's knobs are checked before anything runs; the same
seed gives the same matrix."""

import json

import pytest

from nblib.backends.device import get
from nblib.schema import params as P
from nblib.studies import reproduce
from nblib.studies.reproduce import Knobs, check_matrix_args, fingerprint, verdict

CI = P.ROOT / "params" / "ci.yaml"


def test_bad_matrix_knobs_fail_in_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match="graph, eager"):
        check_matrix_args(Knobs(["bf16"], ["replay"], ["on"]), [1])
    with pytest.raises(ValueError, match="positive integers"):
        check_matrix_args(Knobs(["bf16"], ["graph"], ["on"]), [0, 2])


def test_fingerprint_reports_what_rows_say():
    rows = [
        dict(index_dtype="bf16", mode="graph", overlap="on", bucket=4, sessions=10, corrupted_sessions=3),
        dict(index_dtype="bf16", mode="eager", overlap="on", bucket=4, sessions=10, corrupted_sessions=0),
        dict(index_dtype="fp8", mode="graph", overlap="on", bucket=4, sessions=10, corrupted_sessions=1),
        dict(index_dtype="bf16", mode="graph", overlap="off", bucket=1, sessions=10, corrupted_sessions=0),
    ]
    fp = {c["check"]: c for c in fingerprint(rows)}
    assert fp["bf16 + graph + overlap on, bucket > 1"]["holds"]
    assert fp["eager"]["holds"] and not fp["fp8"]["holds"]
    z2 = 1.959963984540054**2  # Wilson's upper bound at 0 of n, z^2 / (n + z^2), at 95 %
    assert fp["bucket 1"]["upper95"] == pytest.approx(z2 / (10 + z2))


def test_fingerprint_shows_a_bucket_the_pool_hides():
    """Pooled, buckets 2 and 8 corrupt (the GPU run's 40/40 and 0/40); per bucket, 8 never does."""
    racy = dict(index_dtype="bf16", mode="graph", overlap="on", sessions=40)
    rows = [dict(racy, bucket=1, corrupted_sessions=0), dict(racy, bucket=2, corrupted_sessions=40)]
    rows.append(dict(racy, bucket=8, corrupted_sessions=0))
    fp = fingerprint(rows)
    pooled = {c["check"]: c for c in fp if c["scope"] == "pooled"}
    assert pooled["bf16 + graph + overlap on, bucket > 1"]["corrupted"] == 40
    per = [(c["check"], c["corrupted"], c["sessions"], c["holds"]) for c in fp if c["scope"] == "bucket"]
    assert per == [
        ("bf16 + graph + overlap on, bucket 2", 40, 40, True),
        ("bf16 + graph + overlap on, bucket 8", 0, 40, False),
    ]
    v = verdict(fp, rows)
    assert v.startswith("fingerprint reproduced") and v.endswith(
        "never corrupted (the alias depends on sizes): bucket 8 0/40."
    )
    rows[2]["corrupted_sessions"] = 5
    assert "never corrupted" not in verdict(fingerprint(rows), rows)
    # a bucket no step filled (40 sessions, bucket 48 after 40) is not measured, not "never corrupted"
    rows.append(dict(racy, bucket=48, sessions=0, corrupted_sessions=0))
    fp = fingerprint(rows)
    (b48,) = [c for c in fp if c["check"].endswith("bucket 48")]
    assert b48["holds"] is None and b48["why"].startswith("not measured")
    v = verdict(fp, rows)
    assert v.endswith("Not measured (no step filled the bucket): bucket 48.") and "0/0" not in v


def test_same_seed_same_matrix():
    prof = P.load(CI)
    small = {**prof["workload"], "sessions": 6, "seed": 3}
    runs = []
    for _ in range(2):
        dev = get("sim")
        dev.manual_seed(1)
        m = reproduce.corruption_matrix(
            dev, prof["model"], [1, 2], small, reproduce.Knobs(["bf16"], ["graph"], ["on"])
        )
        runs.append(
            json.dumps([m.rows, [{k: v for k, v in a.items() if "addr" not in k} for a in m.aliases]])
        )
    assert runs[0] == runs[1]
