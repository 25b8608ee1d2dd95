"""A run folder's index: index.json (every notebook's record, written under a lock so that lanes
never lose each other's) and index.html rendered from it, and each executed notebook's HTML page.
The suite writes them as notebooks finish; `publish` renders the index again once the site exists."""

import fcntl
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nblib.core import phases
from nblib.core.files import write_json, write_text
from nblib.core.paths import ROOT
from nblib.publish import pages

__all__ = ["load_index", "record", "render_html", "shown_path", "write_index", "write_index_records"]


def render_html(nb_path: str | Path, html_path: Path) -> phases.PhaseTime:
    """Render the executed notebook; returns the time it took, as the nbconvert phase."""
    clock = phases.PhaseClock()
    with clock.phase("nbconvert"):
        write_text(html_path, pages.notebook_html(nb_path, exclude_input=True))
    return clock.times()[0]


def record(out: Path, rec: dict[str, Any], params: str) -> list[dict[str, Any]]:
    """Put rec into index.json (replacing the notebook's earlier record) under a lock, reading the
    index afresh: lanes write to one folder, and none may lose another's record."""
    with open(out / ".index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = [r for r in load_index(out) if r["notebook"] != rec["notebook"]] + [rec]
        write_index_records(out, records, params)
    return records


def load_index(out: Path) -> list[dict[str, Any]]:
    try:
        return json.loads((out / "index.json").read_text())["notebooks"]
    except (OSError, ValueError, KeyError):
        return []


def shown_path(path: str | Path) -> str:
    """A profile as a reader should see it: relative to the repository when it lives there (a
    machine's absolute path means nothing on another), else its file name."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def write_index(out: str | Path) -> None:
    """Render the run's index page again from its index.json (after `publish` adds the site)."""
    out = Path(out)
    index = json.loads((out / "index.json").read_text())
    write_index_records(out, index["notebooks"], index["params"])


def write_index_records(out: Path, records: Sequence[dict[str, Any]], params: str) -> None:
    records = sorted(records, key=lambda r: r["notebook"])
    write_json(out / "index.json", dict(params=params, notebooks=records))
    exists = lambda name: name if (out / name).exists() else None
    page = pages.render(
        "run_index.html.j2",
        title=f"capture-corruption suite: {out.name}",
        run=out.name,
        params=params,
        records=[dict(r, link=exists(r["html"])) for r in records],
        writeup=exists("05_report.html"),
        writeup_md=exists("writeup.md"),
        site=exists("site/index.html"),
    )
    write_text(out / "index.html", page)
