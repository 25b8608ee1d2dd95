"""nblib.core: atomic writes leave the old file or the new one, never a half; a results.json says
"ok" only once finished; the commit a result records is this project's, or "unknown", never the
commit of some enclosing repository."""

import json
import subprocess
import sys

import pytest

from nblib.core import files, results, tables
from nblib.core.paths import ROOT


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = files.write_json(tmp_path / "r.json", {"status": "ok"})
    assert json.loads(path.read_text()) == {"status": "ok"} and oct(path.stat().st_mode)[-3:] == "644"

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        files.write_text(path, "half")
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_writer_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = files.write_with(tmp_path / "steps.pt", lambda f: f.write(b"whole"))

    def half(f):
        f.write(b"ha")
        raise RuntimeError("the save failed")

    with pytest.raises(RuntimeError, match="the save failed"):
        files.write_with(path, half)
    assert path.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["steps.pt"]


def test_results_status_is_ok_only_after_finish(tmp_path, eager_dev):
    eager_dev.device_name = lambda: "cpu"
    res = results.Results("nb", tmp_path, eager_dev, {"a": 1})
    assert json.loads((tmp_path / "nb.results.json").read_text())["status"] == "running"
    res["x"] = [1, 2]
    res.finish()
    data = json.loads((tmp_path / "nb.results.json").read_text())
    assert data["status"] == "ok" and data["x"] == [1, 2] and data["params"] == {"a": 1}
    assert list(tmp_path.iterdir()) == [tmp_path / "nb.results.json"]  # no temp files left


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_commit_is_this_projects_or_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("NBLIB_COMMIT", raising=False)
    repo = tmp_path / "outer"
    (repo / "project").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "outer")
    head = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(results, "ROOT", repo)  # the project is the repository: its HEAD
    assert results.commit() == head
    (repo / "f").write_text("changed")
    assert results.commit() == head + "+dirty"
    monkeypatch.setattr(results, "ROOT", repo / "project")  # a copy inside someone else's checkout
    assert results.commit() == "unknown"
    monkeypatch.setattr(results, "ROOT", tmp_path)  # no git at all
    assert results.commit() == "unknown"
    monkeypatch.setenv("NBLIB_COMMIT", "abc123")  # the commit NBLIB_COMMIT names wins
    assert results.commit() == "abc123"


def test_markdown_tables_one_writer():
    """Header, rule, a row per record; a '|' in a value escaped (so it stays one cell); a missing key
    blank; no rows: the placeholder, or only the header when asked for one."""
    rows = [dict(a=1.23456, b="x|y"), dict(a=2)]
    assert tables.from_dicts(rows) == "| a | b |\n|---|---|\n| 1.23456 | x\\|y |\n| 2 |  |"
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    assert tables.from_dicts(rows, ["b", "a"], fmt=fmt).splitlines()[2] == "| x\\|y | 1.23 |"
    assert tables.from_dicts([]) == "_(none)_"
    assert tables.from_dicts([], ["a", "b"], empty=None) == "| a | b |\n|---|---|"
    assert tables.markdown(("n", "v"), [(1, None)]) == tables.head(["n", "v"]) + "\n" + tables.line([1, None])
    assert tables.line([1, None]) == "| 1 | None |"


def test_the_run_layer_imports_nbformat_without_its_iri_checker_and_still_validates():
    # in a fresh interpreter: this process may have imported nbformat already
    code = """
import sys
import nblib.run.suite
import nbformat
nb = nbformat.read("notebooks/05_report.ipynb", as_version=4)
nbformat.validate(nb)
del nb.cells[0]["source"]  # a cell without its source: the schema refuses it
try:
    nbformat.validate(nb)
    print("invalid notebook accepted")
except nbformat.ValidationError:
    print("validated", sys.modules["rfc3987_syntax"] is None)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.stdout.strip() == "validated True", r.stderr[-2000:]
