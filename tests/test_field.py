"""examples/field: real cross-stream bugs engines shipped, each as a buggy and a fixed capture-audit
target. On the simulator every form gets the verdict examples/field/cases.py names: a buggy form's
audit names the race (the kind, the racing tensor, the lines that allocate and free it, read from the
target's source here), a fixed form is clean, and where the audit has nothing to name (a memory cost,
an ordered overwrite, a shortcut baked at capture) the instrument the table names sees the bug.
scripts/field_table.py's verdict and cell helpers on made-up verdicts."""

import importlib.util
import json
import sys

import pytest
import torch

from nblib.backends.device import get
from nblib.core.paths import ROOT
from nblib.instruments.audit import target as audit_target

FIELD = ROOT / "examples" / "field"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the models' annotations through the module
    sys.path.insert(0, str(path.parent))  # the field files import _field, their neighbour
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


cases = load(FIELD / "cases.py", "_field_cases_under_test")
FORMS = [(c.id, f) for c in cases.CASES for f in c.forms]
CHECKED = [c for c in cases.CASES if c.check is not None]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # TARGET paths and the reported sites are relative to the working directory


def line_of(path, text):
    """The 1-based line of `path` that starts with `text` (exactly one; docstrings quote the code too)."""
    hits = [
        i for i, line in enumerate((ROOT / path).read_text().splitlines(), 1) if line.strip().startswith(text)
    ]
    assert len(hits) == 1, (path, text, hits)
    return hits[0]


def function(spec):
    path, name = spec.split(":")
    return getattr(load(ROOT / path, "_field_check_" + name), name)


def test_the_table_has_at_least_eight_real_bugs_each_with_a_buggy_and_a_fixed_form():
    assert len(cases.CASES) >= 8 and len({c.id for c in cases.CASES}) == len(cases.CASES)
    for c in cases.CASES:
        assert {f.role for f in c.forms} == {"buggy", "fixed"}, c.id
        assert c.repository.count("/") == 1 and "#" in c.reference and c.engine_files
        for f in c.forms:
            path, fn = f.target.split(":")
            assert path.startswith("examples/field/") and f"def {fn}(dev):" in (ROOT / path).read_text()
            assert f.commit


@pytest.mark.parametrize("case_id, form", FORMS, ids=[f"{i}-{f.target.split(':')[1]}" for i, f in FORMS])
def test_each_form_gets_the_verdict_the_table_names(case_id, form):
    rep = audit_target.audit(form.target, backend="sim")
    e = form.expect
    assert (rep.status, rep.exit_code) == (e.status, e.exit_code), rep.text()
    if e.status == "clean":
        assert rep.ops > 0 and not rep.hazards
    elif e.status == "failed":
        assert rep.failure.stage == "capture"
    else:
        src = e.source or form.file
        named = [h for h in rep.hazards if h.first.tensor.name.split(" (")[0] == e.tensor]
        assert named, rep.text()
        for h in named:
            t = h.first.tensor
            assert h.kind == e.kind and h.first.stream != h.second.stream
            assert (t.allocated_at.file, t.allocated_at.line) == (src, line_of(src, e.allocated))
            if e.freed is None:  # a race on live bytes: the same tensor on both sides
                assert not h.reused and h.second.tensor.name == t.name
            else:  # the freed-block reuse case: freed on the host at this line, its bytes handed on
                assert h.reused and t.freed and t.freed_at.line == line_of(src, e.freed)


@pytest.mark.parametrize("case", CHECKED, ids=[c.id for c in CHECKED])
def test_where_the_audit_has_nothing_to_name_the_tables_instrument_sees_the_bug(case):
    check = function(case.check.function)
    values = {f.role: check(get("sim"), f.target) for f in case.forms}
    assert cases.check_holds(case.check, values), values


def test_the_dbo_overwrite_moves_micro_batch_0_onto_micro_batch_1s_indices():
    """Independently of the check: the interleaved step's micro-batch 0 output is what micro-batch 0's
    consumer computes over micro-batch 1's top-k; micro-batch 1's output is untouched."""
    dbo = load(FIELD / "vllm_dbo_topk.py", "_field_dbo")
    layers = dbo.DboIndexedLayers(get("sim"), per_microbatch=False)
    interleaved = [t.clone() for t in layers.step()]
    serial = [t.clone() for t in layers.serial()]
    assert not (interleaved[0] == serial[0]).all(-1).any() and (interleaved[1] == serial[1]).all()
    layers.source_layer(1)  # micro-batch 1's indices in the shared buffer, then micro-batch 0's consumer
    layers.consumer_layer(0, *layers.dispatch(0))
    assert (layers.out[0] == interleaved[0]).all()


def test_the_captured_shortcut_replays_the_first_candidates_for_a_long_context():
    shortcut = load(FIELD / "vllm_dsv4_indexer_shortcut.py", "_field_shortcut")
    dev = get("sim")
    step = audit_target.load("examples/field/vllm_dsv4_indexer_shortcut.py:buggy").fn(dev)
    graph = audit_target.audit_step(step, dev).audit_report.graph
    step.__self__.set_context(shortcut.LONG_CONTEXT)
    graph.replay()
    assert (step.__self__.topk_indices == torch.arange(shortcut.TOPK)).all()  # candidates 0..TOPK-1


def test_the_table_script_judges_and_renders_made_up_verdicts(tmp_path):
    script = load(ROOT / "scripts" / "field_table.py", "_field_table_under_test")
    race = dict(
        status="hazards",
        exit_code=1,
        ops=3,
        failure=None,
        hazards=[dict(kind="write-after-read", first_tensor="q", first_stream="side", second_tensor="q")],
    )
    e = cases.Expect(status="hazards", kind="write-after-read", tensor="q")
    assert script.agrees(e, race) and not script.agrees(e.model_copy(update={"tensor": "h"}), race)
    assert not script.agrees(cases.Expect(status="clean"), race)
    assert script.says(race) == "exit 1: write-after-read on `q`"
    clean = dict(race, status="clean", exit_code=0, hazards=[])
    assert script.says(clean) == "exit 0: none" and script.agrees(cases.Expect(status="clean"), clean)
    out = tmp_path / "field.json"
    script.write_atomically(out, json.dumps(dict(ok=True)))
    assert json.loads(out.read_text()) == dict(ok=True) and [p.name for p in tmp_path.iterdir()] == [out.name]
