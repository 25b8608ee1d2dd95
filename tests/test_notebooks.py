"""The notebooks, executed headlessly by papermill with the ci profile on the simulator."""
import json
import shutil

import pytest
import yaml

from nblib import params as P
from nblib import reproduce, suite
from nblib.device import get

CI = P.ROOT / "params" / "ci.yaml"


@pytest.fixture
def ci_run(ci_suite):
    return ci_suite


def test_notebook_00_reproduces_the_fingerprint_on_sim(ci_run):
    res = json.loads((ci_run / "00_reproduce.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    assert all(c["holds"] for c in res["fingerprint"]), res["fingerprint"]
    bad = [r for r in res["matrix"] if r["index_dtype"] == "bf16" and r["mode"] == "graph"
           and r["overlap"] == "on" and r["bucket"] > 1]
    # intermittent, as in the campaign: some bucket's session rate strictly between 0 and 1
    assert any(0 < r["corrupted_sessions"] < r["sessions"] for r in bad)
    # the mechanism is shown: the corrupting bucket's logits shared bytes with a main-stream tensor
    corrupting = {r["bucket"] for r in bad if r["corrupted_sessions"]}
    assert any(a["bucket"] in corrupting and a["first"] == "indexer.logits" and a["second_stream"] == "main"
               for a in res["aliases"])
    assert res["seconds"] < 60
    assert (ci_run / "00_reproduce.html").stat().st_size > 10_000


def test_the_whole_suite_runs_and_the_index_shows_every_verdict(ci_run):
    index = json.loads((ci_run / "index.json").read_text())["notebooks"]
    assert [(r["notebook"], r["status"]) for r in index] == [(n, "ok") for n in suite.NOTEBOOKS]
    page = (ci_run / "index.html").read_text()
    for r in index:
        assert r["verdict"] and r["html"] in page and (ci_run / r["html"]).stat().st_size > 10_000
    # the writeup is built from the results alone, and every notebook's finding is in it
    text = (ci_run / "writeup.md").read_text()
    assert "5 of 5 notebooks finished" in text and "not run in this run" not in text
    for n in suite.NOTEBOOKS[:-1]:
        verdict = json.loads((ci_run / f"{n}.results.json").read_text())["verdict"]
        assert verdict[:60] in text, n


def test_same_seed_same_matrix():
    prof = P.load(CI)
    small = {**prof["workload"], "sessions": 6, "seed": 3}
    runs = []
    for _ in range(2):
        dev = get("sim")
        dev.manual_seed(1)
        rows, aliases = reproduce.corruption_matrix(dev, prof["model"], [1, 2], small, ["bf16"], ["graph"], ["on"],
                                                    progress=None)
        runs.append(json.dumps([rows, [{k: v for k, v in a.items() if "addr" not in k} for a in aliases]]))
    assert runs[0] == runs[1]


def test_a_failed_notebook_is_marked_failed_and_earlier_results_stay(ci_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(ci_run, out)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**P.load(CI), "index_dtypes": ["bf16", "int4"]}))
    with pytest.raises(SystemExit, match="00_reproduce failed: cell .*int4.*bf16, fp8"):
        suite.run(bad, out, only=["00"])
    rec = json.loads((out / "index.json").read_text())["notebooks"][0]
    assert rec["status"] == "failed" and "int4" in rec["error"]
    assert "failed" in (out / "index.html").read_text()


def test_profile_for_a_missing_backend_fails_before_running(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="use backend 'sim'"):
        suite.run(P.ROOT / "params" / "gpu.yaml", tmp_path)
    assert not any(tmp_path.iterdir())
