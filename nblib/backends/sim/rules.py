"""The simulator's side of the capture rules (nblib.backends.capture_rules): the error for a broken
rule, and the capture it breaks.

As on CUDA, a violation also invalidates the capture underway: if the caller catches the error and
carries on, the capture still fails when it ends. Where CUDA accepts the illegal call and only
invalidates the capture (AT_NEXT_CALL), so does the simulator (invalidate()): the next captured op,
or capture_end, raises the "invalidated" error, whose .cause names the rule broken.
"""

from typing import NamedTuple

from nblib.backends.capture_rules import RULES, SimCaptureError


class Broken(NamedTuple):
    """Why a capture is invalid: the rule broken and where."""

    rule: str
    detail: str

    def __str__(self):
        return f"{self.rule}: {self.detail}"


def invalidate(dev, name, detail):
    """Rule `name` broken where CUDA accepts the call and only invalidates the capture underway
    (AT_NEXT_CALL): nothing is raised now; the next captured op, or capture_end, raises the
    "invalidated" error with .cause `name`."""
    cap = dev.capture
    if cap is not None and cap.invalid is None:
        cap.invalid = Broken(name, detail)


def violation(dev, name, detail, cause=None):
    """The error for breaking rule `name`; the capture underway (if any) is invalidated by it.
    `cause`: for "invalidated", the Broken record of the earlier violation."""
    rule = RULES[name]
    cap = dev.capture
    if cap is not None and cap.invalid is None and name != "invalidated":
        cap.invalid = Broken(name, detail)
    return SimCaptureError(
        f"{detail}: {rule.says} ({rule.cuda_error})", rule=name, cause=cause.rule if cause else None
    )
