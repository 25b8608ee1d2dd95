"""Python stacks for the audit: where a tensor was allocated or freed and where an op was issued,
with the instruments' own frames (and torch's, triton's, the simulator's) left out."""

import functools
import importlib.util
import linecache
import os
import sys

import torch

from nblib.core.paths import NBLIB

# frames of these files are the instruments', not the user's
_SKIP_FILES = tuple(
    str(NBLIB / f)
    for f in (
        "instruments/audit/trace" + os.sep,
        "instruments/audit/hazards.py",
        "instruments/audit/report.py",
        "instruments/audit/graph_check.py",
        "instruments/audit/graph_read.py",
        "instruments/audit/graph_match.py",
        "backends/sim" + os.sep,
    )
)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_SUFFIX = ("contextlib.py", "weakref.py")
# the machinery that runs a notebook cell or a test: wherever it is installed (a site-packages, or a
# --target folder on PYTHONPATH), its frames stand between the user's code and the op
_RUNNERS = ("IPython", "ipykernel", "papermill", "nbclient", "_pytest", "pluggy", "asyncio", "tornado")


@functools.cache
def _runner_dirs():
    dirs = []
    for name in _RUNNERS:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin:
            dirs.append(os.path.dirname(os.path.abspath(spec.origin)) + os.sep)
    return tuple(dirs)


def skip(filename):
    """True for a frame that is not the user's: instruments, simulator, torch, triton, contextlib,
    and what runs a cell or a test (IPython, ipykernel, papermill, pytest, asyncio)."""
    return (
        filename.startswith(_SKIP_FILES)
        or filename.startswith(_TORCH_DIR)
        or filename.endswith(_SKIP_SUFFIX)
        or f"{os.sep}triton{os.sep}" in filename
        or filename.startswith(_runner_dirs())
    )


def python_stack(limit=12, depth=1):
    """The caller's frames outside torch, triton and this package's instruments: innermost last."""
    f = sys._getframe(depth)
    out = []
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if not skip(fn):
            out.append(dict(filename=fn, line=f.f_lineno, name=f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


def user_frames(stack):
    """A stack without the instruments' own frames (sim stacks keep the audit report's caller frames)."""
    return [
        fr
        for fr in (stack or [])
        if not skip(fr["filename"]) and f"{os.sep}site-packages{os.sep}" not in fr["filename"]
    ]  # IPython, papermill, pytest


def site(stack, code=True):
    """'model.py:172 in _logits_buffer: t = torch.empty(...)': the innermost user frame."""
    frames = user_frames(stack)
    if not frames:
        return "?"
    fr = frames[-1]
    s = f"{os.path.basename(fr['filename'])}:{fr['line']} in {fr['name']}"
    if code:
        line = linecache.getline(fr["filename"], fr["line"]).strip()
        if line:
            s += f": {line[:90]}"
    return s


def format_stack(stack, indent="    "):
    return "\n".join(
        f"{indent}{os.path.basename(fr['filename'])}:{fr['line']} in {fr['name']}: "
        f"{linecache.getline(fr['filename'], fr['line']).strip()}"
        for fr in user_frames(stack)
    )
