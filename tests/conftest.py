import pytest
import torch
from models import EAGER

from nblib.core.paths import ROOT
from nblib.engine import build


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


def pytest_addoption(parser):
    parser.addoption(
        "--reverse", action="store_true", help="run the collected tests in reverse order (order-leak check)"
    )


def pytest_collection_modifyitems(config, items):
    # Reversed, a test that only passes because an earlier one warmed a cache or left state behind
    # (compiled kernels, graphs awaiting collection) meets the process in a different state.
    if config.getoption("--reverse"):
        items.reverse()
