"""Every results.json and index.json the suite writes, committed or fresh, loads through its model
(nblib.schema.results); an unknown key, or a key a finished notebook must write, fails."""

import json

import pytest
from pydantic import ValidationError

from nblib.core.paths import ROOT
from nblib.core.results import Results
from nblib.schema import results as R

COMMITTED = sorted((ROOT / "outputs").glob("**/*.results.json"))
INDEXES = sorted((ROOT / "outputs").glob("**/index.json"))
# the audit-zoo folder's results.json is the zoo's own record, not a notebook's
NOTEBOOK_FILES = [p for p in COMMITTED if p.name != "results.json"]


def _failures(paths, load):
    bad = []
    for p in paths:
        try:
            load(p)
        except (ValueError, ValidationError) as e:
            bad.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {str(e).splitlines()[:3]}")
    return bad


def test_committed_results_load():
    assert NOTEBOOK_FILES, "no committed results.json under outputs/"
    assert _failures(NOTEBOOK_FILES, R.load) == []


def test_committed_indexes_load():
    assert INDEXES, "no committed index.json under outputs/"
    assert _failures(INDEXES, lambda p: R.IndexFile.model_validate_json(p.read_text())) == []


def test_every_notebook_has_a_model():
    names = {p.stem.removesuffix(".results") for p in NOTEBOOK_FILES}
    assert names <= set(R.MODELS)
    assert sorted(R.MODELS) == sorted(p.stem for p in (ROOT / "notebooks").glob("0*.ipynb"))


def _finished(name):
    """A committed finished file of notebook `name`, as a dict."""
    for p in NOTEBOOK_FILES:
        d = json.loads(p.read_text())
        if d["notebook"] == name and d["status"] == "ok":
            return d
    pytest.skip(f"no finished {name} committed")


@pytest.mark.parametrize("name", ["00_reproduce", "02_graph_vs_eager", "06_audit_your_engine"])
def test_unknown_key_fails(name):
    d = _finished(name)
    R.validate(d)
    with pytest.raises(ValidationError, match="surprise"):
        R.validate(dict(d, surprise=1))


def test_unknown_nested_key_fails():
    d = _finished("04_persistent_buffer_fix")
    with pytest.raises(ValidationError, match="surprise"):
        R.validate(dict(d, plan=dict(d["plan"], surprise=1)))


@pytest.mark.parametrize(
    ("name", "key"), [("00_reproduce", "fingerprint"), ("01_canary", "canary"), ("05_report", "commits")]
)
def test_missing_key_fails_once_ok(name, key):
    d = _finished(name)
    del d[key]
    with pytest.raises(ValidationError, match=key):
        R.validate(d)
    R.validate(dict(d, status="running"))  # a notebook that died mid-way still loads


def test_older_keys_load_as_none():
    d = _finished("00_reproduce")
    for k in ("protocol_checks", "protocol", "wall_seconds", "phases"):
        d.pop(k, None)
    r = R.validate(d)
    assert r.protocol is None and r.phases is None


def test_unknown_notebook_fails():
    d = _finished("01_canary")
    with pytest.raises(ValueError, match="unknown notebook"):
        R.validate(dict(d, notebook="07_nothing"))


def test_wrong_type_fails():
    d = _finished("01_canary")
    with pytest.raises(ValidationError, match="corrupting_buckets"):
        R.validate(dict(d, corrupting_buckets="24"))


class _Dev:
    name = "sim"

    def device_name(self):
        return "test"


def test_finish_checks_before_saying_ok(tmp_path):
    """Results.finish runs the check on the whole file and, when it raises, leaves it running."""
    res = Results("01_canary", tmp_path, _Dev(), {}, check=R.validate)
    res["verdict"] = "v"
    with pytest.raises(ValidationError, match="canary"):
        res.finish()
    assert json.loads(res.path.read_text())["status"] == "running"


def test_ci_suite_results_load(ci_suite):
    paths = sorted(ci_suite.glob("*.results.json"))
    assert len(paths) >= 6, [p.name for p in paths]
    assert _failures(paths, R.load) == []
    for p in paths:
        assert R.load(p).status == "ok", p.name
    R.IndexFile.model_validate_json((ci_suite / "index.json").read_text())


def test_load_if_any_is_none_without_a_file_or_for_one_the_models_do_not_fit(tmp_path):
    assert R.load_if_any(tmp_path / "00_reproduce.results.json") is None
    d = _finished("00_reproduce")
    path = tmp_path / "00_reproduce.results.json"
    path.write_text(json.dumps(dict(d, surprise=1)))
    assert R.load_if_any(path) is None
    path.write_text(json.dumps(d))
    assert R.load_if_any(path).commit == d["commit"]


def test_a_finished_00_is_what_notebook_03_reads_of_it():
    from nblib.studies import overlap

    r = R.validate(_finished("00_reproduce"))
    assert isinstance(r, overlap.Reproduced)
    assert all(isinstance(m, overlap.MatrixRow) for m in r.matrix)


@pytest.mark.parametrize(
    "value",
    [{"a": {"b": 1}}, [[1, 2]], {"a": [1]}],
    ids=["mapping in a mapping", "list of lists", "list in a mapping"],
)
def test_a_param_holds_leaves_or_one_list_or_mapping_of_them(value):
    d = _finished("01_canary")
    with pytest.raises(ValidationError, match="params"):
        R.validate(dict(d, params=dict(d["params"], deep=value)))


def test_a_params_leaves_keep_their_json_types():
    d = _finished("01_canary")
    params = dict(d["params"], flag=True, count=3, share=0.5, name="x", nothing=None)
    got = R.validate(dict(d, params=params)).params
    assert got == params and {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in params.items()}


def test_dropped_names_the_index_dtypes_and_the_reason_and_nothing_else():
    d = _finished("01_canary")
    dropped = dict(index_dtypes=["fp8"], reason="no fp8 tensor cores")
    assert R.validate(dict(d, dropped=dropped)).dropped.index_dtypes == ["fp8"]
    with pytest.raises(ValidationError, match="surprise"):
        R.validate(dict(d, dropped=dict(dropped, surprise=1)))


def test_a_hazard_row_of_03_with_a_field_the_model_does_not_know_fails():
    d = _finished("03_stream_overlap")
    assert d["hazards"], "a finished 03 names hazards"
    with pytest.raises(ValidationError, match="surprise"):
        R.validate(dict(d, hazards=[dict(d["hazards"][0], surprise=1)]))
