"""Python's cyclic garbage collector, paused while a graph captures.

A CUDAGraph that became garbage inside a reference cycle (a runner, its model and its instruments
point at each other) is destroyed whenever the collector next runs. If that happens while another
graph is capturing, its cudaGraphExecDestroy is refused ("operation not permitted when stream is
capturing (function reset)") and, in the default global capture mode, the capture being made is
invalidated (cudaErrorStreamCaptureInvalidated). The collector runs when enough Python objects have
been allocated, so which capture it lands in depends on everything the process did before: a test
passes alone and fails after another test, or the other way round. torch.cuda.graph does not
collect before capturing (torch.compiler.config.force_cudagraph_gc is off by default, for speed),
so nothing stops a dead graph from dying mid-capture but this pause. The garbage is collected later,
outside the capture, when the collector runs next. A graph whose last reference the captured code
itself drops still dies mid-capture: that is a bug in the code being captured, and the capture
fails as it would without the pause.
"""

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused"]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off inside the block, back to its previous state after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
