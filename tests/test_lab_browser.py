"""The live panels as a person meets them: `make lab` serves notebooks 00 to 04, 06 and 07 (the ci profile
injected as papermill injects it, less batch work no panel reads: lab_driver.LIGHTER), Debian's
Chromium opens each one, the panels are switched on in the parameters cell, every cell runs from the
Run menu, and one control is moved. Each test asserts that no cell shows an error, that the panel's
controls are on the page, and that what the panel shows for the new choice is what the library
returns for it, called here in the test's own process.

Screenshots of each live panel go to $NBLIB_LAB_SHOTS when it is set (docs/lab/ holds the committed
ones), else to the test's temporary folder."""

import json
import os
import shutil
from pathlib import Path

import pytest
from browsers import chromium_or_skip
from lab_driver import Lab, Notebook, Panel, browser, ci_copy

from nblib.backends.device import get
from nblib.core import stats
from nblib.core.paths import ROOT
from nblib.lab import pagemap
from nblib.schema import params as P
from nblib.studies import designs, engines, fix, method, overlap, protocol, reproduce

CI = P.load(ROOT / "params" / "ci.yaml")
WORKLOAD = {**CI["workload"], "seed": CI["seed"]}
NOTEBOOKS = ["00_reproduce", "01_canary", "02_graph_vs_eager", "03_stream_overlap",
             "04_persistent_buffer_fix", "06_audit_your_engine", "07_method_on_your_engine"]  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory, ci_suite):
    chromium_or_skip()
    from playwright.sync_api import sync_playwright  # the test extra's; absent in make test-newest's venv

    tmp = tmp_path_factory.mktemp("lab")
    root, out, state = tmp / "notebooks", tmp / "out", tmp / "state"
    # results go to a copy of the ci suite's run folder, as a user's lab session writes beside an
    # earlier run of the same profile: its stored eager steps and 00's rows are reused (the
    # notebooks' own cache, nblib.engine.references), the same numbers computed once
    shutil.copytree(ci_suite, out)
    for d in (root, state):
        d.mkdir()
    for name in NOTEBOOKS:
        ci_copy(name, root, out)
    server = Lab(root, state)
    try:
        with sync_playwright() as pw:
            b = browser(pw)
            yield dict(
                server=server,
                browser=b,
                root=root,
                out=out,
                shots=Path(os.environ.get("NBLIB_LAB_SHOTS", tmp)),
            )
            b.close()
    finally:
        server.stop()


@pytest.fixture
def live(lab, request):
    """Open the test's notebook, switch its panels on, run every cell; yields (page, panel)."""
    name = request.param
    page = lab["browser"].new_page(viewport={"width": 1400, "height": 1000})
    try:
        nb = Notebook(page, lab["server"], name)
        nb.switch_panels_on()
        nb.run_all()
        assert nb.errors() == []
        saved = nb.saved(lab["root"])
        outputs = [o for c in saved["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert [o for o in outputs if o["output_type"] == "error"] == []
        assert any("status: ok" in "".join(o.get("text", "")) for o in outputs)
        assert json.loads((lab["out"] / f"{name}.results.json").read_text())["status"] == "ok"
        yield page, Panel(page)
    finally:
        page.close()
        lab["server"].shut_kernels()


def shot(lab, panel, name):
    lab["shots"].mkdir(parents=True, exist_ok=True)
    path = lab["shots"] / f"{name}.png"
    panel.root.screenshot(path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def seeded_sim():
    dev = get("sim")
    dev.manual_seed(CI["seed"])  # what each panel run starts from (nblib.lab.widgets)
    return dev


def labels_of(panel, *labels):
    return [panel.control(k, label).count() for k, label in labels]


@pytest.mark.parametrize("live", ["00_reproduce"], indirect=True)
def test_00_the_matrix_panel_shows_what_corruption_matrix_returns_for_the_knobs_chosen(lab, live):
    _, panel = live
    knobs = [("select-multiple", "index dtype"), ("select-multiple", "mode"), ("select-multiple", "overlap")]
    assert labels_of(panel, *knobs, ("dropdown", "up to bucket")) == [1, 1, 1, 1]
    panel.select("index dtype", "bf16", multiple=True)
    panel.select("mode", "graph", multiple=True)
    panel.select("overlap", "on", multiple=True)
    panel.select("up to bucket", "2")
    assert not panel.click("run matrix").startswith("error")
    shown = panel.table("corruption by configuration and bucket")
    knobs = reproduce.Knobs(["bf16"], ["graph"], ["on"], CI["logits_policy"])
    rows = reproduce.corruption_matrix(seeded_sim(), CI["model"], [1, 2], WORKLOAD, knobs).rows
    keys = ["bucket", "corrupted_sessions", "sessions", "corrupted_steps", "steps"]
    assert [[r[k] for k in keys] for r in shown] == [[str(r[k]) for k in keys] for r in rows]
    shot(lab, panel, "00_reproduce")


@pytest.mark.parametrize("live", ["01_canary"], indirect=True)
def test_01_the_page_map_slider_shows_the_replay_pagemap_watch_recorded(lab, live):
    _, panel = live
    assert labels_of(panel, ("dropdown", "overlap"), ("dropdown", "bucket"), ("slider", "replay")) == [
        1,
        1,
        1,
    ]
    panel.select("overlap", "on")
    panel.select("bucket", "4")
    assert not panel.click("watch").startswith("error")
    run = pagemap.watch(
        seeded_sim(), CI["model"], CI["buckets"], WORKLOAD, "on", 4, "bf16", CI["logits_policy"]
    )
    panel.slide("replay")
    i = panel.slider_value("replay")
    st = run.steps[i]
    want = f"replay {st.index} of {len(run.steps)}: " + ", ".join(f"{k} {v}" for k, v in st.counts().items())
    assert panel.wait_status(f"^replay {st.index} of") == want
    shot(lab, panel, "01_canary")


@pytest.mark.parametrize("live", ["02_graph_vs_eager"], indirect=True)
def test_02_the_design_panel_walks_the_comparisons_designs_compare_made(lab, live):
    _, panel = live
    assert labels_of(panel, ("dropdown", "design"), ("slider", "runs"), ("slider", "comparison")) == [1, 1, 1]
    panel.select("design", "refs")
    assert not panel.click("run off and the design").startswith("error")
    result = designs.compare(
        seeded_sim(), CI["model"], CI["buckets"], WORKLOAD, protocol.seeds(CI["seed"], 2), ["off", "refs"],
        dict(logits_policy=CI["logits_policy"]), progress=None,
    )  # fmt: skip
    shown = panel.table("each arm on the protocol")
    assert [(r["design"], r["corrupted_sessions"], r["sessions"]) for r in shown] == [
        (a.design, str(a.corrupted_sessions), str(a.sessions)) for a in result.arms
    ]
    lines = [x for a in result.arms for x in a.lines]
    before = panel.status()
    panel.slide("comparison")
    assert panel.wait_status("\\S", other_than=before) == lines[1]
    shot(lab, panel, "02_graph_vs_eager")


def hazard_label(row):
    return (
        f"{row['kind']}: {row['first_op']} ({row['first_stream']}) on {row['first_tensor']} / "
        f"{row['second_op']} ({row['second_stream']}) on {row['second_tensor']}"
    )


@pytest.mark.parametrize("live", ["03_stream_overlap"], indirect=True)
def test_03_the_timeline_panel_lists_the_hazards_the_audit_names_in_the_bucket_chosen(lab, live):
    _, panel = live
    assert labels_of(panel, ("dropdown", "index dtype"), ("dropdown", "overlap"), ("dropdown", "logits")) == [
        1,
        1,
        1,
    ]
    assert not panel.click("capture + audit").startswith("error")
    panel.select("bucket", "4")
    report, _, _ = overlap.audit_model(
        get("sim"), CI["model"], CI["buckets"], "bf16", "on", CI["logits_policy"]
    )
    want = list(dict.fromkeys(hazard_label(h.row()) for h in report.by("bucket").get(4, [])))
    assert want, "the ci profile's bucket 4 capture has a hazard to light"
    panel.page.wait_for_function(
        "([el, n]) => el.querySelectorAll('option').length === n",
        arg=[panel.control("dropdown", "hazard").element_handle(), len(want)],
    )
    assert panel.options("hazard") == want
    shot(lab, panel, "03_stream_overlap")


@pytest.mark.parametrize("live", ["04_persistent_buffer_fix"], indirect=True)
def test_04_the_fix_panel_shows_the_corruption_run_variant_counts_for_the_choice(lab, live):
    _, panel = live
    assert labels_of(panel, ("select-multiple", "variants"), ("select-multiple", "buckets")) == [1, 1]
    panel.select("variants", fix.BUGGY, "persistent buffer", multiple=True)
    panel.select("buckets", "4", multiple=True)
    assert not panel.click("run variants").startswith("error")
    shown = panel.table("variant by bucket")
    want = []
    dev = seeded_sim()
    for v in (fix.BUGGY, "persistent buffer"):
        want += fix.run_variant(
            dev, CI["model"], [4], WORKLOAD, v, index_dtype="bf16", progress=lambda *a: None
        )
    assert [(r["variant"], r["bucket"], r["corrupted"]) for r in shown] == [
        (r["variant"], str(r["bucket"]), stats.fmt_rate(r["corrupted_sessions"], r["sessions"])) for r in want
    ]
    shot(lab, panel, "04_persistent_buffer_fix")


@pytest.mark.parametrize("live", ["06_audit_your_engine"], indirect=True)
def test_06_the_report_panel_shows_the_audit_of_the_target_chosen(lab, live):
    _, panel = live
    assert labels_of(panel, ("dropdown", "target"), ("dropdown", "backend")) == [1, 1]
    target = engines.TARGETS[1]
    panel.select("target", target.spec)
    _, _, reports = engines.audit_all([target], ["sim"], engines.REPLAYS)
    rep = reports[(target.spec, "sim")]
    want = (
        f"{rep.target} on sim: {rep.status}, {len(rep.hazards)} hazard(s), "
        f"{rep.ops} ops in {rep.captures} capture(s)"
    )
    assert panel.wait_status("^" + rep.target.replace(".", "\\.")) == want
    assert panel.root.locator("pre").inner_text().startswith(rep.text().splitlines()[0])
    shot(lab, panel, "06_audit_your_engine")


@pytest.mark.parametrize("live", ["07_method_on_your_engine"], indirect=True)
def test_07_the_method_panel_runs_the_form_chosen(lab, live):
    _, panel = live
    controls = [("dropdown", n) for n in ("model", "form", "probes", "backend")]
    assert labels_of(panel, *controls) == [1, 1, 1, 1]
    panel.select("model", "deepseek_v3")
    panel.select("form", "record_stream")
    panel.select("probes", "prealloc")
    assert not panel.click("run the method").startswith("error")
    want = method.run_one(seeded_sim(), "deepseek_v3", "record_stream", CI["confirm_replays"], "prealloc")
    (shown,) = panel.table(f"{want.target} on sim")
    keys = ("hazards", "confirmed", "forced", "natural", "probed", "design")
    assert {k: shown[k] for k in keys} == {k: str(getattr(want, k)) for k in keys}
    shot(lab, panel, "07_method_on_your_engine")
