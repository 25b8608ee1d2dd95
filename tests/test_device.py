"""The device facade's side streams: never the stream a capture runs on."""

import contextlib
import gc
import itertools

import pytest
import torch

from nblib.backends import device


class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


class _Pool:
    """torch's stream pool in miniature: handles handed out round robin."""

    def __init__(self, size):
        self._next = itertools.cycle(range(1, size + 1))

    def __call__(self):
        return _Stream(next(self._next))


class _Graph:
    default_capture_stream = None


def test_a_side_stream_is_never_the_capture_stream_even_after_the_pool_wraps():
    pool, graph = _Pool(4), _Graph()
    current = _Stream(0)
    sides = [device.distinct_stream(pool, graph, lambda: current) for _ in range(12)]
    capture = graph.default_capture_stream.cuda_stream
    assert capture == 1  # created lazily, as torch.cuda.graph does
    assert all(s.cuda_stream not in (capture, 0) for s in sides)
    # the pool did wrap: a plain draw lands on the capture stream every `size` draws
    assert any(pool().cuda_stream == capture for _ in range(4))


def test_a_pool_of_only_taken_streams_fails_in_one_line():
    graph, current = _Graph(), _Stream(1)
    with pytest.raises(RuntimeError, match="no side stream distinct from the capture stream"):
        device.distinct_stream(lambda: _Stream(1), graph, lambda: current, tries=3)


@pytest.mark.gpu
def test_on_cuda_plain_draws_wrap_onto_the_capture_stream_and_the_facade_s_do_not():
    dev = device.get("cuda")
    side = dev.Stream()
    capture = torch.cuda.graph.default_capture_stream.cuda_stream
    assert side.cuda_stream != capture
    plain = [torch.cuda.Stream().cuda_stream for _ in range(64)]
    assert capture in plain  # torch's pool hands the capture stream out again
    assert all(dev.Stream().cuda_stream != capture for _ in range(64))


class _Cycle:
    """A graph kept alive only by a reference cycle: garbage that the cyclic collector destroys."""

    def __init__(self, graph):
        self.graph, self.me = graph, self


def _capture_while_the_collector_would_run(dev, x):
    """Capture x.add_(1) while allocating enough cycles that an unpaused collector runs inside it."""
    g = dev.CUDAGraph()
    with dev.graph(g):
        x.add_(1)
        junk = [[] for _ in range(20 * gc.get_threshold()[0])]
        for j in junk:
            j.append(j)
        del junk
    return g


def _dead_captured_graph(dev, x):
    g = dev.CUDAGraph()
    with dev.graph(g):
        x.add_(1)
    _Cycle(g)  # the only reference left is the cycle's own


@pytest.mark.parametrize("backend", ["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_dead_graph_is_not_destroyed_inside_a_later_capture(backend):
    """The leak behind a capture that failed only after other tests: a graph that died in a reference
    cycle was destroyed by the cyclic collector inside a later capture, which invalidated it. The
    facades pause the collector while capturing; the dead graph goes at the next collection."""
    dev = device.get(backend)
    x = torch.zeros(4, device=dev.torch_device)
    gc.collect()
    _dead_captured_graph(dev, x)
    g = _capture_while_the_collector_would_run(dev, x)
    assert gc.isenabled() and not dev.is_current_stream_capturing()
    g.replay()
    dev.synchronize()
    assert gc.collect() > 0  # the dead graph's cycle, collected outside any capture


def test_without_the_pause_the_simulator_fails_the_capture_as_cuda_does(monkeypatch):
    """The same sequence with the collector running inside the capture: the simulator models
    cudaGraphExecDestroy inside a capture, and the capture fails (so the test above can fail)."""
    from nblib.backends.capture_rules import SimCaptureError
    from nblib.backends.sim import graph as sim_graph

    monkeypatch.setattr(sim_graph.collector, "paused", contextlib.nullcontext)
    dev = device.get("sim")
    x = torch.zeros(4)
    gc.collect()
    _dead_captured_graph(dev, x)
    with pytest.raises(SimCaptureError, match="destroyed while capturing"):
        _capture_while_the_collector_would_run(dev, x)
    gc.enable()


def test_the_pause_restores_the_collector_as_it_was():
    from nblib.core import collector

    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_backend_without_cuda_names_sim():
    with pytest.raises(RuntimeError, match="sim"):
        device.get("cuda")


def test_an_unknown_backend_fails_in_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match="cuda, sim"):
        device.get("tpu")
