"""Notebook 03 (stream-overlap toggles and the capture audit), executed by papermill with the ci profile."""
import json

from nblib import params as P
from nblib import suite
from nblib.model import LOGITS_POLICIES

CI = P.ROOT / "params" / "ci.yaml"


def test_notebook_03_names_the_race_where_it_corrupts_and_nowhere_else(ci_suite):
    tmp_path = ci_suite
    res = json.loads((tmp_path / "03_stream_overlap.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    assert all(c["holds"] for c in res["checks"]), res["checks"]
    rows = res["toggles"]
    assert len(rows) == len(LOGITS_POLICIES) * 2 * 2 * len(res["params"]["buckets"])
    assert any(r["corrupted_sessions"] for r in rows)                 # the bug shows somewhere ...
    for r in rows:
        racy = r["index_dtype"] == "bf16" and r["logits_policy"] == "transient" and r["overlap"] == "on"
        assert (r["hazards"] > 0) == racy, r                          # ... and the audit names exactly it
        if r["corrupted_sessions"]:
            assert "indexer.logits (side)" in r["tensors"] and "(main)" in r["tensors"]
    h = res["hazards"][0]
    assert h["first_tensor"] == "indexer.logits" and "_logits_buffer" in h["first_alloc"]
    assert "del logits" in h["first_free"] and h["reused"]
    assert res["verdict"].startswith("audit agrees")
    assert res["audit_one_capture_seconds"] < 5 and res["seconds"] < 30
    assert (tmp_path / "03_timeline.png").stat().st_size > 10_000
