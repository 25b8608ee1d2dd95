"""The suite's speed table: each notebook's wall time and phase times on this machine, beside the
previous table of the same machine, so a regression shows as a ratio.

    python -m nblib run --bench          # make bench-suite: the suite, then the table
    -> outputs/bench-suite/<machine>-<profile>-<commit>/speed.md and speed.json (atomic writes)

The phases come from each notebook's results.json (nblib.core.phases: setup, capture, replays,
eager references, instruments, audit, timing, figures, other) and the suite's own nbconvert time;
every figure is measured by the run, none is carried over. "previous" is the newest other table
of the same machine label under outputs/bench-suite/: by the time the table records, else the time
git committed it (a fresh clone's files all carry the checkout's time), else the file's.
"""

import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from nblib.core import results, tables
from nblib.core.files import write_json, write_text
from nblib.core.paths import ROOT
from nblib.schema.speed import NotebookSpeed, SpeedTable

BENCH_DIR = ROOT / "outputs" / "bench-suite"
SHOWN = (
    "setup",
    "capture",
    "replays",
    "eager references",
    "instruments",
    "audit",
    "timing",
    "nbconvert",
    "other",
)


def machine_label(backend):
    """A label that names the hardware, not the host: the GPU's name on CUDA, else the CPU count."""
    if backend == "cuda":
        from nblib.backends import device  # lazily: it imports torch

        name = device.gpu_name()
    else:
        name = f"cpu{os.cpu_count()}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def speeds(records):
    """One NotebookSpeed per index.json record, in notebook order."""
    out = []
    for r in sorted(records, key=lambda r: r["notebook"]):
        ph = r.get("phases") or []
        out.append(
            NotebookSpeed(
                notebook=r["notebook"],
                status=r["status"],
                seconds=r.get("seconds") or 0.0,
                cpu_seconds=round(sum(p.get("cpu_seconds", 0.0) for p in ph), 2),
                phases={p["name"]: p["seconds"] for p in ph},
            )
        )
    return out


def previous_table(machine, here, root=BENCH_DIR, profile=None):
    """The newest speed.json of `machine` under root, other than the folder `here`, and of the same
    profile when one is given (a ci run beside a sim run is no regression, only a smaller job)."""
    found = [
        (SpeedTable.model_validate_json(p.read_text()), p)
        for p in Path(root).glob(f"{machine}-*/speed.json")
        if p.parent.resolve() != Path(here).resolve() and p.parent.name.startswith(f"{machine}-")
    ]
    found = [(t, p) for t, p in found if profile is None or t.profile == profile]
    if not found:
        return None
    table, newest = max(found, key=lambda tp: _written(*tp))
    return table, newest.parent


def _written(table, path):
    """(has its own record, when it was written): a table with the record outranks every table
    without one, which predates the record; among those, git's commit time of the file, else the
    file's mtime (which a copy into a tree without git, the GPU machine's, makes the copy's time)."""
    if table.written:
        return (True, datetime.fromisoformat(table.written).astimezone(UTC).timestamp())
    when = _committed(path)
    return (False, datetime.fromisoformat(when).astimezone(UTC).timestamp() if when else path.stat().st_mtime)


def _committed(path):
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cI", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def build(records, backend, profile, root=BENCH_DIR, wall_seconds=None, lanes=1):
    """The table of this run, with ratios to the previous table of the same machine. wall_seconds:
    the suite's elapsed time (with lanes, less than the notebooks' sum)."""
    machine, commit = machine_label(backend), results.commit()
    folder = Path(root) / f"{machine}-{Path(profile).stem}-{commit[:12].replace('+', '-')}"
    rows = speeds(records)
    table = SpeedTable(
        machine=machine,
        commit=commit,
        profile=profile,
        total_seconds=round(sum(r.seconds for r in rows), 1),
        notebooks=rows,
        wall_seconds=round(wall_seconds, 1) if wall_seconds is not None else None,
        lanes=lanes,
        written=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    prev = previous_table(machine, folder, root, profile)
    if prev is not None:
        old, where = prev
        before = {r.notebook: r.seconds for r in old.notebooks}
        for r in rows:
            r.ratio = round(r.seconds / before[r.notebook], 3) if before.get(r.notebook) else None
        table.previous = where.name
        _compare_totals(table, old, before)
    return table, folder


def _compare_totals(table, old, before):
    """The total's ratio over the notebooks both tables list, and the wall's only when they list the
    same ones (a wall over other notebooks is other work)."""
    common = [r for r in table.notebooks if before.get(r.notebook)]
    if len(common) != len(table.notebooks) or len(common) != len(before):
        table.compared = [r.notebook for r in common]
    then_total = sum(before[r.notebook] for r in common)
    if then_total:
        table.total_ratio = round(sum(r.seconds for r in common) / then_total, 3)
    then = old.wall_seconds or old.total_seconds  # a table before wall_seconds: its notebooks ran one by one
    if table.wall_seconds is not None and then and table.compared is None:
        table.wall_ratio = round(table.wall_seconds / then, 3)


def _total_note(table: SpeedTable):
    if not table.total_ratio:
        if table.previous is None:
            return " (no previous table)"
        return f" (no notebook in common with {table.previous})"
    if table.compared is None:
        return f" ({table.total_ratio:.2f}x of {table.previous})"
    return (
        f" ({table.total_ratio:.2f}x of {table.previous} over the {len(table.compared)} notebook(s)"
        f" both list: {', '.join(table.compared)})"
    )


def markdown(table: SpeedTable):
    """The table as markdown: a row per notebook, its wall time, ratio, CPU time and phases."""
    head = ["notebook", "status", "seconds", "vs previous", "cpu s", *SHOWN]
    lines = [
        f"# Suite speed: {table.machine}, commit {table.commit}, profile {table.profile}",
        "",
        f"The notebooks' times add up to {table.total_seconds:.1f} s" + _total_note(table),
        "",
    ]
    if table.wall_seconds is not None:
        lines[-1:-1] = [
            f"The suite's wall time {table.wall_seconds:.1f} s on {table.lanes} lane(s)"
            + (f" ({table.wall_ratio:.2f}x of {table.previous}'s)" if table.wall_ratio else ""),
        ]
        lines.append("")
    rows = []
    for r in table.notebooks:
        cells = [r.notebook, r.status, f"{r.seconds:.1f}", f"{r.ratio:.2f}x" if r.ratio else "-"]
        cells += [f"{r.cpu_seconds:.1f}"] + [f"{r.phases[p]:.1f}" if p in r.phases else "-" for p in SHOWN]
        rows.append(cells)
    return "\n".join([*lines, tables.markdown(head, rows)]) + "\n"


def text(records):
    """The per-notebook phase table the run prints (wall seconds per phase)."""
    rows = speeds(records)
    head = f"{'notebook':26s} {'seconds':>8s} " + " ".join(f"{p[:10]:>10s}" for p in SHOWN)
    body = [
        f"{r.notebook:26s} {r.seconds:8.1f} " + " ".join(f"{r.phases.get(p, 0.0):10.1f}" for p in SHOWN)
        for r in rows
    ]
    return "\n".join([head, *body])


def write(records, backend, profile, root=BENCH_DIR, wall_seconds=None, lanes=1):
    """Write speed.json and speed.md (atomically) into outputs/bench-suite/<machine>-<profile>-<commit>/."""
    table, folder = build(records, backend, profile, root, wall_seconds, lanes)
    write_json(folder / "speed.json", table.model_dump())
    write_text(folder / "speed.md", markdown(table))
    return table, folder
