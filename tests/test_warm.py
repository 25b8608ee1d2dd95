"""The kernel started ahead (nblib.run.warm): it imports what its notebook imports, binds nothing in
the notebook's namespace, and papermill runs the notebook in it."""

import json

import nbformat
import papermill as pm
import pytest

from nblib.core.paths import NOTEBOOK_DIR, ROOT
from nblib.run import warm


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
