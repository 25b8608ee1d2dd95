"""Notebook 04 (the fix, proved), executed by papermill with the ci profile on the simulator."""
import json

from nblib import params as P
from nblib import suite

CI = P.ROOT / "params" / "ci.yaml"


def test_notebook_04_proves_the_fixes_on_the_simulator(ci_suite):
    tmp_path = ci_suite
    res = json.loads((tmp_path / "04_persistent_buffer_fix.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    plan = res["plan"]
    assert plan["racy_buckets"], "the buggy overlap must corrupt somewhere on the ci profile"
    pooled = {p["variant"]: p for p in res["pooled"]}
    assert pooled["buggy overlap"]["corrupted_sessions"] > 0
    for v in ("overlap off", "persistent buffer", "record_stream"):
        assert pooled[v]["corrupted_sessions"] == 0, pooled[v]
        assert pooled[v]["sessions"] >= plan["needed"] and pooled[v]["hi"] < res["params"]["fix_target"]
    audit = {a["variant"]: a for a in res["audit"]}
    assert not audit["buggy overlap"]["ok"] and all(audit[v]["ok"] for v in pooled if v != "buggy overlap")
    checks = {c["check"]: c["holds"] for c in res["checks"]}
    assert all(v for k, v in checks.items() if "sessions" in k or "audit" in k), res["checks"]
    assert {t["variant"] for t in res["times"]} == set(pooled) and all(t["median_ms"] > 0 for t in res["times"])
    assert all(c["holds"] is None for c in res["checks"] if "decode step" in c["check"])  # sim: not judged
    assert (tmp_path / "04_step_times.png").exists()
