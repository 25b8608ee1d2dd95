"""Whether two recorded accesses touch a common byte: the audit's comparison of strided views.

Two accesses whose byte extents overlap may still share no byte: interleaved columns of one tensor
cover the same extent and never the same element. Views of up to MAX_EXACT elements are compared
element by element; wider ones from their layout when both have the same one (shape, strides, item
size: whether the difference of their addresses lies within one item of a difference of two element
offsets), and by their extents otherwise (a race may be over-reported, never missed).
"""

import numpy as np

__all__ = ["MAX_EXACT", "MAX_TRIES", "share_bytes"]

MAX_EXACT = 1 << 22  # elements: larger strided views are compared by their layout, else by extent
MAX_TRIES = 64  # index choices per dimension before a wide comparison settles for the extent


def _element_starts(a):
    """Sorted byte addresses of an access's elements and the bytes each covers."""
    if a.layout is None:
        return np.array([a.addr], dtype=np.int64), a.nbytes
    shape, stride, size = a.layout
    starts = np.zeros(1, dtype=np.int64)
    for n, st in zip(shape, stride):
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * (st * size)).ravel()
    return np.sort(a.addr + starts), size


def _reaches(d, dims, size):
    """Whether some sum of i * step over `dims` ((n, step) pairs, |i| < n) lies within `size` bytes of
    `d`: two views of one layout whose addresses differ by d then share a byte. None: too many index
    choices to try (strides that do not nest)."""
    if not dims:
        return abs(d) < size
    (n, step), rest = dims[0], dims[1:]
    reach = size + sum((m - 1) * abs(st) for m, st in rest)  # how far the smaller dimensions go
    if step == 0:
        return _reaches(d, rest, size)
    lo = max(-(n - 1), -((reach - d) // step))  # ceil((d - reach) / step)
    hi = min(n - 1, (d + reach) // step)
    if hi - lo >= MAX_TRIES:
        return None
    answers = [_reaches(d - i * step, rest, size) for i in range(lo, hi + 1)]
    return True if any(answers) else (None if None in answers else False)


def _same_layout_share(a, b):
    """Two wide views of one layout (shape, strides, item size) at different addresses: whether they
    share a byte, from the layout alone (interleaved halves of a tensor do not); None: undecided."""
    shape, stride, size = a.layout
    dims = sorted(((n, abs(st) * size) for n, st in zip(shape, stride) if n > 1), key=lambda x: -x[1])
    return _reaches(b.addr - a.addr, dims, size)


def share_bytes(a, b):
    """Whether two accesses whose extents overlap touch a common byte: exact for strided views
    (interleaved columns share an extent and no byte); views of over MAX_EXACT elements are decided
    from their layout when both have the same one, else by extent (a race may be over-reported)."""
    if a.layout is None and b.layout is None:
        return True
    if any(x.layout is not None and np.prod(x.layout[0]) > MAX_EXACT for x in (a, b)):
        same = a.layout is not None and a.layout == b.layout
        decided = _same_layout_share(a, b) if same else None
        return True if decided is None else decided
    sa, na = _element_starts(a)
    sb, nb = _element_starts(b)
    j = np.searchsorted(sb, sa + na) - 1  # the last element of b starting before each a ends
    ok = j >= 0
    return bool(np.any(sb[j[ok]] + nb > sa[ok]))
