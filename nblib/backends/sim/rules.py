"""What a capture forbids, in one place: the simulator raises SimCaptureError where CUDA would fail
the capture."""


class SimCaptureError(RuntimeError):
    """Raised where CUDA would refuse the call or invalidate the capture."""
