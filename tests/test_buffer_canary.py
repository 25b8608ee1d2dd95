"""The canary over buffers a user names: every byte changed outside the regions the step may write is
reported, none inside them; checked against a full copy of the buffers taken in the test."""

import pytest
import torch

from nblib.backends.sim import SimDevice
from nblib.instruments.buffer_canary import BufferCanary

BLOCK = 64


def changed_outside(before, after, allowed):
    """The byte indices that differ, minus the allowed [start, stop) ranges: the reference."""
    diff = (before.view(torch.uint8) != after.view(torch.uint8)).nonzero().flatten().tolist()
    return {i for i in diff if not any(s <= i < e for s, e in allowed)}


def alarmed(alarms, name):
    return {i for a in alarms if a.buffer == name for i in range(a.start, a.stop)}


@pytest.mark.parametrize(
    "writes",
    [
        [(100, 104)],  # inside the allowed region only
        [(100, 104), (10, 11)],  # and one byte in a block with no allowed region
        [(100, 104), (96, 97)],  # and one byte beside the region, in its block
        [(100, 104), (500, 520), (1000, 1024)],
    ],
)
def test_every_byte_changed_outside_the_allowed_regions_is_reported(writes):
    kv = torch.arange(256, dtype=torch.float32)  # 1024 bytes, 16 blocks of 64
    allowed = [(100, 104)]
    canary = BufferCanary({"kv": kv}, writes=lambda: {"kv": allowed}, block=BLOCK)
    before = kv.clone()

    def step():
        raw = kv.view(torch.uint8)
        for s, e in writes:
            raw[s:e] ^= 0xFF

    alarms = canary.around(step)
    expect = changed_outside(before, kv, allowed)
    got = alarmed(alarms, "kv")
    assert expect <= got  # nothing missed
    for a in alarms:  # an exact alarm names changed bytes only; a block alarm, a block that changed
        span = set(range(a.start, a.stop))
        assert span <= expect if a.exact else span & expect
        assert a.exact == any(s < a.stop and a.start < e for s, e in [(64, 128)])  # the allowed block


def test_a_swap_of_two_words_is_seen_and_a_clean_step_raises_nothing():
    pages = torch.arange(64, dtype=torch.int32)
    canary = BufferCanary({"pages": pages}, block=BLOCK)
    assert canary.around(lambda: None) == []
    alarms = canary.around(lambda: pages[:2].copy_(pages[:2].flip(0)))
    assert [(a.start, a.stop, a.exact) for a in alarms] == [(0, 64, False)]


def test_a_captured_step_that_writes_past_its_slot_is_caught_on_the_simulator():
    """A captured step on two streams: main writes its slot of the cache, and the side stream writes
    the next slot too, which the step says it does not write: the canary names that slot's bytes."""
    dev = SimDevice()
    side = dev.Stream()
    cache = torch.zeros(8, 16)  # 8 slots of 64 bytes
    g = dev.CUDAGraph()
    with dev.graph(g):
        main = dev.current_stream()
        side.wait_stream(main)
        cache[3].fill_(1.0)
        with dev.stream(side):
            cache[4].fill_(2.0)
        main.wait_stream(side)
    canary = BufferCanary({"cache": cache}, writes=lambda: {"cache": [(3 * 64, 4 * 64)]}, block=BLOCK)
    alarms = canary.around(g.replay)
    assert [(a.buffer, a.start, a.stop) for a in alarms] == [("cache", 256, 320)]


def test_bad_input_fails_in_one_line():
    with pytest.raises(ValueError, match="contiguous"):
        BufferCanary({"x": torch.zeros(4, 4).t()})
    with pytest.raises(ValueError, match="multiple of 4"):
        BufferCanary({"x": torch.zeros(3, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="block"):
        BufferCanary({"x": torch.zeros(4)}, block=6)
    canary = BufferCanary({"x": torch.zeros(4)}, writes=lambda: {"y": [(0, 4)]})
    with pytest.raises(ValueError, match="does not watch"):
        canary.before()
    with pytest.raises(RuntimeError, match="before"):
        BufferCanary({"x": torch.zeros(4)}).after()
