"""The benchmark harness: what it records about the run (commit, device, versions) and how it
writes tables."""

import json
import shutil
import subprocess

import pytest
from interp import ROOT, run_without_interpreter

from kernels import harness


def test_nblib_commit_wins(monkeypatch):
    monkeypatch.setenv("NBLIB_COMMIT", "abc123")
    assert harness.meta()["commit"] == "abc123"


def test_a_copy_inside_another_repository_records_unknown(tmp_path):
    """The tree copied into some other git repository (no .git of its own) must not report that
    repository's commit."""
    outer = tmp_path / "outer"
    proj = outer / "copy"
    for pkg in ("kernels", "nblib"):
        shutil.copytree(f"{ROOT}/{pkg}", proj / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for cmd in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *cmd], cwd=outer, check=True, capture_output=True)
    code = (
        f"import sys; sys.path.insert(0, {str(proj)!r}); "
        "from kernels import harness; print(harness.project_commit())"
    )
    r = run_without_interpreter(["-c", code], timeout=120, unset=("NBLIB_COMMIT",))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "unknown"


def test_this_checkout_records_its_head(monkeypatch):
    monkeypatch.delenv("NBLIB_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("this tree is not a git checkout: no HEAD to compare with")
    assert harness.project_commit().startswith(head.stdout.strip())


def test_write_table_writes_json_and_markdown(tmp_path):
    rows = [dict(name="copy", us=1000.0, frac_copy_bw=1.0), dict(name="k", us=12.5)]
    md = harness.write_table(tmp_path, "bench", dict(commit="c"), rows, ["name", "us", "frac_copy_bw"])
    assert "| k | 12.5 |  |" in md
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved == dict(meta=dict(commit="c"), rows=rows)
    assert (tmp_path / "bench.md").read_text() == md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]  # no temp files left
