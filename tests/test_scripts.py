"""The device runs' scripts (scripts/), each on the simulator or refusing in one line without a GPU:
gpu_audit_zoo.py end to end, gpu_checks.sh and gpu_instrument_cost.py before any step,
profile_gpu_steps.py's timed rows and bit comparison, and gpu_audit_anchors.py's table and jobs built
from fake child results."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nblib.core.paths import ROOT
from nblib.instruments.audit import parity as audit_parity
from nblib.instruments.audit import zoo as audit_zoo


def test_the_gpu_script_runs_end_to_end_on_the_simulator(tmp_path):
    """scripts/gpu_audit_zoo.py --backend sim: the device run's script, dry, on the CPU; and the
    CUDA run refuses in one line where there is no GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    script = str(ROOT / "scripts" / "gpu_audit_zoo.py")
    run = dict(capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, script, str(tmp_path / "x")], check=False, **run)
        assert p.returncode != 0 and p.stderr.strip().splitlines() == [
            "no CUDA GPU here: run this on the H200, or pass --backend sim for a dry run on the CPU"
        ]
    p = subprocess.run([sys.executable, script, str(tmp_path), "--backend", "sim"], check=False, **run)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["zoo"]) == 2 * len(audit_zoo.CASES) and all(
        r["right"] and r["graph_agrees"] for r in res["zoo"]
    )
    assert res["summary"]["false_alarms"] == 0 and res["summary"]["graph_agrees"] == len(res["zoo"])
    assert len(res["parity"]) == len(audit_parity.CASES) and all(r["same"] for r in res["parity"])
    model = res["model_audit"]  # the bug, record_stream, persistent, fp8
    assert [m.get("hazards", 0) > 0 for m in model] == [True, False, False, False], model
    assert all(m["graph_agrees"] for m in model), model
    assert all(r["later_capture"] == "ok" for r in res["rootcause"].values()), res["rootcause"]
    assert (tmp_path / "README.md").read_text().startswith("# The capture audit on CUDA")


def test_the_gpu_checks_script_refuses_in_one_line_without_a_gpu(tmp_path):
    """scripts/gpu_checks.sh (every GPU check in one run) stops before any step here."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_checks.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "no CUDA GPU here: run scripts/gpu_checks.sh on the GPU machine"
    ]
    assert not (tmp_path / "out").exists()


def test_the_instrument_cost_script_checks_its_profile_then_refuses_without_a_gpu(tmp_path):
    """scripts/gpu_instrument_cost.py: a bad profile and a missing GPU each fail in one line,
    before anything is measured or written."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run")
    script = str(ROOT / "scripts" / "gpu_instrument_cost.py")

    def run(*args):
        cmd = [sys.executable, script, str(tmp_path / "out"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    p = run()
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "gpu_instrument_cost.py: needs a CUDA GPU (notebook 02 measures the simulator's)"
    ]
    p = run("--params", str(tmp_path / "missing.yaml"))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "out").exists()


def test_the_step_profile_script_times_each_path_and_compares_the_indexers_bits(tmp_path):
    """scripts/profile_gpu_steps.py on the simulator (the ci profile): three timed rows a bucket,
    and the logits with one program a request against programs filling the device, bit for bit."""
    import subprocess
    import sys

    from nblib.core.paths import ROOT

    cmd = [sys.executable, "scripts/profile_gpu_steps.py", "--params", "params/ci.yaml", "--sessions", "2"]
    cmd += ["--buckets", "1", "8", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    lines = (tmp_path / "steps.txt").read_text().splitlines()
    for b in (1, 8):
        rows = [ln for ln in lines if ln.startswith(f"bucket {b}: ")]
        assert [r.split(": ")[1].split(" row")[0] for r in rows] == ["graph", "graph", "eager"], rows
        assert all(" ms a step" in r for r in rows)
        bits = [ln for ln in lines if ln.startswith(f"bucket {b} ctx ")]
        assert bits and all(ln.endswith("same bits: True") for ln in bits), bits


@pytest.fixture(scope="module")
def anchors():
    spec = importlib.util.spec_from_file_location(
        "gpu_audit_anchors", ROOT / "scripts" / "gpu_audit_anchors.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mark(m, event, target, **cell):
    return m.MARK + m.json.dumps(dict(event=event, target=target, **({"cell": cell} if cell else {})))


def _group(m, tool, names, lines, **kw):
    return m.ChildResult(tool=tool, group="g", targets=names, stdout="\n".join(lines), **kw)


def test_the_anchor_table_from_fake_children(anchors):
    m = anchors
    a, b = m.Spec(name="A", group="g", expect="race"), m.Spec(name="B", group="g", expect="clean")
    clean = dict(verdict="clean", detail="1 graph(s) captured", seconds=0.5)
    results = [
        _group(
            m, "audit", ["A"], [_mark(m, "start", "A"), _mark(m, "end", "A", verdict="race", seconds=0.2)]
        ),
        _group(
            m, "audit", ["B"], [_mark(m, "start", "B"), _mark(m, "end", "B", verdict="race", seconds=0.2)]
        ),
        # memcheck: a report between A's markers makes A a race; B ran clean
        _group(
            m,
            "memcheck",
            ["A", "B"],
            [
                _mark(m, "start", "A"),
                "========= Invalid __global__ read of size 4 bytes",
                _mark(m, "end", "A", **clean),
                _mark(m, "start", "B"),
                _mark(m, "end", "B", **clean),
                "========= ERROR SUMMARY: 1 error",
            ],
        ),  # fmt: skip
        # racecheck ran past its timeout inside B
        _group(
            m,
            "racecheck",
            ["A", "B"],
            [_mark(m, "start", "A"), _mark(m, "end", "A", **clean), _mark(m, "start", "B")],
            timed_out=True,
        ),  # fmt: skip
        # the no-caching run died at A with the tool's own error line
        _group(
            m,
            "memcheck-nocache",
            ["A", "B"],
            [_mark(m, "start", "A"), "========= Error: process didn't terminate successfully"],
            returncode=1,
        ),  # fmt: skip
        m.ChildResult(tool="csan", group="g", targets=["A", "B"], not_run="compute-sanitizer not found"),
    ]
    table = m.build_table([a, b], results, dict(backend="fake"))
    cells = {r.target: {t: c.verdict for t, c in r.cells.items()} for r in table.rows}
    assert cells["A"] == {"audit": "race", "memcheck": "race", "racecheck": "clean",
                          "memcheck-nocache": "error", "csan": "not run"}  # fmt: skip
    assert cells["B"] == {"audit": "race", "memcheck": "clean", "racecheck": "timeout",
                          "memcheck-nocache": "error", "csan": "not run"}  # fmt: skip
    row_a = table.rows[0].cells
    assert row_a["memcheck"].detail.startswith("1 report(s): Invalid __global__ read")
    assert (
        row_a["memcheck-nocache"].detail
        == "at this target: ========= Error: process didn't terminate successfully"
    )
    assert table.rows[1].cells["memcheck-nocache"].detail.startswith("not reached: ")
    s = {x.tool: x for x in table.summary}
    assert (s["audit"].caught, s["audit"].false_alarms, s["memcheck"].caught, s["memcheck"].missed) == (
        1,
        1,
        1,
        0,
    )
    assert (s["racecheck"].missed, s["racecheck"].timeouts, s["csan"].not_run) == (1, 1, 2)
    md = m.markdown(table)
    assert "| A | race | race (0.2 s) |" in md and "- B, racecheck: timeout: the child ran past 90 s" in md


def test_the_anchor_jobs_put_compute_sanitizer_first_and_one_target_per_audit_child(anchors):
    m = anchors
    targets = [m.Spec(name=n, group=g, expect=None) for n, g in (("A", "x"), ("B", "x"), ("C", "y"))]
    jobs = m.jobs(["audit", "memcheck"], targets)
    assert jobs == [("memcheck", "x", ["A", "B"]), ("memcheck", "y", ["C"]),
                    ("audit", "x", ["A"]), ("audit", "x", ["B"]), ("audit", "y", ["C"])]  # fmt: skip


def test_the_anchor_field_group_names_every_form_of_every_field_case(anchors):
    from nblib.instruments.audit import target as audit_target

    specs = anchors.specs(["field"])
    files = {
        p.name
        for p in (ROOT / "examples" / "field").glob("*.py")
        if not p.name.startswith("_") and p.name not in ("cases.py", "measure.py")
    }
    assert {s.name.split("/")[-1].split(":")[0] for s in specs} == files
    for s in specs:
        assert s.group == "field" and s.expect in ("race", "clean", None)
        assert callable(audit_target.load(s.name).fn), s.name
    # a buggy form that races is expected to race, its fixed form to be clean
    assert {s.expect for s in specs if s.name.endswith(":fixed")} == {"clean"}
    assert "race" in {s.expect for s in specs if s.name.endswith(":buggy")}


def test_the_calibrations_top_k_grid_holds_each_measured_shape(monkeypatch):
    """calibrate_sim's top-k grid per k, timed by a known cost rather than a GPU: each cell is the
    call it names, rows down, row lengths across, and the simulator reads the file it writes."""
    spec = importlib.util.spec_from_file_location("calibrate_sim", ROOT / "scripts" / "calibrate_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "topk_seconds", lambda r, c, k: k * 1e-6 + r * 1e-3 + c * 1e-9)
    grids = mod.topk_grids()
    assert set(grids) == {"16", "512"}
    for k, g in grids.items():
        assert g["rows"] == [1, 8, 16, 20, 24, 28, 32, 36, 40, 48]
        assert g["cols"] == [16384, 65536, 131072, 262144]
        for i, r in enumerate(g["rows"]):
            for j, c in enumerate(g["cols"]):
                assert g["seconds"][i][j] == pytest.approx(int(k) * 1e-6 + r * 1e-3 + c * 1e-9)
    from nblib.backends.sim.timing import TopkGrid

    grid = TopkGrid.from_json("16", json.loads(json.dumps(grids["16"])))
    assert grid.at(24, 131072) == pytest.approx(16e-6 + 24e-3 + 131072e-9)
