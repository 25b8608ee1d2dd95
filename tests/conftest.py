import os

import pytest
import torch
from models import EAGER

import nblib.backends.sim  # noqa: F401  (every test sees the simulator's bf16 GEMMs: sim/gemm.py)
from nblib.core.paths import ROOT
from nblib.engine import build

# A pytest-xdist worker (make test) takes its share of the cores for torch's threads, and passes it
# to the processes it starts (the suite's lanes and kernels): a thread per core in every worker
# oversubscribes the cores (two workers on two cores spent 1.5x the CPU seconds of one process).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


class EagerCpu:
    """The smallest device: plain CPU torch, one stream, never capturing (the eager path only)."""

    name = "cpu"
    torch_device = torch.device("cpu")

    def Stream(self):
        return None

    def is_current_stream_capturing(self):
        return False

    def synchronize(self):
        pass


@pytest.fixture
def eager_dev():
    return EagerCpu()


@pytest.fixture
def tiny_model(eager_dev):
    return build.model(eager_dev, EAGER)


@pytest.fixture(scope="session")
def ci_suite(tmp_path_factory):
    """The main job on the ci profile, every notebook 00 to 05, once per test session, in two
    lanes (as the H200 run uses them), so every notebook test also proves the lanes."""
    # imported here: papermill is not in the venv of `make test-newest`, which never runs the suite
    from nblib.run import suite

    out = tmp_path_factory.mktemp("ci_suite")
    suite.run(ROOT / "params" / "ci.yaml", out, lanes=2)
    return out


# Why a test marked gpu (@pytest.mark.gpu, or pytest.param(..., marks=pytest.mark.gpu)) is skipped:
# pytest_collection_modifyitems skips every such test, in one place, where torch finds no CUDA device.
NO_GPU = (
    f"needs a CUDA GPU: torch {torch.__version__} finds no CUDA device here "
    "(torch.cuda.is_available() is False); run it on a GPU machine (pytest -m gpu)"
)


def pytest_addoption(parser):
    parser.addoption(
        "--reverse", action="store_true", help="run the collected tests in reverse order (order-leak check)"
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config, items):
    # Reversed, a test that only passes because an earlier one warmed a cache or left state behind
    # (compiled kernels, graphs awaiting collection) meets the process in a different state.
    if config.getoption("--reverse"):
        items.reverse()
    no_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason=NO_GPU)
    for item in items:
        group = worker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if no_gpu is not None and item.get_closest_marker("gpu"):
            item.add_marker(no_gpu)


def pytest_configure(config):
    # pytest-xdist's --dist loadgroup (make test) marks each test's group in its id, which pytest 9.2
    # builds another way: nothing is grouped (pytest-xdist issue 1386), the ci suite runs once a worker
    major_minor = tuple(int(p) for p in pytest.__version__.split(".")[:2])
    if getattr(config.option, "dist", "no") == "loadgroup" and major_minor >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__}: pytest-xdist's --dist loadgroup groups nothing on pytest 9.2 "
            "and later; pip install 'pytest<9.2', or run the tests in one process (make test TEST_WORKERS=0)"
        )


def worker_group(item):
    """The test's group under pytest-xdist (`make test`: -n auto --dist loadgroup); a group runs
    whole in one worker. The ci suite's tests share one run of the suite, not one a worker; the
    GPU tests share the one GPU, where two at once would time or fill it together; a test with a
    fixture wider than itself goes with its module, so the fixture is built once; None: any worker."""
    if "ci_suite" in getattr(item, "fixturenames", ()):
        return "ci_suite"
    if item.get_closest_marker("gpu"):
        return "gpu"
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.baseid and d.scope != "function" for ds in defs.values() for d in ds):  # ours, not pytest's
        return item.nodeid.split("::")[0]
    return None
