"""What the field table measures beside the audit's verdict: the bytes a capture holds.

    rep, peak = held_bytes(dev, "examples/field/megatron_1f1b_record_stream.py:buggy")

`held_bytes` builds the target, audits one capture of its step and reads the caching allocator's trace
of that capture (the simulator's log, or CUDA's memory history): the peak, over the capture, of bytes in
blocks that are allocated or freed but not yet reusable (a block freed after `record_stream` waits for
the capture's end). A `record_stream` fix trades this for its race: docs/audit.md, the three fixes.
"""

from nblib.instruments.audit import target as audit_target


def _trace(dev):
    traces = dev.memory_snapshot().get("device_traces") or [[]]
    return traces[0]


def peak_held(entries):
    """The peak of bytes held over a list of allocator trace entries (alloc adds, free_completed
    returns)."""
    held = peak = 0
    for e in entries:
        size = e.get("block_size", e.get("size", 0))
        if e["action"] == "alloc":
            held += size
        elif e["action"] == "free_completed":
            held -= size
        peak = max(peak, held)
    return peak


def held_peak(dev, spec):
    """The capture's peak of bytes held, for TARGET `spec` on `dev` (a case's check)."""
    return held_bytes(dev, spec)[1]


def held_bytes(dev, spec):
    """(the audit's TargetReport, the capture's peak of bytes held) for TARGET `spec` on `dev`."""
    target = audit_target.load(spec)
    step = target.fn(dev)
    dev.memory_history(True)
    try:
        start = len(_trace(dev))
        rep = audit_target.audit_step(step, dev, target=spec)
        entries = _trace(dev)[start:]
    finally:
        dev.memory_history(False)
    return rep, peak_held(entries)
