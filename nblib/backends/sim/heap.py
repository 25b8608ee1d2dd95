"""Keep the host's large blocks in the process's heap, so a tensor of tens of MB is not faulted in afresh.

glibc serves an allocation above its mmap threshold (at most 32 MB by default) with a fresh mapping
and unmaps it on free, so every such tensor pays a page fault per 4 KB page on first touch. A
simulated step makes several: the indexer's reference converts its gathered keys to fp32 (40 x 2,112 x
128, 43 MB at bucket 40), and converting into a fresh tensor takes about 9x as long as converting into
a reused one (50 ms against 5.7 ms on a 2-core AVX2 machine). Raising the threshold and the trim
threshold (`mallopt`, the knobs `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` set before a
process starts) lets freed blocks be reused; the values computed are the same. On a C library
without `mallopt` (macOS, musl) this does nothing.
"""

import ctypes
import ctypes.util
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's own rule (a freed mapped block raises the threshold to its size, the trim threshold to twice
# that) with a cap of 64 MB instead of 32: above it, blocks are still mapped and handed back, so a
# long-lived process (a test worker) does not keep every large block it ever freed
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD

_done = threading.Event()


def keep_large_blocks() -> bool:
    """Set the process's thresholds (once); True where the C library took both."""
    if _done.is_set():
        return True
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if ok:
        _done.set()
    return ok
