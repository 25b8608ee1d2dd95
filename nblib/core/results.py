"""results.json beside each executed notebook: what ran, where, on which code, and what it found.

The file is rewritten atomically at every update; "status" is "running" until the notebook's last
cell sets it to "ok", so a run that died (or timed out inside papermill) never says ok.
"""

import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from nblib.core import phases
from nblib.core.files import write_json
from nblib.core.paths import ROOT

try:  # optional: the simulator and the torch references run without Triton
    import triton
except ImportError:
    triton = None

__all__ = ["DeviceInfo", "Results", "commit", "environment", "write_json"]


class DeviceInfo(Protocol):
    """What results.json asks of the device facade (nblib.backends.device, a layer above core)."""

    name: str

    def device_name(self) -> str: ...


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit() -> str:
    """This project's HEAD, with "+dirty" when the working tree differs from it; "unknown" when it
    cannot be told. NBLIB_COMMIT, when set, wins: a copy of the tree on another machine (the device)
    may carry a stale .git or none. A git repository that merely encloses the project (a copy
    unpacked inside another checkout) is not this project's history, so it is not asked."""
    named = os.environ.get("NBLIB_COMMIT", "unknown")
    if named != "unknown":
        return named
    try:
        if Path(_git("rev-parse", "--show-toplevel")).resolve() != ROOT:
            return "unknown"
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def environment(dev: DeviceInfo) -> dict[str, str | None]:
    return dict(
        backend=dev.name,
        device=dev.device_name(),
        torch=torch.__version__,
        triton=triton.__version__ if triton else None,
        commit=commit(),
        python=platform.python_version(),
    )


class Results:
    """One notebook's results.json: opened by nblib.setup in the setup cell, finish() in the last.
    params: the parameters applied after defaults; fixed: what the notebook runs whatever the
    profile says (e.g. bf16 only), so the file records what ran, not what was listed. check: called
    with the whole file before finish() writes status ok, raising when it is not what the notebook
    should write (nblib.setup passes the results schema in: core cannot import it), so a notebook
    that writes an unknown key or leaves one out fails its own run, its file left "running"."""

    def __init__(
        self,
        notebook: str,
        output_dir: str | os.PathLike[str],
        dev: DeviceInfo,
        params: dict[str, Any],
        fixed: dict[str, Any] | None = None,
        check: Callable[[dict[str, Any]], object] | None = None,
    ):
        self.path = Path(output_dir) / f"{notebook}.results.json"
        self.check = check
        self.data: dict[str, Any] = dict(
            notebook=notebook, status="running", **environment(dev), params=params
        )
        if fixed:
            self.data["fixed"] = fixed
        write_json(self.path, self.data)

    def __setitem__(self, key, value):
        self.data[key] = value
        write_json(self.path, self.data)

    def __getitem__(self, key):
        return self.data[key]

    def finish(self) -> Path:
        """Record the phase times of the process-wide clock (nblib.setup started it), then status ok."""
        clock = phases.clock()
        wall = clock.wall()
        self.data["wall_seconds"] = round(wall, 3)
        self.data["phases"] = [p.model_dump() for p in clock.times(wall)]
        done = dict(self.data, status="ok")  # last, on purpose
        if self.check:
            self.check(done)
        self.data = done
        write_json(self.path, self.data)
        return self.path
