"""The device facade's side streams: never the stream a capture runs on."""

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
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_plain_draws_wrap_onto_the_capture_stream_and_the_facade_s_do_not():
    dev = device.get("cuda")
    side = dev.Stream()
    capture = torch.cuda.graph.default_capture_stream.cuda_stream
    assert side.cuda_stream != capture
    plain = [torch.cuda.Stream().cuda_stream for _ in range(64)]
    assert capture in plain  # torch's pool hands the capture stream out again
    assert all(dev.Stream().cuda_stream != capture for _ in range(64))
