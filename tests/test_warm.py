"""The kernel started ahead (nblib.run.warm): it imports what its notebook imports, binds nothing in
the notebook's namespace, and papermill runs the notebook in it."""

import json
import subprocess
import sys

import nbformat
import papermill as pm
import pytest

from nblib.core.paths import NOTEBOOK_DIR, ROOT
from nblib.run import errors, warm


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_the_modules_are_every_import_of_every_code_cell(tmp_path):
    nb = _notebook(
        tmp_path / "a.ipynb",
        "import json\nfrom email import message, utils as u\n",
        "%matplotlib inline\nimport colorsys",  # a magic: the cell is left to the notebook
        "def f():\n    import wave\nfrom . import nothing",
    )
    names = warm.imported_modules(nb)
    assert names[: len(warm.ALWAYS)] == list(warm.ALWAYS)
    assert names[len(warm.ALWAYS) :] == ["json", "email", "email.message", "email.utils", "wave"]


def test_torch_imports_dynamo_at_a_custom_ops_first_call_which_the_warm_up_takes_ahead():
    # the reason torch._dynamo is in ALWAYS: no import statement of a notebook names it, yet the
    # first replay or reference of every study pays for it (torch.library's dynamo-disabled wrapper)
    code = (
        "import sys, torch, kernels.ops\n"
        "before = 'torch._dynamo' in sys.modules\n"
        "torch.ops.csi.topk_indices(torch.zeros(1, 8), 2, None)\n"
        "print(before, 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]
    assert "torch._dynamo" in warm.ALWAYS


def test_the_suites_notebooks_warm_what_their_setup_cell_imports():
    names = warm.imported_modules(NOTEBOOK_DIR / "00_reproduce.ipynb")
    assert {"torch", "nblib.run.notebook", "nblib.studies"} <= set(names)


def test_the_notebooks_metadata_adds_what_its_functions_import_lazily(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import json")]
    nb.metadata["nblib"] = {"warm": ["wave", "json"]}
    nbformat.write(nb, tmp_path / "a.ipynb")
    assert warm.imported_modules(tmp_path / "a.ipynb")[len(warm.ALWAYS) :] == ["json", "wave"]
    # notebook 06 audits transformers' models, which examples/audit/hf_moe.py imports inside functions
    assert "transformers" in warm.imported_modules(NOTEBOOK_DIR / "06_audit_your_engine.ipynb")


PROBE = (
    "import sys\n"
    "print(sorted(n for n in globals() if 'warm' in n), 'colorsys' in sys.modules, 'torch' in sys.modules)"
)


def _first_output(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return cells[0]["execution_count"], "".join(cells[0]["outputs"][0]["text"]).strip()


def test_the_notebook_runs_in_the_warm_kernel_with_its_modules_imported_and_no_name_bound(tmp_path):
    # the first cell looks before the second imports colorsys (a module no kernel imports itself)
    src = _notebook(tmp_path / "nb.ipynb", PROBE, "import colorsys")
    kernel = warm.WarmKernel(src, ROOT)
    try:
        assert kernel.ready(timeout=120)  # the warm-up's own reply: its imports are done
        assert kernel.alive()
        pm.execute_notebook(
            str(src), str(tmp_path / "warm.ipynb"), progress_bar=False, kernel_name="python3", km=kernel.km
        )
    finally:
        kernel.close()
    assert not kernel.km.has_kernel
    # the warm-up imported torch and colorsys, bound no name and stored no history
    assert _first_output(tmp_path / "warm.ipynb") == (1, "[] True True")
    # papermill's own kernel, for contrast: neither is imported before the cell that imports it
    pm.execute_notebook(str(src), str(tmp_path / "cold.ipynb"), progress_bar=False, kernel_name="python3")
    assert _first_output(tmp_path / "cold.ipynb") == (1, "[] False False")


def test_a_warm_up_that_fails_after_the_start_leaves_no_kernel(tmp_path, monkeypatch):
    src = _notebook(tmp_path / "nb.ipynb", "1 + 1")
    started = []
    real = warm.AsyncKernelManager.blocking_client

    def broken(self):
        started.append(self)
        raise OSError("no channels")

    monkeypatch.setattr(warm.AsyncKernelManager, "blocking_client", broken)
    with pytest.raises(OSError, match="no channels"):  # the suite's _warm then runs without one
        warm.WarmKernel(src, ROOT)
    monkeypatch.setattr(warm.AsyncKernelManager, "blocking_client", real)
    (km,) = started
    assert not km.has_kernel  # shut down, not left running


class _FakeKernel:
    def __init__(self, name, events):
        self.name, self.events = name, events
        events.append(("start", name))

    def ready(self):
        self.events.append(("ready", self.name))

    def close(self):
        self.events.append(("close", self.name))


def _suite_with_fakes(monkeypatch, failing=None):
    """suite._run_each with kernels and notebook runs that only record what happened, in order."""
    from nblib.run import suite

    events = []
    monkeypatch.setattr(suite, "_warm", lambda name: _FakeKernel(name, events))

    def run_one(name, kernel, *args):
        assert kernel.name == name  # each notebook runs in the kernel started for it
        events.append(("run", name))
        kernel.close()  # as _run_one does, in its finally
        ok = name != failing
        return dict(status="ok" if ok else "failed", error=None if ok else "boom"), []

    monkeypatch.setattr(suite, "_run_one", run_one)
    return suite, events


@pytest.mark.parametrize("cores, ahead", [(2, 1), (16, 2)])
def test_kernels_start_ahead_by_the_hosts_cores_each_before_its_notebook(monkeypatch, tmp_path, cores, ahead):
    from nblib.run import suite

    assert suite.kernels_ahead(cores) == ahead
    suite, events = _suite_with_fakes(monkeypatch)
    monkeypatch.setattr(suite, "kernels_ahead", lambda: ahead)
    suite._run_each(["a", "b", "c", "d"], {}, None, tmp_path, 60)
    starts = [n for e, n in events if e == "start"]
    assert starts == ["a", "b", "c", "d"] and events[:2] == [("start", "a"), ("ready", "a")]
    for i, name in enumerate("abcd"):
        run = events.index(("run", name))
        # the kernels of the next `ahead` notebooks are started before this one runs, no more
        started = {n for e, n in events[:run] if e == "start"}
        assert started == set("abcd"[: i + 1 + ahead]), (name, started)
    assert sorted(n for e, n in events if e == "close") == list("abcd")  # each closed once


def test_a_failed_notebook_closes_the_kernels_started_ahead_of_it(monkeypatch, tmp_path):
    suite, events = _suite_with_fakes(monkeypatch, failing="b")
    monkeypatch.setattr(suite, "kernels_ahead", lambda: 2)
    with pytest.raises(errors.NotebookFailed, match="b failed: boom"):
        suite._run_each(["a", "b", "c", "d"], {}, None, tmp_path, 60)
    assert ("run", "c") not in events
    assert sorted(n for e, n in events if e == "close") == ["a", "b", "c", "d"]  # c and d never ran


def test_the_notebook_after_the_lanes_gets_a_kernel_started_while_they_ran(monkeypatch, tmp_path):
    """05 runs after the lanes: its kernel starts before them (the parent only waits on the lanes)
    and is the one it runs in, not one started after the last lane; a failed lane closes it."""
    suite, events = _suite_with_fakes(monkeypatch)
    monkeypatch.setattr(suite, "_run_lanes", lambda *a: events.append(("lanes", None)))
    first = suite._lanes_then_warm([["00"], ["01"]], [None, None], None, tmp_path, 60, ["05", "x"])
    suite._run_each(["05", "x"], {}, None, tmp_path, 60, first)
    assert events[:2] == [("start", "05"), ("lanes", None)]
    assert suite._lanes_then_warm([["00"]], [None], None, tmp_path, 60, []) is None  # nothing after them
    assert [n for e, n in events if e == "start"] == ["05", "x"]  # 05's kernel was not started twice
    assert events.index(("run", "05")) < events.index(("run", "x"))

    def failing(*a):
        raise errors.LaneFailed("a lane failed")

    events.clear()
    monkeypatch.setattr(suite, "_run_lanes", failing)
    with pytest.raises(errors.LaneFailed, match="a lane failed"):
        suite._lanes_then_warm([["00"], ["01"]], [None, None], None, tmp_path, 60, ["05"])
    assert events == [("start", "05"), ("close", "05")]


def test_an_import_that_fails_fails_the_warm_up_in_one_line_even_where_a_batch_run_skips_it(tmp_path):
    src = _notebook(
        tmp_path / "nb.ipynb",
        "INTERACTIVE = False\nif INTERACTIVE:\n    from json import no_such_name\nfrom email import utils",
        "import no_such_module_here",
    )
    kernel = warm.WarmKernel(src, ROOT)
    try:
        assert kernel.ready(timeout=120)
        failure = kernel.failure()
    finally:
        kernel.close()
    assert failure == (
        "an import of the notebook fails: "
        "from json import no_such_name: ImportError: cannot import name 'no_such_name' from 'json'; "
        "import no_such_module_here: ModuleNotFoundError: No module named 'no_such_module_here'"
    )


def test_the_statements_are_checked_as_written_a_name_or_a_submodule(tmp_path):
    src = _notebook(tmp_path / "nb.ipynb", "from email import utils, message\nfrom os import path, sep\n")
    assert warm.import_statements(src) == [("email", ("utils", "message")), ("os", ("path", "sep"))]
    kernel = warm.WarmKernel(src, ROOT)
    try:
        assert kernel.ready(timeout=120)
        assert kernel.failure() is None  # utils and message are submodules, path and sep attributes
    finally:
        kernel.close()


def test_a_notebook_whose_panel_import_fails_is_marked_failed_before_it_runs(tmp_path, monkeypatch):
    from nblib.run import suite
    from nblib.schema import params as P

    nb = json.loads((NOTEBOOK_DIR / "01_canary.ipynb").read_text())
    for cell in nb["cells"]:  # the panel's import as it read when the module was elsewhere
        cell["source"] = [line.replace("nblib.lab import", "nblib.publish import") for line in cell["source"]]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_canary.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(suite, "NOTEBOOK_DIR", tmp_path / "notebooks")
    out = tmp_path / "run"
    with pytest.raises(
        errors.NotebookFailed, match="01_canary failed: 01_canary: an import of the notebook fails"
    ):
        suite.run(P.ROOT / "params" / "ci.yaml", out, only=["01"])
    (rec,) = json.loads((out / "index.json").read_text())["notebooks"]
    assert rec["status"] == "failed"
    assert rec["error"] == (
        "01_canary: an import of the notebook fails: from nblib.publish import widgets: "
        "ImportError: cannot import name 'widgets' from 'nblib.publish'"
    )
    assert not (out / "01_canary.ipynb").exists()  # nothing ran: the error came before the heavy cells
