"""The simulator's large host blocks are reused from the heap instead of being faulted in afresh."""

import subprocess
import sys
import textwrap

import pytest

FAULTS = textwrap.dedent(
    """
    import ctypes, resource, sys
    if sys.argv[1] == "kept":
        from nblib.backends.sim.heap import keep_large_blocks
        assert keep_large_blocks()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    n = 40 * 2112 * 128 * 4  # the indexer reference's keys in fp32 at bucket 40: 43 MB

    def block():  # what a tensor of n bytes does: allocate, write every page, free
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        libc.free(p)

    block()  # the first one may grow the heap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        block()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def faults(mode):
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_large_block_made_again_reuses_the_heap_rather_than_fresh_pages():
    pages = 40 * 2112 * 128 * 4 // 4096
    assert faults("default") > 2 * pages  # glibc maps and unmaps a block this large every time
    assert faults("kept") < pages // 10
