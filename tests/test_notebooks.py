"""The notebooks, executed headlessly by papermill with the ci profile on the simulator: the whole
suite runs once (the ci_suite fixture, as CI runs the main job) and each test reads that run."""

import json
import re
import statistics

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from conclusions import displayed, missing, page_text
from PIL import Image
from scipy.stats import fisher_exact

from nblib.core.paths import MEASURING
from nblib.engine.model import LOGITS_POLICIES
from nblib.instruments.audit import zoo as audit_zoo
from nblib.instruments.gediff import DESIGNS
from nblib.publish import plots
from nblib.run import suite
from nblib.schema import params as P
from nblib.studies import fix

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


def results(ci_suite, name):
    """The results.json notebook `name` wrote in the shared ci run."""
    return json.loads((ci_suite / f"{name}.results.json").read_text())


def test_notebook_00_reproduces_the_fingerprint_on_sim(ci_suite):
    res = results(ci_suite, "00_reproduce")
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


def test_notebook_00_counts_the_corrupting_configuration_bucket_by_bucket(ci_suite):
    res = results(ci_suite, "00_reproduce")
    checks = res["fingerprint"]["checks"]
    pooled = [c for c in checks if c["scope"] == "pooled"]
    # the corrupting configuration, bucket by bucket: one row per bucket > 1, adding up to the pool
    per = [c for c in checks if c["scope"] == "bucket"]
    assert [c["check"].rsplit(" ", 1)[1] for c in per] == [str(b) for b in res["params"]["buckets"] if b > 1]
    assert sum(c["corrupted"] for c in per) == pooled[0]["corrupted"]
    assert sum(c["sessions"] for c in per) == pooled[0]["sessions"]
    assert all(c["holds"] == (c["corrupted"] > 0) for c in per)
    assert ("never corrupted" in res["verdict"]) == any(not c["holds"] for c in per)


def test_notebook_00_corrupts_intermittently_where_the_logits_share_bytes_with_main(ci_suite):
    res = results(ci_suite, "00_reproduce")
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


def test_notebook_00_page_shows_the_runs_verdict(ci_suite):
    res = results(ci_suite, "00_reproduce")
    assert shows(ci_suite / "00_reproduce.html", res["verdict"])


def test_notebook_00_counts_every_run_of_the_campaigns_protocol(ci_suite):
    res = results(ci_suite, "00_reproduce")
    # the campaign's protocol: every run counted, the pool their sum, the dispersion test recorded
    proto = res["protocol"]
    assert len(proto["runs"]) == res["params"]["protocol_runs"]
    pooled = proto["pooled"]
    assert pooled["corrupted_sessions"] == sum(r["corrupted_sessions"] for r in proto["runs"]) > 0
    assert pooled["sessions"] == sum(r["sessions"] for r in proto["runs"])
    assert pooled["lo"] <= pooled["corrupted_sessions"] / pooled["sessions"] <= pooled["hi"]
    assert 0 <= proto["dispersion_p"] <= 1 and f"chi-square p = {proto['dispersion_p']:.2g}" in res["verdict"]


def test_notebook_00_protocol_holds_for_the_racy_configuration_and_each_knob_changed(ci_suite):
    res = results(ci_suite, "00_reproduce")
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
    res = results(ci_suite, "02_graph_vs_eager")
    assert res["status"] == "ok"
    assert res["fixed"] == dict(index_dtype="bf16", mode="graph", overlap="on")
    assert not {"index_dtypes", "modes", "overlaps"} & set(res["params"])
    assert [a["design"] for a in res["designs"]] == ["canary", "campaign", "prealloc", "main_stash", "refs"]


def test_notebook_02_every_arm_ran_the_same_protocol(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    off, arms = res["off"], res["designs"]
    runs = res["params"]["protocol_runs"]
    for a in [off, *arms]:  # every arm ran the same protocol: the same sessions, seeds and steps
        assert a["sessions"] == off["sessions"] == runs * res["params"]["workload"]["sessions"]
        assert len(a["runs"]) == runs and sum(a["runs"]) == a["corrupted_sessions"]
        assert a["steps"] == off["steps"]
        assert (
            {int(b) for b in a["side_ms"]} == set(res["params"]["buckets"]) == {int(b) for b in a["main_ms"]}
        )
        assert all(v > 0 for v in [*a["side_ms"].values(), *a["main_ms"].values()])


def test_notebook_02_records_fishers_p_on_the_recorded_counts(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    off = res["off"]
    # the recorded p is Fisher's exact test on the recorded counts (scipy's, directly)
    for a in res["designs"]:
        table = [[off["corrupted_sessions"], off["sessions"] - off["corrupted_sessions"]]]
        table.append([a["corrupted_sessions"], a["sessions"] - a["corrupted_sessions"]])
        assert a["fisher_p"] == pytest.approx(fisher_exact(table).pvalue, rel=1e-12)


def test_notebook_02_every_differential_compares_every_replay_and_catches_the_plant(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    off, arms = res["off"], res["designs"]
    diffs = [a for a in arms if a["design"] != "canary"]
    # every differential compared after every replay, and caught the planted divergence
    assert all(a["comparisons"] == off["steps"] and a["planted_caught"] for a in diffs)
    assert arms[0]["comparisons"] == 0 and arms[0]["planted_caught"] is None


def test_notebook_02_references_hand_nothing_on_and_so_nothing_races(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    off, arms = res["off"], res["designs"]
    # references keep the logits block alive: nothing is handed on, nothing races, nothing diverges
    refs = arms[-1]
    assert refs["pairs"] == 0 and refs["corrupted_sessions"] == refs["diverged"] == 0
    assert off["pairs"] > 0 and off["corrupted_sessions"] > 0


def test_notebook_02_explanation_follows_the_rules_recomputed_from_the_counts(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    # the explanation's conclusions, against the same rules recomputed from the recorded counts
    effect, signature, recommended = expected_explanation(res)
    assert {f["design"]: f["effect"] for f in res["explanation"]["findings"]} == effect
    assert effect["refs"] == "lowers" and "refs" in signature
    assert (res["signature"], res["recommended"]) == (signature, recommended)
    assert f"Recommended: {recommended or 'none'}" in res["verdict"]


def test_notebook_02_designs_figure_is_the_one_its_results_draw(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    off, arms = res["off"], res["designs"]
    check_figure(
        ci_suite / "02_designs.png", plots.design_rates([off, *arms], res["explanation"]["findings"])
    )


def test_notebook_02_times_each_instrument_against_neither(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    neither, *instruments = res["overhead"]
    assert [r["instrument"] for r in res["overhead"]] == ["neither", "canary", "canary_graphed", "gediff"]
    assert neither["ratio"] is None and neither["calls"] == 0 and neither["median_ms"] > 0
    for r in instruments:  # each instrument ran at every replay, and its ratio is against neither
        assert r["calls"] == r["replays"] + r["warmup"] and r["replays"] == res["params"]["replays"]
        assert r["ratio"] == pytest.approx(r["median_ms"] / neither["median_ms"])
        assert f"{r['instrument']} x{r['ratio']:.2f}" in res["verdict"]


def test_notebook_02_logs_one_line_per_comparison_of_each_differential(ci_suite):
    res = results(ci_suite, "02_graph_vs_eager")
    diffs = [a for a in res["designs"] if a["design"] != "canary"]
    log = (ci_suite / "02_graph_vs_eager.gediff.log").read_text().splitlines()
    assert len(log) == sum(a["comparisons"] for a in res["designs"])
    assert {line.split(":")[0] for line in log} == {a["design"] for a in diffs}


def test_notebook_02_and_the_canary_it_times_are_ok_in_the_index(ci_suite):
    index = {
        r["notebook"]: r["status"] for r in json.loads((ci_suite / "index.json").read_text())["notebooks"]
    }
    assert index["01_canary"] == index["02_graph_vs_eager"] == "ok"


def racy_row(r):
    return r["index_dtype"] == "bf16" and r["logits_policy"] == "transient" and r["overlap"] == "on"


def test_notebook_03_names_the_race_where_it_corrupts_and_nowhere_else(ci_suite):
    res = results(ci_suite, "03_stream_overlap")
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


def test_notebook_03_graphs_as_built_agree_with_the_audit_on_every_forked_capture(ci_suite):
    graph = results(ci_suite, "03_stream_overlap")["graph_check"]
    assert {(r["logits_policy"], r["index_dtype"]) for r in graph} == {
        (p, d) for p in LOGITS_POLICIES for d in ("bf16", "fp8")
    }
    assert all(r["agree"] and r["source"] == "simulator" for r in graph), graph
    bug = [r for r in graph if r["logits_policy"] == "transient" and r["index_dtype"] == "bf16"]
    assert any(r["confirmed"] for r in bug)
    assert not any(r["hazards"] or r["missed"] for r in graph if r["logits_policy"] != "transient")


def test_notebook_03_gets_every_zoo_scenario_right_once_each(ci_suite):
    res = results(ci_suite, "03_stream_overlap")
    # every scenario of the zoo, its planted race and its twin, once each
    assert sorted((z["case"], z["variant"]) for z in res["zoo"]) == sorted(
        (c.name, v) for c in audit_zoo.CASES for v in ("race", "twin")
    )
    assert all(z["right"] and z["graph_agrees"] for z in res["zoo"])
    assert "DISAGREE" not in res["graph_verdict"] and "failed" not in res["graph_verdict"]


def test_notebook_03_transient_rows_are_notebook_00s_replays(ci_suite):
    res = results(ci_suite, "03_stream_overlap")
    # the transient rows are notebook 00's own replays (same commit and parameters), not a second run
    assert res["transient_rows_from"] == "00_reproduce"
    r0 = results(ci_suite, "00_reproduce")
    key = lambda r: (r["index_dtype"], r["overlap"], r["bucket"])
    ran = {key(m): m["corrupted_sessions"] for m in r0["matrix"] if m["mode"] == "graph"}
    transient = [r for r in res["toggles"] if r["logits_policy"] == "transient"]
    assert {key(r): r["corrupted_sessions"] for r in transient} == ran


def test_notebook_03_replays_the_fixes_only_where_the_logits_cross_streams(ci_suite):
    # the fixes are replayed with overlap on in bf16; with overlap off nothing forks, and fp8 hands
    # no logits across, so those rows are not replayed and say why
    for r in results(ci_suite, "03_stream_overlap")["toggles"]:
        if r["logits_policy"] != "transient":
            skipped = r["overlap"] == "off" or r["index_dtype"] == "fp8"
            assert (r["sessions"] is None) == skipped == bool(r["not_replayed"]), r


def test_notebook_03_first_hazard_names_the_logits_allocation_free_and_reuse(ci_suite):
    res = results(ci_suite, "03_stream_overlap")
    h = res["hazards"][0]
    assert h["first_tensor"] == "indexer.logits" and "_logits_buffer" in h["first_alloc"]
    assert "del logits" in h["first_free"] and h["reused"]
    assert res["verdict"].startswith("audit agrees")
    assert res["fixed"]["mode"] == "graph" and sorted(res["fixed"]["logits_policies"]) == sorted(
        LOGITS_POLICIES
    )


def test_notebook_03_forced_order_changes_the_values_in_every_hazard_bucket(ci_suite):
    res = results(ci_suite, "03_stream_overlap")
    rows = res["toggles"]
    # every hazard forced: the side's top-k read of the logits, delayed until the MLP has written the
    # block, changes the step's values in every bucket with a hazard; the verdict says so
    forced = res["forced"]
    assert {r["bucket"] for r in forced} == {r["bucket"] for r in rows if racy_row(r) and r["hazards"]}
    topk = [r for r in forced if r["delayed"].startswith("aten::topk")]
    assert topk and all(r["differing"] > 0 and r["replays"] == 3 for r in topk)
    verdict = res["forced_verdict"]
    assert verdict.startswith("Under the forced order") and "aten::topk" in verdict


def test_notebook_03_timeline_figure_lays_one_lane_per_stream_across_the_page(ci_suite):
    w, h = check_figure(ci_suite / "03_timeline.png")  # drawn from a trace results.json does not keep
    assert w > h


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


@pytest.mark.parametrize("name", suite.NOTEBOOKS)
def test_every_conclusion_a_notebook_computes_is_displayed_in_its_executed_copy(ci_suite, name):
    """Read from the .ipynb's outputs, as a reader of the executed notebook meets them: each verdict,
    00's protocol verdict, 02's explanation and recommendation, 03's hazard sentences, 04's checks."""
    res = json.loads((ci_suite / f"{name}.results.json").read_text())
    assert missing(res, displayed(ci_suite / f"{name}.ipynb")) == []
