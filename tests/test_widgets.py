"""The live panels, headless: build each one on the simulator, set its controls, click, and check
what it produced against the batch path's own functions. No kernel or browser is needed: a
panel's results are plain widget values (HTML, PNG bytes) and its `state`."""

import ast
import html
import inspect

import ipywidgets as W
import nbformat
import pytest
import torch

from nblib.backends.device import get
from nblib.instruments import canary
from nblib.lab import pagemap, widgets
from nblib.lab.panel import Panel
from nblib.schema import params as P
from nblib.studies import designs, method, reproduce

CI = P.load(P.ROOT / "params" / "ci.yaml")
MODEL, BUCKETS = CI["model"], [1, 2]
SMALL = {**CI["workload"], "sessions": 6, "rounds": 1, "seed": 0}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def dev():
    d = get("sim")
    d.manual_seed(0)
    return d


def image(panel):
    return bytes(panel.figure.value)  # ipywidgets keeps it as a memoryview


def watch_progress(panel):
    seen = []
    panel.progress.observe(lambda ch: seen.append(ch["new"]), "value")
    return seen


def test_matrix_explorer_runs_the_chosen_knobs_through_the_batch_function(dev):
    p = widgets.matrix_explorer(dev, MODEL, BUCKETS, SMALL)
    p.controls["index_dtypes"].value = ("bf16",)
    p.controls["modes"].value = ("graph", "eager")
    p.controls["overlaps"].value = ("on",)
    p.controls["bucket"].value = 2
    seen = watch_progress(p)
    p.click()
    assert "error" not in p.state, p.state.get("error")
    dev.manual_seed(0)
    rows = reproduce.corruption_matrix(
        dev, MODEL, BUCKETS, SMALL, reproduce.Knobs(["bf16"], ["graph", "eager"], ["on"])
    ).rows
    assert p.state["rows"] == reproduce.with_intervals(rows)  # the same function, the same knobs
    assert seen == [1, 2]  # one tick per configuration, as each finished
    assert p.progress.value == p.progress.max == 2 and p.progress.bar_style == "success"
    assert p.view.value.count("<tr") >= 1 + len(rows) and "corrupted_sessions" in p.view.value
    assert image(p).startswith(PNG)


def test_a_bad_choice_says_so_in_one_line_and_runs_nothing(dev):
    p = widgets.matrix_explorer(dev, MODEL, BUCKETS, SMALL)
    p.controls["index_dtypes"].value = ()
    p.click()
    assert str(p.state["error"]) == "choose at least one index dtype"
    assert p.status.value == (
        "<span style='color:#a00'>error at &#x27;run matrix&#x27; with index dtype = (none), "
        "mode = (graph, eager), overlap = (on, off), up to bucket = 2: "
        "ValueError: choose at least one index dtype</span>"
    )
    assert p.progress.bar_style == "danger"
    assert "rows" not in p.state and not p.button.disabled  # usable again


def test_page_map_colours_each_page_as_the_canary_classes_it(dev):
    p = widgets.page_map(dev, MODEL, [1, 2, 4, 8], {**CI["workload"], "seed": 0})
    p.controls["overlap"].value, p.controls["bucket"].value = "on", 4
    p.click()
    run = p.state["run"]
    assert run.steps and run.summary["replays"] == len(run.steps)
    slider = p.extra[0]
    assert slider.max == len(run.steps) - 1 and not slider.disabled
    # every replay's map agrees with the canary's own tallies for the same run
    assert sum(s.counts()["changed"] for s in run.steps) == (
        run.summary["live_overwrites"] + run.summary["free_page_writes"]
    )
    assert sum(s.counts()["expected"] for s in run.steps) == run.summary["pages_expected"]
    assert all(s.states[canary.SCRATCH_PAGE] == pagemap.STATES.index("scratch") for s in run.steps)
    # the slider redraws: a replay that stores entries, then one that stores none
    stores = [i for i, s in enumerate(run.steps) if s.counts()["expected"]]
    quiet = [i for i, s in enumerate(run.steps) if not s.counts()["expected"]]
    slider.value = stores[0]
    slider.value = quiet[0]  # differs from the line above, so this one surely redraws
    assert "expected 0" in p.status.value
    first = image(p)
    slider.value = stores[0]
    assert f"replay {run.steps[stores[0]].index} of {len(run.steps)}" in p.status.value
    assert image(p).startswith(PNG) and image(p) != first


def test_page_recorder_classes_match_the_canary_replay_by_replay(dev):
    from nblib.engine.model import DecodeModel, ModelConfig
    from nblib.engine.runner import Runner
    from nblib.engine.workload import WorkloadConfig, run_sessions

    m = DecodeModel(ModelConfig(**MODEL), dev)
    runner = Runner(m, BUCKETS).capture()
    c, rec = canary.Canary(m), pagemap.PageRecorder(m)
    run_sessions(runner, WorkloadConfig(**{**SMALL, "concurrency": 2}), [c, rec])
    assert len(c.records) == len(rec.steps) > 0
    for a, b in zip(c.records, rec.steps):
        n = b.counts()
        assert n["changed"] == len(a["live_overwrites"]) + len(a["free_writes"])
        assert n["expected"] == a["expected"]
        changed = torch.tensor(b.states) == pagemap.STATES.index("changed")
        assert set(torch.nonzero(changed).flatten().tolist()) == set(a["live_overwrites"] + a["free_writes"])


def test_gediff_explorer_runs_a_design_against_off_through_the_batch_function(dev):
    p = widgets.gediff_explorer(dev, MODEL, BUCKETS, SMALL)
    p.controls["design"].value, p.controls["runs"].value = "refs", 2
    seen = watch_progress(p)
    p.click()
    assert "error" not in p.state, p.state.get("error")
    want = designs.compare(get("sim"), MODEL, BUCKETS, SMALL, [0, 1], ["off", "refs"], progress=None)
    assert p.state["rows"] == [a.model_dump() for a in want.arms]
    assert seen[-1] == 2 * (2 + 1)  # each protocol run and each arm's line
    assert "<td>refs" in p.view.value and "<td>off" in p.view.value
    assert image(p).startswith(PNG)
    lines = p.state["lines"]
    assert len(lines) == want.arm("refs").comparisons > 0
    p.extra[0].value = p.extra[0].max
    assert p.status.value.endswith(html.escape(lines[-1]) + "</span>")


def test_timeline_explorer_lights_the_chosen_hazard_and_names_its_sites(dev):
    p = widgets.timeline_explorer(dev, MODEL, BUCKETS)
    p.controls["index_dtype"].value, p.controls["overlap"].value = "bf16", "on"
    p.controls["policy"].value = "transient"
    p.click()
    shown, hazard = p.extra[0].children
    assert shown.value == 2 and not hazard.disabled and len(hazard.options) >= 2
    first = image(p)
    hazard.value = 1
    h = p.state["hazards"][1].row()
    assert image(p).startswith(PNG) and image(p) != first
    assert h["first_tensor"] == "indexer.logits" and "_logits_buffer" in h["first_alloc"]
    assert "_logits_buffer" in p.view.value and "del logits" in p.view.value
    assert h["second_tensor"] in p.view.value
    # overlap off: the same capture has no race, and the panel says so
    p.controls["overlap"].value = "off"
    p.click()
    assert p.state["report"].ok and hazard.disabled
    assert hazard.options == (("no cross-stream race in this capture", -1),)


def test_fix_explorer_reports_variant_by_bucket(dev):
    p = widgets.fix_explorer(dev, MODEL, BUCKETS, SMALL, replays=3)
    p.controls["variants"].value = ("buggy overlap", "persistent buffer")
    p.controls["buckets"].value = (2,)
    seen = watch_progress(p)
    p.click()
    assert "error" not in p.state, p.state.get("error")
    assert [(r["variant"], r["bucket"]) for r in p.state["rows"]] == [
        ("buggy overlap", 2),
        ("persistent buffer", 2),
    ]
    assert [(t["variant"], t["bucket"]) for t in p.state["times"]] == [
        ("buggy overlap", 2),
        ("persistent buffer", 2),
    ]
    assert all(t["median_ms"] > 0 and t["replays"] == 3 for t in p.state["times"])
    assert seen == [1, 2, 3, 4]  # a tick per variant-bucket run, then per variant timed
    assert "persistent buffer" in p.view.value and image(p).startswith(PNG)


def test_an_error_in_a_controls_callback_shows_in_one_line_naming_the_control_and_its_value():
    bucket = W.Dropdown(options=[1, 2, 4], value=1, description="bucket")
    p = Panel(controls=dict(bucket=bucket), button=None)

    def draw():
        if bucket.value == 4:
            raise ValueError("no capture for\nbucket 4")

    p.watch(bucket, draw)
    bucket.value = 2
    assert "error" not in p.state
    bucket.value = 4  # as a user moves it: the observer runs, its exception must not be lost
    assert isinstance(p.state["error"], ValueError)
    assert p.status.value == (
        "<span style='color:#a00'>error at bucket = 4: ValueError: no capture for bucket 4</span>"
    )
    bucket.value = 2  # a good value again clears the error
    assert "error" not in p.state


def test_report_explorer_shows_the_chosen_targets_report_and_redraws_on_a_change():
    class Report:
        def __init__(self, target, backend, status):
            self.target, self.backend, self.status = target, backend, status
            self.hazards, self.ops, self.captures = [object()] * (status == "hazards"), 7, 1

        def text(self):
            return f"report of {self.target} on {self.backend} <{self.status}>"

    reports = {(t, b): Report(t, b, s) for t, s in (("a.py:buggy", "hazards"), ("a.py:fixed", "clean"))
               for b in ("sim", "cuda")}  # fmt: skip
    p = widgets.report_explorer(reports, ["a.py:buggy", "a.py:fixed"], ["sim", "cuda"])
    assert p.view.value == "<pre>report of a.py:buggy on sim &lt;hazards&gt;</pre>"
    assert "a.py:buggy on sim: hazards, 1 hazard(s), 7 ops in 1 capture(s)" in p.status.value
    p.controls["target"].value = "a.py:fixed"
    assert p.view.value == "<pre>report of a.py:fixed on sim &lt;clean&gt;</pre>"
    p.controls["backend"].value = "cuda"
    assert p.state["report"] is reports[("a.py:fixed", "cuda")]


def test_method_explorer_runs_the_chosen_form_through_the_batch_function(dev, monkeypatch):
    monkeypatch.chdir(P.ROOT)  # the examples' TARGET paths are relative to the repository
    p = widgets.method_explorer({"sim": dev}, 3)
    p.controls["model"].value, p.controls["form"].value = "deepseek_v3", "record_stream"
    p.controls["design"].value = "prealloc"
    p.click()
    assert "error" not in p.state, p.state.get("error")
    row, want = p.state["row"], method.run_one(get("sim"), "deepseek_v3", "record_stream", 3, "prealloc")
    assert row.model_dump(exclude={"seconds"}) == want.model_dump(exclude={"seconds"})
    assert row.hazards == 0 and row.forced.startswith("0/") and row.design == "prealloc"
    assert "hf_moe.py:deepseek_v3_record_stream on sim: 0 hazard(s)" in html.unescape(p.status.value)


def interactive_cell(name):
    """The notebook's `if INTERACTIVE:` cell and every name the cells before it assign."""
    nb = nbformat.read(P.ROOT / "notebooks" / f"{name}.ipynb", 4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    i = next(i for i, s in enumerate(code) if s.startswith("if INTERACTIVE:"))
    known = {"display"}
    for src in code[:i]:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                known.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                known |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return ast.parse(code[i]), known


@pytest.mark.parametrize(
    "name,builder",
    [
        ("00_reproduce", "matrix_explorer"),
        ("01_canary", "page_map"),
        ("02_graph_vs_eager", "gediff_explorer"),
        ("03_stream_overlap", "timeline_explorer"),
        ("04_persistent_buffer_fix", "fix_explorer"),
        ("06_audit_your_engine", "report_explorer"),
        ("07_method_on_your_engine", "method_explorer"),
    ],
)
def test_each_notebook_builds_its_panel_from_names_it_defines(name, builder):
    """Papermill runs leave INTERACTIVE off, so check the cell here: it calls its builder with
    arguments that bind to the builder's signature, made only of names the notebook defines."""
    tree, known = interactive_cell(name)
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == builder
    ]
    assert len(calls) == 1, f"{name} should call widgets.{builder}"
    call = calls[0]
    inspect.signature(getattr(widgets, builder)).bind(*call.args, **{k.arg: k.value for k in call.keywords})
    names = [n for a in call.args + [k.value for k in call.keywords] for n in ast.walk(a)]
    bound_inside = {n.id for n in names if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in names if isinstance(n, ast.Name)} - bound_inside  # a comprehension's own names
    assert used <= known, f"{name}: {sorted(used - known)} not defined before the cell"
