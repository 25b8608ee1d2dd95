"""What a stream capture forbids, in one place: CUDA's rules, shared by both backends. Each Rule names
the CUDA error it stands for and when CUDA reports it (Rule.reported), so the audit can say which rule
a line broke on either backend, and scripts/gpu_audit_zoo.py can measure the same cases on CUDA for
the parity table. The simulator raises SimCaptureError where CUDA (or torch's capture bindings)
refuses a call or invalidates the capture; each error names its Rule (nblib.backends.sim.rules
raises them).
"""

from typing import NamedTuple

__all__ = [
    "AT_CALL",
    "AT_NEXT_CALL",
    "CUDA_TEXTS",
    "EAGER",
    "RULES",
    "SIM_ONLY",
    "Rule",
    "SimCaptureError",
]


class Rule(NamedTuple):
    name: str
    cuda_error: str  # what CUDA (or torch) answers
    cuda_text: str  # how that error reads in torch's message (cudaGetErrorString, or torch's check)
    says: str  # the rule, for the person who broke it
    reported: str  # when CUDA reports it: AT_CALL, AT_NEXT_CALL, EAGER (never) or SIM_ONLY


AT_CALL = "at the call"  # the illegal call itself fails
AT_NEXT_CALL = "at the next call (capture invalidated)"  # accepted; the next call fails, "invalidated"
EAGER = "never: CUDA runs it eagerly, outside the graph"  # no error; replay never runs the work
SIM_ONLY = "(simulator only)"


RULES = {
    r.name: r
    for r in (
        Rule(
            "sync",
            "cudaErrorStreamCaptureUnsupported",
            "operation not permitted when stream is capturing",
            "no host synchronization while a stream captures (synchronize(), .item(), bool() or a "
            "data-dependent branch on a device tensor, a blocking copy to the host)",
            AT_CALL,
        ),
        Rule(
            "query",
            "cudaErrorStreamCaptureUnsupported",
            "operation not permitted when stream is capturing",
            "no query of a capturing stream (stream.query()) while it captures",
            AT_CALL,
        ),
        Rule(
            "captured_event",
            "cudaErrorCapturedEvent",
            "operation not permitted on an event last recorded in a capturing stream",
            "an event recorded inside a capture can be waited on, not queried or synchronized",
            AT_CALL,
        ),
        Rule(
            "isolation",
            "cudaErrorStreamCaptureIsolation",
            "dependency created on uncaptured work in another stream",
            "a capturing stream may not wait on an event recorded outside the capture (wait_stream "
            "on a stream that never joined the capture records such an event)",
            AT_CALL,
        ),
        Rule(
            "merge",
            "cudaErrorStreamCaptureMerge",
            "operation would result in a merge of separate capture sequences",
            "a capturing stream may not wait on an event recorded in another capture (CUDA accepts "
            "the wait and invalidates the capture: the next call fails; measured on the H200)",
            AT_NEXT_CALL,
        ),
        Rule(
            "unjoined",
            "cudaErrorStreamCaptureUnjoined",
            "capturing stream has unjoined work",
            "every stream forked from the capture must be joined back into the capturing stream "
            "before the capture ends",
            AT_CALL,
        ),
        Rule(
            "legacy",
            "(none: torch's streams are non-blocking, so CUDA runs it eagerly, outside the graph; "
            "measured on the H200)",
            # what CUDA answers where the capturing stream is a blocking one (torch's never are):
            # cudaErrorStreamCaptureImplicit
            "operation would make the legacy stream depend on a capturing blocking stream",
            "work on the default (legacy) stream while a capture is underway is not captured; the "
            "simulator refuses it, since replay would never run it",
            EAGER,
        ),
        Rule(
            "uncaptured_stream",
            "(none: CUDA runs it eagerly, outside the graph; measured on the H200)",
            "",
            "work queued on a stream that never joined the capture is not captured; the simulator "
            "refuses it, since replay would never run it",
            EAGER,
        ),
        Rule(
            "default_stream",
            "torch RuntimeError",
            "CUDA graphs must be captured on a non-default stream",
            "capture on a side stream (torch.cuda.graph does), not the default stream",
            AT_CALL,
        ),
        Rule(
            "end_stream",
            "torch RuntimeError",
            "Capture must end on the same stream it began on",
            "end the capture on the stream it began on",
            AT_CALL,
        ),
        Rule(
            "graph_destroyed",
            "cudaErrorStreamCaptureUnsupported",
            "operation not permitted when stream is capturing",
            "no CUDA graph may be destroyed while a capture is underway (cudaGraphExecDestroy); a "
            "graph kept in a reference cycle is destroyed whenever the garbage collector runs",
            AT_NEXT_CALL,
        ),
        Rule(
            "invalidated",
            "cudaErrorStreamCaptureInvalidated",
            "operation failed due to a previous error during capture",
            "an earlier call broke this capture (if no call of yours failed first, a destructor did: "
            "e.g. a CUDA graph freed by the garbage collector inside the capture)",
            AT_CALL,
        ),
        Rule(
            "unsupported_op",
            "(simulator only)",
            "",
            "the simulator cannot capture this op",
            SIM_ONLY,
        ),
    )
}


# torch's message for each CUDA error -> the rule; the first rule listed wins a shared text
CUDA_TEXTS: dict[str, str] = {}
for _r in RULES.values():
    if _r.cuda_text:
        CUDA_TEXTS.setdefault(_r.cuda_text, _r.name)


class SimCaptureError(RuntimeError):
    """Raised where CUDA would refuse the call or invalidate the capture; .rule names the Rule and,
    for an invalidated capture, .cause the rule whose breaking invalidated it."""

    def __init__(self, message, rule=None, cause=None):
        super().__init__(message)
        self.rule, self.cause = rule, cause
