"""Audit your own code: capture one step of it under the recorder and name every cross-stream race.

    python -m nblib audit examples/audit/dsv4_attention.py:fused [--backend cuda|sim] [--json]

    from nblib.instruments.audit import target as audit_target
    rep = audit_target.audit("my_engine.decode:make_step", backend="sim")   # a TARGET, or
    rep = audit_target.audit(make_step, device=dev)                        # the function itself, or
    rep = audit_target.audit_step(step, dev, target="decode step")         # a step you built
    rep.status, rep.exit_code, rep.hazards, print(rep.text()), rep.model_dump_json()

The contract (docs/audit.md): TARGET names a function, `module:function` or `path/to/file.py:function`,
that builds whatever the step needs (weights, caches, static inputs, side streams), runs any warm-up
eagerly, and returns the zero-argument callable to capture. If the function takes one parameter it
receives the device facade (nblib.backends.device): code written against `dev.torch_device`,
`dev.Stream()`, `dev.stream(s)`, `dev.current_stream()`, `s.wait_stream`, `s.record_event()` and
`dev.record_stream(t, s)` runs on the simulator and, unchanged, on CUDA (where each of those is
torch.cuda's own). A function with no parameter is plain torch.cuda code: CUDA only.

The step is captured once, into a new graph, with nblib.instruments.audit.audit_capture; nothing is
replayed. Each hazard is reported with its two ops, their streams, the tensors behind the bytes, and
the allocation, free and use sites in the caller's code (frames of nblib, torch and site-packages
left out). Exit codes: 0 clean, 1 a hazard, 2 the step could not be built or captured (with the
capture rule it broke) or the TARGET is bad. Whatever happens, nothing is left capturing and the
recorder's patches are gone when audit returns.
"""

import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from nblib.backends import device as devices
from nblib.backends.capture_rules import RULES
from nblib.instruments import audit as A
from nblib.instruments.audit import confirm as audit_confirm
from nblib.instruments.audit.records import (
    Failure,
    HazardRecord,
    OpRecord,
    Site,
    TargetReport,
    TensorRecord,
    hazard_record,
    not_users,
    relpath,
)
from nblib.instruments.audit.report import one_line

__all__ = [
    "Failure",
    "HazardRecord",
    "OpRecord",
    "Site",
    "Target",
    "TargetError",
    "TargetReport",
    "TensorRecord",
    "audit",
    "audit_step",
    "capturing",
    "device_for",
    "load",
]


class TargetError(ValueError):
    """A TARGET that cannot be loaded (bad spelling, module or file not found, no such function, not
    callable, wrong signature) or a backend this machine lacks: one line, before any capture."""


# ------------------------------------------------------------------------------------------------
# loading a TARGET
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    spec: str  # what the user wrote
    fn: object  # the function that builds the step
    takes_device: bool


def load(spec):
    """`module:function` or `path/to/file.py:function` -> Target; TargetError in one line if not."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise TargetError(
            f"TARGET {spec!r} is not module:function or path/to/file.py:function "
            "(e.g. examples/audit/dsv4_attention.py:fused)"
        )
    module = _load_file(where) if where.endswith(".py") or os.sep in where else _load_module(where)
    if not hasattr(module, name):
        raise TargetError(f"{where} has no function {name!r}: define `def {name}(dev): ... return step`")
    fn = getattr(module, name)
    if not callable(fn):
        raise TargetError(
            f"{where}:{name} is not callable ({type(fn).__name__}): name the function that returns the step"
        )
    return Target(spec, fn, _takes_device(spec, fn))


def _load_module(name):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):  # the target, not a dependency
            raise TargetError(
                f"module {name!r} not found: check the spelling and that it is importable from here "
                "(or give a path, path/to/file.py:function)"
            ) from None
        raise TargetError(f"importing {name} failed: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise TargetError(f"importing {name} failed: {type(e).__name__}: {e}") from None


def _load_file(path):
    p = Path(path)
    if not p.is_file():
        raise TargetError(f"file {path!r} not found (from {os.getcwd()})")
    name = "_nblib_audit_target_" + re.sub(r"\W", "_", str(p.resolve().with_suffix("")))
    spec = importlib.util.spec_from_file_location(name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    sys.path.insert(0, str(p.resolve().parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise TargetError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(p.resolve().parent))
    return module


def _takes_device(spec, fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise TargetError(
            f"{spec} takes {len(required)} arguments: it must take the device facade or nothing "
            "(bind the rest with defaults or functools.partial)"
        )
    return len(required) == 1


# ------------------------------------------------------------------------------------------------
# auditing
# ------------------------------------------------------------------------------------------------


def device_for(backend="auto"):
    """The device facade for a backend name, or TargetError in one line."""
    try:
        return devices.get(backend)
    except (ValueError, RuntimeError) as e:
        raise TargetError(str(e)) from None


def audit(target, backend="auto", label=None, device=None, confirm=0):
    """Audit a TARGET (`module:function`, `path.py:function`) or a function that builds the step
    (taking the device facade or nothing). `device` overrides `backend` with a facade you hold.
    confirm=N: then force each hazard's losing order N times and compare with eager
    (nblib.instruments.audit.confirm; on a clean target, each side branch delayed in turn)."""
    if confirm < 0:
        raise TargetError(f"--replays must be a positive number of forced replays, got {confirm}")
    t = load(target) if isinstance(target, str) else _wrap(target)
    dev = device if device is not None else device_for(backend)
    if not t.takes_device and dev.name != "cuda":
        raise TargetError(
            f"{t.spec} takes no device argument, so it is plain torch.cuda code: run it with --backend "
            "cuda, or give it a `dev` parameter and use the facade's API to run it on the simulator"
        )
    prev = dev.current_stream()
    try:
        step = t.fn(dev) if t.takes_device else t.fn()
    except Exception as e:
        return _failed(t.spec, dev, label, Failure(stage="build", message=_one_line("building the step", e)))
    finally:
        A.restore_stream(dev, prev)
    if not callable(step):
        return _failed(
            t.spec,
            dev,
            label,
            Failure(stage="build", message=f"{t.spec} returned a {type(step).__name__}, not the step"),
        )
    rep = audit_step(step, dev, target=t.spec, label=label)
    if confirm and rep.status != "failed":
        rep.add_confirm(audit_confirm.confirm(step, dev, rep, replays=confirm))
    return rep


def _wrap(fn):
    if not callable(fn):
        raise TargetError(f"a TARGET is a string or a function, not a {type(fn).__name__}")
    spec = getattr(fn, "__qualname__", None) or repr(fn)
    return Target(spec, fn, _takes_device(spec, fn))


def audit_step(step, dev, target=None, label=None):
    """Capture the zero-argument callable `step` once on `dev` under the recorder and audit it."""
    target = target or getattr(step, "__qualname__", None) or repr(step)
    rep = failure = None
    try:
        rep = A.audit_capture(step, device=dev, label=dict(target=label or target))
    except A.AuditCaptureError as e:
        failure = capture_failure(e)
    still = capturing(dev)
    if still:  # audit_capture ends every capture it starts: one still open was begun by the step
        dev.abort_capture()
        msg = f"after capturing {target}, {still}: the step must not begin a capture of its own"
        failure = Failure(stage="capture", message=msg)
    if failure is not None:
        return _failed(target, dev, label, failure)
    out = TargetReport(
        target=target,
        backend=dev.name,
        label=label or target,
        status="hazards" if rep.hazards else "clean",
        captures=len(rep.traces),
        ops=rep.ops,
        hazards=[hazard_record(h) for h in rep.hazards],
        notes=list(rep.notes),
    )
    out.audit_report = rep
    return out


def capture_failure(e):
    """The Failure record of an AuditCaptureError: its message and the capture rule it broke."""
    rule = A.rule_of(e.__cause__ or e)
    r = RULES.get(rule)
    message = str(e)
    if r is not None:  # the rule gets its own fields
        message = message.split(" [rule ", maxsplit=1)[0]
    return Failure(
        stage="capture",
        message=message,
        rule=rule,
        rule_says=r.says if r else None,
        cuda_error=r.cuda_error if r else None,
    )


def capturing(dev):
    """'' when nothing captures on `dev`, else what still does."""
    if dev.name == "sim":
        return "the simulator is still capturing" if dev.is_capturing() else ""
    return "the current CUDA stream is still capturing" if dev.is_current_stream_capturing() else ""


def _failed(target, dev, label, failure):
    return TargetReport(
        target=target, backend=dev.name, label=label or target, status="failed", failure=failure
    )


def _one_line(what, e):
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not not_users(f.filename)]
    where = f" at {relpath(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{what} failed{where}: {one_line(e)}"


# ------------------------------------------------------------------------------------------------
# the audit in a process of its own
# ------------------------------------------------------------------------------------------------


def main(argv=None):
    """`python -m nblib.instruments.audit.target TARGET [--backend B]`: the report as JSON on stdout,
    exit 0 clean, 1 a hazard, 2 a failed build or capture or a bad TARGET (one line on stderr); what
    `python -m nblib audit TARGET --backend B --json` prints and exits with, for a caller below the
    command line (nblib.studies.engines runs it as a child, beside its own audits)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nblib.instruments.audit.target")
    p.add_argument("target")
    p.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto")
    args = p.parse_args(argv)
    try:
        rep = audit(args.target, args.backend)
    except TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(rep.model_dump_json(indent=2))
    return rep.exit_code


if __name__ == "__main__":
    sys.exit(main())
