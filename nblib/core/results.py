"""results.json beside each executed notebook: what ran, where, on which code, and what it found.

The file is rewritten atomically at every update; "status" is "running" until the notebook's last
cell sets it to "ok", so a run that died (or timed out inside papermill) never says ok.
"""

import json
import os
import platform
import subprocess
from pathlib import Path

import torch

from nblib.core.atomic import write_text
from nblib.core.paths import ROOT


def write_json(path, obj):
    """Write atomically: a crash mid-write leaves the old file, never half a file."""
    write_text(path, json.dumps(obj, indent=1, default=str) + "\n")


def commit():
    """HEAD's hash, with "+dirty" when the working tree differs from it. NBLIB_COMMIT, when set,
    wins: a copy of the tree on another machine (the device) may carry a stale .git."""
    if os.environ.get("NBLIB_COMMIT", "unknown") != "unknown":
        return os.environ["NBLIB_COMMIT"]
    root = ROOT
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("NBLIB_COMMIT", "unknown")


def environment(dev):
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(
        backend=dev.name,
        device=dev.device_name(),
        torch=torch.__version__,
        triton=triton_version,
        commit=commit(),
        python=platform.python_version(),
    )


class Results:
    """One notebook's results.json: start() it in the setup cell, finish() it in the last."""

    def __init__(self, notebook, output_dir, dev, params):
        self.path = Path(output_dir) / f"{notebook}.results.json"
        self.data = dict(notebook=notebook, status="running", **environment(dev), params=params)
        write_json(self.path, self.data)

    def __setitem__(self, key, value):
        self.data[key] = value
        write_json(self.path, self.data)

    def __getitem__(self, key):
        return self.data[key]

    def finish(self):
        self.data["status"] = "ok"  # last, on purpose
        write_json(self.path, self.data)
        return self.path
