"""The notebooks, executed headlessly by papermill with the ci profile on the simulator: the whole
suite runs once (the ci_suite fixture, as CI runs the main job) and each test reads that run."""

import json
import re
import shutil
import statistics

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from conclusions import displayed, missing, page_text
from index_writers import write_records
from PIL import Image
from scipy.stats import fisher_exact

from nblib.backends.device import get
from nblib.core.paths import MEASURING
from nblib.engine.model import LOGITS_POLICIES
from nblib.instruments.audit import zoo as audit_zoo
from nblib.instruments.gediff import DESIGNS
from nblib.publish import plots
from nblib.run import suite
from nblib.schema import params as P
from nblib.studies import fix, reproduce

CI = P.ROOT / "params" / "ci.yaml"
SAVE_DPI = 120  # the notebooks' fig.savefig(..., dpi=120)


def shows(path, text):
    """Whether the page at path shows text (markdown may have set parts of it in tags)."""
    return " ".join(re.sub(r"[*`]", "", text).split()) in re.sub(r"[*`]", "", page_text(path))


def check_figure(path, redrawn=None):
    """A PNG a notebook saved: as many pixels as the figure redrawn from results.json at the
    notebook's dpi (when it can be redrawn from them), and ink on it: not a blank canvas."""
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    h, w = rgb.shape[:2]
    if redrawn is not None:
        want = tuple(round(x) for x in redrawn.get_size_inches() * SAVE_DPI)
        plt.close(redrawn)
        assert (w, h) == want, (path.name, (w, h), want)
    inked = (np.abs(rgb - rgb[0, 0]).sum(axis=2) > 48).mean()  # differs from the corner's background
    assert inked > 0.02, (path.name, inked)
    return w, h


def expected_explanation(res, alpha=0.05):
    """What notebook 02's explanation must say, recomputed from the recorded counts with scipy's
    Fisher test (not the suite's): each arm's effect, the signature (the rate falls with zero
    divergence) and the recommendation (the rate unchanged and the planted divergence caught; the
    cheapest side branch, mean over the buckets where off has aliasing pairs, among those)."""
    off, arms = res["off"], res["designs"]
    effect = {}
    for a in arms:
        table = [[a["corrupted_sessions"], a["sessions"] - a["corrupted_sessions"]]]
        table.append([off["corrupted_sessions"], off["sessions"] - off["corrupted_sessions"]])
        p = fisher_exact(table).pvalue
        higher = a["corrupted_sessions"] / a["sessions"] > off["corrupted_sessions"] / off["sessions"]
        effect[a["design"]] = "unchanged" if p >= alpha else "raises" if higher else "lowers"
    diffs = [a for a in arms if a["design"] in DESIGNS]
    signature = [a["design"] for a in diffs if effect[a["design"]] == "lowers" and a["diverged"] == 0]
    racy = [b["bucket"] for b in off["buckets"] if b["pairs"]] or [b["bucket"] for b in off["buckets"]]
    fine = [a for a in diffs if effect[a["design"]] == "unchanged" and a["planted_caught"]]
    side = lambda a: statistics.mean(a["side_ms"][str(b)] for b in racy)
    return effect, signature, min(fine, key=side)["design"] if fine else None


def test_notebook_00_reproduces_the_fingerprint_on_sim(ci_suite):
    res = json.loads((ci_suite / "00_reproduce.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    checks = res["fingerprint"]["checks"]
    pooled = [c for c in checks if c["scope"] == "pooled"]
    assert len(pooled) == 5 and all(c["holds"] for c in pooled), checks
    # the pooled corrupting rate results.json promises, equal to the first pooled check
    fp = res["fingerprint"]
    assert (fp["corrupted_sessions"], fp["sessions"]) == (pooled[0]["corrupted"], pooled[0]["sessions"])
    assert (
        0 <= fp["corrupted_steps"] <= fp["steps"] and fp["step_rate"] == fp["corrupted_steps"] / fp["steps"]
    )
    # the corrupting configuration, bucket by bucket: one row per bucket > 1, adding up to the pool
    per = [c for c in checks if c["scope"] == "bucket"]
    assert [c["check"].rsplit(" ", 1)[1] for c in per] == [str(b) for b in res["params"]["buckets"] if b > 1]
    assert sum(c["corrupted"] for c in per) == pooled[0]["corrupted"]
    assert sum(c["sessions"] for c in per) == pooled[0]["sessions"]
    assert all(c["holds"] == (c["corrupted"] > 0) for c in per)
    assert ("never corrupted" in res["verdict"]) == any(not c["holds"] for c in per)
    bad = [
        r
        for r in res["matrix"]
        if r["index_dtype"] == "bf16" and r["mode"] == "graph" and r["overlap"] == "on" and r["bucket"] > 1
    ]
    # intermittent, as in the campaign: some bucket's session rate strictly between 0 and 1
    assert any(0 < r["corrupted_sessions"] < r["sessions"] for r in bad)
    # the mechanism is shown: the corrupting bucket's logits shared bytes with a main-stream tensor
    corrupting = {r["bucket"] for r in bad if r["corrupted_sessions"]}
    assert any(
        a["bucket"] in corrupting and a["first"] == "indexer.logits" and a["second_stream"] == "main"
        for a in res["aliases"]
    )
    assert shows(ci_suite / "00_reproduce.html", res["verdict"])  # the page shows the run's verdict
    # the campaign's protocol: every run counted, the pool their sum, the dispersion test recorded
    proto = res["protocol"]
    assert len(proto["runs"]) == res["params"]["protocol_runs"]
    pooled = proto["pooled"]
    assert pooled["corrupted_sessions"] == sum(r["corrupted_sessions"] for r in proto["runs"]) > 0
    assert pooled["sessions"] == sum(r["sessions"] for r in proto["runs"])
    assert pooled["lo"] <= pooled["corrupted_sessions"] / pooled["sessions"] <= pooled["hi"]
    assert 0 <= proto["dispersion_p"] <= 1 and f"chi-square p = {proto['dispersion_p']:.2g}" in res["verdict"]
    checks = {(c["index_dtype"], c["mode"], c["overlap"]): c for c in res["protocol_checks"]}
    assert set(checks) == {
        ("bf16", "graph", "on"),
        ("fp8", "graph", "on"),
        ("bf16", "eager", "on"),
        ("bf16", "graph", "off"),
    }
    assert all(c["holds"] for c in checks.values()), checks
    assert res["verdict"].startswith("The campaign's protocol, bf16 + graph + overlap on")


def test_the_whole_suite_runs_and_the_index_shows_every_verdict(ci_suite):
    index = json.loads((ci_suite / "index.json").read_text())["notebooks"]
    assert [(r["notebook"], r["status"]) for r in index] == [(n, "ok") for n in suite.NOTEBOOKS]
    page = (ci_suite / "index.html").read_text()
    for r in index:
        assert r["verdict"] and r["html"] in page and shows(ci_suite / r["html"], r["verdict"]), r["html"]
        # each page opens offline: no script or stylesheet from the network (MathJax, require.js)
        assert not re.search(r'(src|href)="https?://', (ci_suite / r["html"]).read_text()), r["html"]
    # the writeup is built from the results alone, and every notebook's finding is in it
    text = (ci_suite / "writeup.md").read_text()
    assert "5 of 5 notebooks finished" in text and "not run in this run" not in text
    for n in MEASURING:  # what the writeup reads (06 stands apart from it)
        verdict = json.loads((ci_suite / f"{n}.results.json").read_text())["verdict"]
        assert verdict[:60] in text, n


def test_same_seed_same_matrix():
    prof = P.load(CI)
    small = {**prof["workload"], "sessions": 6, "seed": 3}
    runs = []
    for _ in range(2):
        dev = get("sim")
        dev.manual_seed(1)
        rows, aliases = reproduce.corruption_matrix(
            dev, prof["model"], [1, 2], small, ["bf16"], ["graph"], ["on"], progress=None
        )
        runs.append(json.dumps([rows, [{k: v for k, v in a.items() if "addr" not in k} for a in aliases]]))
    assert runs[0] == runs[1]


def test_a_failed_notebook_is_marked_failed_and_earlier_results_stay(ci_suite, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(ci_suite, out)
    bad = tmp_path / "bad.yaml"
    # a profile the schema accepts but the engine cannot run: too few cache pages for the sessions
    prof = {k: v for k, v in P.load(CI).items()}
    bad.write_text(yaml.safe_dump({**prof, "model": {**prof["model"], "num_pages": 4}}))
    with pytest.raises(SystemExit, match="00_reproduce failed: cell .*out of cache pages"):
        suite.run(bad, out, only=["00"])
    index = json.loads((out / "index.json").read_text())["notebooks"]
    rec = index[0]
    assert rec["status"] == "failed" and "out of cache pages" in rec["error"]
    assert [r["status"] for r in index[1:]] == ["ok"] * (len(suite.NOTEBOOKS) - 1)  # earlier results stay
    assert "failed" in (out / "index.html").read_text()


def test_profile_for_a_missing_backend_fails_before_running(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="use backend 'sim'"):
        suite.run(P.ROOT / "params" / "gpu.yaml", tmp_path)
    assert not any(tmp_path.iterdir())


def test_notebook_01_canary(ci_suite):
    res = json.loads((ci_suite / "01_canary.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    # it records what ran (bf16, graphs), not the profile's lists it never used
    assert res["fixed"] == dict(index_dtype="bf16", mode="graph")
    assert "index_dtypes" not in res["params"] and "modes" not in res["params"]
    assert {r["index_dtype"] for r in res["canary"]} == {"bf16"}
    assert {r["overlap"] for r in res["canary"]} == set(res["params"]["overlaps"])
    assert res["corrupting_buckets"], "the canary's run should include corrupted sessions"
    c = res["canary_at_corrupting"]
    assert c["pages_changed"] > c["pages_expected"] > 0 and c["live_overwrites"] == 0
    assert res["verdict"].startswith("while sessions were corrupted")
    clean = [r for r in res["canary"] if r["overlap"] == "off"]
    assert clean and all(r["live_overwrites"] == r["free_page_writes"] == 0 for r in clean)


def test_notebook_02_separates_timing_from_a_race_taken_away_under_the_forced_order(ci_suite):
    res = json.loads((ci_suite / "02_graph_vs_eager.results.json").read_text())
    forced = {r["design"]: r for r in res["forced"]}
    assert list(forced) == ["off", "canary", "campaign", "prealloc", "main_stash", "refs"]
    racy = sorted({h["bucket"] for a in [res["off"]] for h in a["buckets"] if h["hazards"]})
    assert all(r["buckets"] == racy for r in forced.values())  # off's hazard buckets, every arm
    assert forced["off"]["differing"] > 0 and forced["off"]["hazards"] == res["off"]["hazards"]
    # refs keeps the logits alive until the join: no hazard left, its branches forced stay equal
    assert forced["refs"]["hazards"] == 0 and forced["refs"]["differing"] == 0 and forced["refs"]["schedules"]
    # the copying designs leave the race in their graphs: forced, they corrupt like off
    assert all(forced[d]["differing"] > 0 for d in ("campaign", "prealloc", "main_stash"))
    assert "refs stays equal to eager" in res["forced_verdict"]


def test_notebook_02_graph_vs_eager(ci_suite):
    res = json.loads((ci_suite / "02_graph_vs_eager.results.json").read_text())
    assert res["status"] == "ok"
    assert res["fixed"] == dict(index_dtype="bf16", mode="graph", overlap="on")
    assert not {"index_dtypes", "modes", "overlaps"} & set(res["params"])
    off, arms = res["off"], res["designs"]
    assert [a["design"] for a in arms] == ["canary", "campaign", "prealloc", "main_stash", "refs"]
    runs = res["params"]["protocol_runs"]
    for a in [off, *arms]:  # every arm ran the same protocol: the same sessions, seeds and steps
        assert a["sessions"] == off["sessions"] == runs * res["params"]["workload"]["sessions"]
        assert len(a["runs"]) == runs and sum(a["runs"]) == a["corrupted_sessions"]
        assert a["steps"] == off["steps"]
        assert (
            {int(b) for b in a["side_ms"]} == set(res["params"]["buckets"]) == {int(b) for b in a["main_ms"]}
        )
        assert all(v > 0 for v in [*a["side_ms"].values(), *a["main_ms"].values()])
    for a in arms:  # the recorded p is Fisher's exact test on the recorded counts (scipy's, directly)
        table = [[off["corrupted_sessions"], off["sessions"] - off["corrupted_sessions"]]]
        table.append([a["corrupted_sessions"], a["sessions"] - a["corrupted_sessions"]])
        assert a["fisher_p"] == pytest.approx(fisher_exact(table).pvalue, rel=1e-12)
    diffs = [a for a in arms if a["design"] != "canary"]
    # every differential compared after every replay, and caught the planted divergence
    assert all(a["comparisons"] == off["steps"] and a["planted_caught"] for a in diffs)
    assert arms[0]["comparisons"] == 0 and arms[0]["planted_caught"] is None
    # references keep the logits block alive: nothing is handed on, nothing races, nothing diverges
    refs = arms[-1]
    assert refs["pairs"] == 0 and refs["corrupted_sessions"] == refs["diverged"] == 0
    assert off["pairs"] > 0 and off["corrupted_sessions"] > 0
    # the explanation's conclusions, against the same rules recomputed from the recorded counts
    effect, signature, recommended = expected_explanation(res)
    assert {f["design"]: f["effect"] for f in res["explanation"]["findings"]} == effect
    assert effect["refs"] == "lowers" and "refs" in signature
    assert (res["signature"], res["recommended"]) == (signature, recommended)
    assert f"Recommended: {recommended or 'none'}" in res["verdict"]
    check_figure(
        ci_suite / "02_designs.png", plots.design_rates([off, *arms], res["explanation"]["findings"])
    )
    neither, *instruments = res["overhead"]
    assert [r["instrument"] for r in res["overhead"]] == ["neither", "canary", "canary_graphed", "gediff"]
    assert neither["ratio"] is None and neither["calls"] == 0 and neither["median_ms"] > 0
    for r in instruments:  # each instrument ran at every replay, and its ratio is against neither
        assert r["calls"] == r["replays"] + r["warmup"] and r["replays"] == res["params"]["replays"]
        assert r["ratio"] == pytest.approx(r["median_ms"] / neither["median_ms"])
        assert f"{r['instrument']} x{r['ratio']:.2f}" in res["verdict"]
    log = (ci_suite / "02_graph_vs_eager.gediff.log").read_text().splitlines()
    assert len(log) == sum(a["comparisons"] for a in res["designs"])
    assert {line.split(":")[0] for line in log} == {a["design"] for a in diffs}
    index = {
        r["notebook"]: r["status"] for r in json.loads((ci_suite / "index.json").read_text())["notebooks"]
    }
    assert index["01_canary"] == index["02_graph_vs_eager"] == "ok"


def racy_row(r):
    return r["index_dtype"] == "bf16" and r["logits_policy"] == "transient" and r["overlap"] == "on"


def test_notebook_03_names_the_race_where_it_corrupts_and_nowhere_else(ci_suite):
    res = json.loads((ci_suite / "03_stream_overlap.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    assert all(c["holds"] for c in res["checks"]), res["checks"]
    rows = res["toggles"]
    assert len(rows) == len(LOGITS_POLICIES) * 2 * 2 * len(res["params"]["buckets"])
    assert any(r["corrupted_sessions"] for r in rows)  # the bug shows somewhere ...
    for r in rows:
        racy = r["index_dtype"] == "bf16" and r["logits_policy"] == "transient" and r["overlap"] == "on"
        # ... the audit names a race wherever it corrupted, and never in a configuration without one
        assert r["hazards"] > 0 if racy and r["corrupted_sessions"] else True, r
        assert r["hazards"] == 0 if not racy else True, r
        if r["corrupted_sessions"]:
            assert "indexer.logits (side)" in r["tensors"] and "(main)" in r["tensors"]
    assert any(r["hazards"] for r in rows if r["bucket"] > 1), "the audit names the race nowhere"
    # the graphs as built agree with the audit: every forked capture, and every zoo scenario
    graph = res["graph_check"]
    assert {(r["logits_policy"], r["index_dtype"]) for r in graph} == {
        (p, d) for p in LOGITS_POLICIES for d in ("bf16", "fp8")
    }
    assert all(r["agree"] and r["source"] == "simulator" for r in graph), graph
    bug = [r for r in graph if r["logits_policy"] == "transient" and r["index_dtype"] == "bf16"]
    assert any(r["confirmed"] for r in bug)
    assert not any(r["hazards"] or r["missed"] for r in graph if r["logits_policy"] != "transient")
    # every scenario of the zoo, its planted race and its twin, once each
    assert sorted((z["case"], z["variant"]) for z in res["zoo"]) == sorted(
        (c.name, v) for c in audit_zoo.CASES for v in ("race", "twin")
    )
    assert all(z["right"] and z["graph_agrees"] for z in res["zoo"])
    assert "DISAGREE" not in res["graph_verdict"] and "failed" not in res["graph_verdict"]
    # the transient rows are notebook 00's own replays (same commit and parameters), not a second run
    assert res["transient_rows_from"] == "00_reproduce"
    r0 = json.loads((ci_suite / "00_reproduce.results.json").read_text())
    key = lambda r: (r["index_dtype"], r["overlap"], r["bucket"])
    ran = {key(m): m["corrupted_sessions"] for m in r0["matrix"] if m["mode"] == "graph"}
    assert {key(r): r["corrupted_sessions"] for r in rows if r["logits_policy"] == "transient"} == ran
    # the fixes are replayed with overlap on in bf16; with overlap off nothing forks, and fp8 hands
    # no logits across, so those rows are not replayed and say why
    for r in rows:
        if r["logits_policy"] != "transient":
            skipped = r["overlap"] == "off" or r["index_dtype"] == "fp8"
            assert (r["sessions"] is None) == skipped == bool(r["not_replayed"]), r
    h = res["hazards"][0]
    assert h["first_tensor"] == "indexer.logits" and "_logits_buffer" in h["first_alloc"]
    assert "del logits" in h["first_free"] and h["reused"]
    assert res["verdict"].startswith("audit agrees")
    assert res["fixed"]["mode"] == "graph" and sorted(res["fixed"]["logits_policies"]) == sorted(
        LOGITS_POLICIES
    )
    # every hazard forced: the side's top-k read of the logits, delayed until the MLP has written the
    # block, changes the step's values in every bucket with a hazard; the verdict is on the page
    forced = res["forced"]
    assert {r["bucket"] for r in forced} == {r["bucket"] for r in rows if racy_row(r) and r["hazards"]}
    topk = [r for r in forced if r["delayed"].startswith("aten::topk")]
    assert topk and all(r["differing"] > 0 and r["replays"] == 3 for r in topk)
    verdict = res["forced_verdict"]
    assert verdict.startswith("Under the forced order") and "aten::topk" in verdict
    w, h = check_figure(ci_suite / "03_timeline.png")  # drawn from a trace results.json does not keep
    assert w > h  # one lane per stream across the page


def test_notebook_04_proves_the_fixes_on_the_simulator(ci_suite):
    res = json.loads((ci_suite / "04_persistent_buffer_fix.results.json").read_text())
    assert res["status"] == "ok" and res["backend"] == "sim"
    assert res["fixed"] == dict(index_dtype="bf16", mode="graph", variants=list(fix.VARIANTS))
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
    assert {t["variant"] for t in res["times"]} == set(pooled) and all(
        t["median_ms"] > 0 for t in res["times"]
    )
    assert all(c["holds"] is None for c in res["checks"] if "decode step" in c["check"])  # sim: not judged
    check_figure(ci_suite / "04_step_times.png", plots.step_times(res["times"], res["fixed"]["variants"]))


def test_results_record_the_parameters_applied_after_defaults(ci_suite):
    """Each notebook's results.json holds the keys it declares, as applied: the profile's values,
    the schema's defaults for what the profile leaves out (workload.out_tol, replays), and the run's
    output_dir."""
    profile = P.load(CI)
    assert "out_tol" not in yaml.safe_load(CI.read_text())["workload"]  # so it comes from a default
    for name in suite.NOTEBOOKS:
        res = json.loads((ci_suite / f"{name}.results.json").read_text())
        want = {k: profile[k] for k in P.DECLARES[name] if k in profile}
        want.update(output_dir=str(ci_suite.resolve()), INTERACTIVE=False)
        assert res["params"] == want, name
    assert json.loads((ci_suite / "00_reproduce.results.json").read_text())["params"]["workload"]["out_tol"]


def test_notebook_07_names_proves_watches_and_fixes_the_race_in_code_written_elsewhere(ci_suite):
    res = json.loads((ci_suite / "07_method_on_your_engine.results.json").read_text())
    assert res["status"] == "ok" and res["design"] == "main_stash"
    rows = {(r["model"], r["form"]): r for r in res["rows"]}
    assert set(rows) == {(m, f) for m in ("qwen2_moe", "deepseek_v3") for f in ("buggy", "record_stream")}
    n = res["params"]["confirm_replays"]
    for m in ("qwen2_moe", "deepseek_v3"):
        bug, fix = rows[(m, "buggy")], rows[(m, "record_stream")]
        assert bug["hazards"] > 0 and bug["confirmed"] == bug["hazards"]  # every hazard proved
        done, of = map(int, bug["forced"].split("/"))
        assert done == of and of % n == 0  # every forced replay differed from eager
        assert fix["hazards"] == 0 and fix["forced"].startswith("0/") and fix["natural"] == f"0/{n}"
    assert "confirm: hazard 1 confirmed" in res["confirm_report"]
    assert "The fix (record_stream): no hazard" in res["verdict"]


def test_lanes_keep_03_after_00_and_leave_05_for_last():
    nbs = list(suite.NOTEBOOKS)
    plan = suite.lane_plan(nbs, 2)
    assert plan == [
        ["00_reproduce", "03_stream_overlap", "07_method_on_your_engine"],
        ["01_canary", "02_graph_vs_eager", "04_persistent_buffer_fix", "06_audit_your_engine"],
    ]
    assert suite.lane_plan(nbs, 1) == [] and suite.lane_plan(nbs, 8) == plan  # more lanes than LANES
    assert suite.lane_plan(["00_reproduce", "05_report"], 2) == []  # one busy lane: plain run
    with pytest.raises(ValueError, match="--lanes must be a positive integer"):
        suite.lane_plan(nbs, 0)


def test_each_lane_gets_its_share_of_the_cores_for_torchs_threads_and_its_gpu():
    two = suite.lane_env({"PATH": "/bin"}, None, lanes=2, cores=2)
    assert two["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in two and two["PATH"] == "/bin"
    assert suite.lane_env({}, "1", lanes=2, cores=16)["OMP_NUM_THREADS"] == "8"
    assert suite.lane_env({}, "1", lanes=2, cores=16)["CUDA_VISIBLE_DEVICES"] == "1"
    assert suite.lane_env({}, None, lanes=4, cores=2)["OMP_NUM_THREADS"] == "1"  # never 0
    assert suite.lane_env({"OMP_NUM_THREADS": "3"}, None, 2, 2)["OMP_NUM_THREADS"] == "3"  # the user's


def test_auto_lanes_are_one_per_core_on_the_simulator_and_one_per_gpu_on_cuda(monkeypatch):
    from nblib.backends import device

    monkeypatch.setattr(suite.os, "cpu_count", lambda: 1)
    assert suite.resolve_lanes("auto", "sim") == 1
    monkeypatch.setattr(suite.os, "cpu_count", lambda: 16)
    assert suite.resolve_lanes("auto", "sim") == len(suite.LANES)
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    assert suite.resolve_lanes("auto", "cuda") == 1  # 16 cores, one GPU: one lane
    assert suite.resolve_lanes(3, "cuda") == 3  # a number stays as given


def test_lanes_ask_for_one_gpu_each_before_running(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="--lanes 2 needs 2 GPUs, this machine has 1: pass --lanes 1"):
        suite._lane_gpus(type("Dev", (), {"name": "cuda"})(), 2)
    assert suite._lane_gpus(type("Dev", (), {"name": "sim"})(), 2) == [None, None]


def test_a_bench_run_drops_the_stored_eager_steps_and_a_plain_run_keeps_them(tmp_path, monkeypatch):
    """A speed table must time what a first run computes: eager steps an earlier run of the same
    source stored in the folder would make the references phase look free."""
    ran = []
    monkeypatch.setattr(suite, "_run_each", lambda notebooks, *a: ran.append(list(notebooks)) or [])
    store = tmp_path / "run" / ".references" / "digest"
    for fresh, kept in ((False, True), (True, False)):
        store.mkdir(parents=True, exist_ok=True)
        (store / "steps.pt").write_bytes(b"x")
        suite.run(P.ROOT / "params" / "ci.yaml", tmp_path / "run", ["05"], lanes=1, fresh=fresh)
        assert store.exists() == kept
    assert ran == [["05_report"], ["05_report"]]


def test_lanes_writing_one_index_lose_no_record(tmp_path):
    import multiprocessing

    names = [[f"{lane}{i:03d}" for i in range(60)] for lane in "ab"]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=write_records, args=(tmp_path, n, barrier)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    index = json.loads((tmp_path / "index.json").read_text())["notebooks"]
    assert sorted(r["notebook"] for r in index) == sorted(names[0] + names[1])


def test_a_sigterm_inside_one_of_the_event_loops_tasks_stops_the_run():
    """papermill waits in an asyncio loop; SIGTERM lands in whichever task is running. There the
    suite's stop must come out of the loop, not stay as that task's result, which nothing reads,
    while the notebook runs on to the end (seen once as a run that finished ok after SIGTERM)."""
    import asyncio
    import os
    import signal

    from nblib.run import suite

    async def side():  # nbclient's output poll, say: the handler runs inside this task's step
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0)

    tasks = []

    async def cell():
        tasks.append(asyncio.ensure_future(side()))
        await asyncio.sleep(0.5)
        return "ran on"

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(suite.Stopped, match="stopped by signal 15"), suite._stop_on_sigterm():
            loop.run_until_complete(cell())
    finally:
        loop.close()
    assert isinstance(tasks[0].exception(), suite.Stopped)  # read: asyncio logs an unread one


def test_a_notebook_stopped_by_a_time_limit_is_marked_failed(tmp_path):
    """`timeout` (SIGTERM) around a run: the notebook in flight is recorded failed, saying why."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "nblib", "run", "--params", str(CI), "--out", str(out), "--only", "00"]
    p = subprocess.Popen(cmd, cwd=P.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "00_reproduce.results.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the notebook has started once its results.json says "running"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "stopped by signal 15" in err
    rec = json.loads((out / "index.json").read_text())["notebooks"][0]
    assert rec["notebook"] == "00_reproduce" and rec["status"] == "failed"
    assert "stopped by signal 15" in rec["error"]


@pytest.mark.parametrize("name", suite.NOTEBOOKS)
def test_every_conclusion_a_notebook_computes_is_displayed_in_its_executed_copy(ci_suite, name):
    """Read from the .ipynb's outputs, as a reader of the executed notebook meets them: each verdict,
    00's protocol verdict, 02's explanation and recommendation, 03's hazard sentences, 04's checks."""
    res = json.loads((ci_suite / f"{name}.results.json").read_text())
    assert missing(res, displayed(ci_suite / f"{name}.ipynb")) == []
