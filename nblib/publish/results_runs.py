"""docs/results.md's sections on the committed sweeps and suite speed tables, read from their files:
`outputs/sweeps/<name>/sweep.csv` (nblib.run.sweep_table writes it: a row per point and arm) and
`outputs/bench-suite/<machine>-<profile>-<commit>/speed.json` (nblib.run.benchtable)."""

from pathlib import Path

import pandas as pd
from pydantic import BaseModel

from nblib.core import tables
from nblib.publish.results_figures import Block, short

SWEEPS = "outputs/sweeps"
BENCH_SUITE = "outputs/bench-suite"
SWEEP_COLUMNS = ("point", "values", "arm", "corrupted sessions", "95% interval", "worker")


def _values(row, knobs):
    return ", ".join(f"{k} {row[k]}" for k in knobs)


def sweep_block(root, csv):
    """One sweep: its grid's knobs, what it cannot show, and a row per point and arm."""
    df = pd.read_csv(csv, dtype={"point": str, "commit": str})
    knobs = [c for c in df.columns[1 : list(df.columns).index("attempts")]]
    folder = csv.parent.relative_to(root).as_posix()
    rows = [
        (
            r.point,
            _values(r._asdict(), knobs),
            r.arm,
            f"{int(r.corrupted_sessions)}/{int(r.sessions)}" if r.status == "ok" else r.status,
            f"[{100 * r.lo:.1f}%, {100 * r.hi:.1f}%]" if r.status == "ok" else "-",
            r.worker,
        )
        for r in df.itertuples(index=False)
    ]
    cannot = sorted({c for c in df["cannot_show"].dropna() if c})
    title = (
        f"`{folder}/`: {', '.join(sorted(set(df['device'].dropna())))}, commit "
        f"{', '.join(short(c) for c in sorted(set(df['commit'].dropna())))}, notebook "
        f"{', '.join(sorted(set(df['notebook'])))}"
        + (f"; the grid cannot test: {'; '.join(cannot)} (the rate, not the verdict)" if cannot else "")
    )
    return Block(title=title, body=tables.markdown(SWEEP_COLUMNS, rows))


def sweeps(root):
    return [sweep_block(Path(root), p) for p in sorted((Path(root) / SWEEPS).glob("*/sweep.csv"))]


class Speed(BaseModel):
    """The fields of a speed.json (nblib.run.benchtable.SpeedTable) this page shows."""

    machine: str
    commit: str
    profile: str
    total_seconds: float
    notebooks: list[dict]
    previous: str | None = None
    total_ratio: float | None = None
    wall_seconds: float | None = None
    lanes: int = 1
    compared: list[str] | None = None


def _speed_row(name, t: Speed):
    ratio = "-"
    if t.total_ratio:
        over = "" if t.compared is None else f" (over {len(t.compared)} notebooks both list)"
        ratio = f"{t.total_ratio:.2f}x of `{t.previous}`{over}"
    wall = "-" if t.wall_seconds is None else f"{t.wall_seconds:.1f} on {t.lanes} lane(s)"
    notebooks = ", ".join(n["notebook"][:2] for n in t.notebooks)
    total = f"{t.total_seconds:.1f}"
    return (f"`{name}/`", t.machine, t.profile, short(t.commit), notebooks, total, wall, ratio)


def suite_speeds(root):
    """A row per committed speed table: where, machine, profile, commit, which notebooks, their sum,
    the suite's wall and lanes, and the ratio to the table it was compared with."""
    rows = [
        _speed_row(p.parent.name, Speed.model_validate_json(p.read_text()))
        for p in sorted((Path(root) / BENCH_SUITE).glob("*/speed.json"))
    ]
    head = ("table", "machine", "profile", "commit", "notebooks", "sum (s)", "wall (s)", "vs previous")
    return tables.markdown(head, rows)
