"""docs/results.md's sections on the committed sweeps and suite speed tables, read from their files:
`outputs/sweeps/<name>/` (sweep.json and the sweep's table, read as the sweep's site reads them:
nblib.publish.sweep_site) and `outputs/bench-suite/<machine>-<profile>-<commit>/speed.json`
(nblib.schema.speed, written by nblib.run.benchtable)."""

import json
from pathlib import Path

from nblib.core import tables
from nblib.publish import sweep_site
from nblib.publish.results_figures import Block, short
from nblib.schema.speed import SpeedTable

__all__ = ["BENCH_SUITE", "SWEEPS", "SWEEP_COLUMNS", "suite_speeds", "sweep_block", "sweeps"]

SWEEPS = "outputs/sweeps"
BENCH_SUITE = "outputs/bench-suite"
SWEEP_COLUMNS = ("point", "values", "arm", "corrupted sessions (95% interval)", "worker")


def sweep_block(root: Path, folder: Path) -> Block:
    """One sweep: where and on what it ran, what its grid cannot test, and a row per point and arm."""
    record = json.loads((folder / sweep_site.RECORD).read_text())
    table = sweep_site.load_table(folder)
    keys = list(record["grid"])
    shown = sweep_site.rows(record, table, linked=set())
    body = tables.markdown(
        SWEEP_COLUMNS,
        [
            (
                r.point,
                ", ".join(f"{k} {v}" for k, v in zip(keys, r.values)),
                r.arm,
                r.corrupted if r.status == "ok" else r.status,
                r.worker,
            )
            for r in shown
        ],
    )
    cannot = sorted({c for lim in sweep_site.limits(table) for c in lim.every})
    where = ", ".join(sorted({r.device for r in shown}))
    commits = ", ".join(sorted({short(r.commit) for r in shown}))
    title = f"`{folder.relative_to(root).as_posix()}/`: {where}, commit {commits}, notebook " + ", ".join(
        record["notebooks"]
    )
    if cannot:
        title += f"; the grid cannot test: {'; '.join(cannot)} (the rate, not the verdict)"
    return Block(title=title, body=body)


def sweeps(root: str | Path) -> list[Block]:
    root = Path(root)
    return [sweep_block(root, p.parent) for p in sorted((root / SWEEPS).glob(f"*/{sweep_site.RECORD}"))]


def _speed_row(name, t: SpeedTable):
    ratio = "-"
    if t.total_ratio:
        over = "" if t.compared is None else f" (over {len(t.compared)} notebooks both list)"
        ratio = f"{t.total_ratio:.2f}x of `{t.previous}`{over}"
    wall = "-" if t.wall_seconds is None else f"{t.wall_seconds:.1f} on {t.lanes} lane(s)"
    notebooks = ", ".join(n.notebook[:2] for n in t.notebooks)
    total = f"{t.total_seconds:.1f}"
    return (f"`{name}/`", t.machine, t.profile, short(t.commit), notebooks, total, wall, ratio)


def suite_speeds(root: str | Path) -> str:
    """A row per committed speed table: where, machine, profile, commit, which notebooks, their sum,
    the suite's wall and lanes, and the ratio to the table it was compared with."""
    rows = [
        _speed_row(p.parent.name, SpeedTable.model_validate_json(p.read_text()))
        for p in sorted((Path(root) / BENCH_SUITE).glob("*/speed.json"))
    ]
    head = ("table", "machine", "profile", "commit", "notebooks", "sum (s)", "wall (s)", "vs previous")
    return tables.markdown(head, rows)
