"""nblib.instruments.audit.trace.stacks: which frames a hazard's stacks show."""

import importlib.util
import os

import pytest

from nblib.instruments.audit.trace import site, skip, user_frames


def _package_file(name, rel):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        pytest.skip(f"{name} is not installed")
    return os.path.join(os.path.dirname(spec.origin), rel)


@pytest.mark.parametrize(
    "package, rel",
    [("IPython", "core/interactiveshell.py"), ("ipykernel", "ipkernel.py"), ("_pytest", "python.py")],
)
def test_the_frames_of_what_runs_a_cell_or_a_test_are_not_the_users(package, rel):
    assert skip(_package_file(package, rel))


def test_a_cell_of_the_user_and_the_user_s_own_module_are_kept(tmp_path):
    assert not skip(str(tmp_path / "ipykernel_1234" / "981232210.py"))
    assert not skip(str(tmp_path / "model.py"))


def test_a_hazard_site_is_the_innermost_user_frame_below_ipython():
    shell = _package_file("IPython", "core/interactiveshell.py")
    stack = [
        dict(filename=shell, line=3518, name="run_cell_async"),
        dict(filename="/work/engine/model.py", line=269, name="step"),
        dict(filename=shell, line=1, name="called_back_into"),
    ]
    assert [f["name"] for f in user_frames(stack)] == ["step"]
    assert site(stack, code=False) == "model.py:269 in step"
