"""Atomic file writes, the one helper: a crash mid-write leaves the old file (or none), never half
a file, and a reader (a browser, a resumed sweep, the next notebook) sees the old file or the new.

Every file the suite writes for others to read (results.json, index.json, index.html, the HTML of
each notebook, writeup.md, sweep tables, the site) goes through here: write a temporary file
beside the target, then os.replace it, which is atomic on one filesystem.
"""

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["write_bytes", "write_json", "write_text", "write_with"]


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically; returns the path."""
    return write_with(path, lambda f: f.write(data))


def write_with(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> Path:
    """Atomically, what write(f) writes into the binary file object f (torch.save(obj, f), say,
    with no copy of the bytes in memory first); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """JSON, indented, atomically (values json can't encode are written as str)."""
    return write_text(path, json.dumps(obj, indent=1, default=str) + "\n")
