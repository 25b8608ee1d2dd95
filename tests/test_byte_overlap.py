"""The capture audit's byte comparison (nblib.instruments.audit.byte_overlap): two accesses share a byte
exactly when their byte sets meet, for views compared element by element and for wide ones compared
from their layout."""

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nblib.instruments.audit import byte_overlap


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    stride=st.lists(st.integers(-9, 9), min_size=3, max_size=3),
    size=st.sampled_from([1, 2, 4]),
    offset=st.integers(-64, 64),
)
def test_wide_views_of_one_layout_share_a_byte_exactly_when_their_bytes_meet(shape, stride, size, offset):
    """Views too wide to list element by element are compared from their layout when both have the
    same one: checked here on small views (the element lists switched off) against their byte sets."""
    layout = (tuple(shape), tuple(stride[: len(shape)]), size)
    a = types.SimpleNamespace(addr=1000, nbytes=0, layout=layout)
    b = types.SimpleNamespace(addr=1000 + offset, nbytes=0, layout=layout)

    def bytes_of(v):
        starts = {0}
        for n, st_ in zip(*v.layout[:2]):
            starts = {s + i * st_ * size for s in starts for i in range(n)}
        return {v.addr + s + k for s in starts for k in range(size)}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(byte_overlap, "MAX_EXACT", 0)
        assert byte_overlap.share_bytes(a, b) == bool(bytes_of(a) & bytes_of(b))
