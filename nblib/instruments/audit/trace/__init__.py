"""Record a capture: allocations, frees, every op's byte accesses, and the stream syncs, in program order.

    with nblib.instruments.audit.recording(dev) as rec:   # around code that captures by itself
        runner.capture(record=rec)                        # rec(bucket) labels each capture (optional)
    rec.captures                                          # one CaptureTrace per graph captured

A CaptureTrace is a list of Step records in the order the host issued them (records.py): alloc,
free, op (its stream and the byte ranges it reads and writes), record (an event on a stream) and
wait (a stream waits on a recorded event; wait_stream is a record plus a wait).

Nothing here changes what is captured: the recorder only reads. nblib.instruments.audit turns a
trace into happens-before (vector clocks) and races; it hands itself to the recorder as `analyse`,
so this package never imports the audit.

Modules: stacks (user frames and sites), records (the trace's records), recorder (the shared
install/uninstall shape), sim (reads the simulator's own capture record), cuda (a dispatch mode,
wrapped sync methods and Triton's launch hook, for real captures).
"""

from nblib.instruments.audit.trace.cuda import CudaRecording
from nblib.instruments.audit.trace.recorder import Recording
from nblib.instruments.audit.trace.records import Access, Alloc, CaptureTrace, Op, Step, op_name, stream_namer
from nblib.instruments.audit.trace.sim import SimRecording
from nblib.instruments.audit.trace.stacks import format_stack, python_stack, site, skip, user_frames

RECORDERS = {"sim": SimRecording, "cuda": CudaRecording}


def recording(dev, analyse=None):
    """`with recording(dev) as rec:` records every capture made inside, on either backend;
    `analyse(traces, names=)` is what rec.report() runs (nblib.instruments.audit.audit)."""
    if dev.name not in RECORDERS:
        raise ValueError(f"no capture recorder for backend {dev.name!r}: use 'sim' or 'cuda'")
    return RECORDERS[dev.name](dev, analyse)


__all__ = [
    "Access",
    "Alloc",
    "CaptureTrace",
    "CudaRecording",
    "Op",
    "Recording",
    "SimRecording",
    "Step",
    "format_stack",
    "op_name",
    "python_stack",
    "recording",
    "site",
    "skip",
    "stream_namer",
    "user_frames",
]
