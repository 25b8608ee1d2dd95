"""The simulator's large host tensors reuse freed heap blocks instead of faulting in fresh pages."""

import subprocess
import sys
import textwrap

import pytest

FAULTS = textwrap.dedent(
    """
    import resource, sys, torch
    if sys.argv[1] == "kept":
        from nblib.backends.sim.heap import keep_large_blocks
        assert keep_large_blocks()
    keys = torch.ones(40, 2112, 128, dtype=torch.bfloat16)  # the indexer reference's keys at bucket 40
    keys.float()  # the first conversion may grow the heap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        keys.float()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def faults(mode):
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_large_tensor_made_again_reuses_the_heap_rather_than_fresh_pages():
    pages = 40 * 2112 * 128 * 4 // 4096  # one fp32 copy, in 4 KB pages
    assert faults("default") > 2 * pages  # glibc maps and unmaps a block this large every time
    assert faults("kept") < pages // 10
