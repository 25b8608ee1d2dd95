"""Notebooks 01 (canary) and 02 (graph vs eager), executed by papermill with the ci profile on sim."""
import json

import pytest

from nblib import params as P
from nblib import suite

CI = P.ROOT / "params" / "ci.yaml"


@pytest.fixture
def ci_run(ci_suite):
    return ci_suite


def test_notebook_01_canary(ci_run):
    res = json.loads((ci_run / "01_canary.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim" and res["seconds"] < 30
    assert res["corrupting_buckets"], "the canary's run should include corrupted sessions"
    c = res["canary_at_corrupting"]
    assert c["pages_changed"] > c["pages_expected"] > 0 and c["live_overwrites"] == 0
    assert res["verdict"].startswith("while sessions were corrupted")
    clean = [r for r in res["canary"] if r["overlap"] == "off"]
    assert clean and all(r["live_overwrites"] == r["free_page_writes"] == 0 for r in clean)


def test_notebook_02_graph_vs_eager(ci_run):
    res = json.loads((ci_run / "02_graph_vs_eager.results.json").read_text())
    assert res["status"] == "ok" and res["seconds"] < 30
    off, on = res["pooled"]
    assert (off["arm"], on["arm"]) == ("off", "on") and off["sessions"] == on["sessions"] > 0
    assert 0 <= res["fisher"]["p"] <= 1 and "Fisher p" in res["verdict"]
    assert res["gediff_summary"]["comparisons"] == sum(r.get("comparisons", 0) for r in res["arms"])
    assert [r["instrument"] for r in res["overhead"]] == ["neither", "canary", "gediff"]
    assert res["overhead"][0]["ratio"] == 1.0 and all(r["median_ms"] > 0 for r in res["overhead"])
    log = (ci_run / "02_graph_vs_eager.gediff.log").read_text().splitlines()
    assert len(log) == res["gediff_summary"]["comparisons"]
    index = {r["notebook"]: r["status"] for r in json.loads((ci_run / "index.json").read_text())["notebooks"]}
    assert index["01_canary"] == index["02_graph_vs_eager"] == "ok"
