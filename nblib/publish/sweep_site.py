"""`python -m nblib publish SWEEP_DIR`: a sweep (a folder holding sweep.json) as a static site,
SWEEP_DIR/site/ by default.

    site = nblib.publish.sweep_site.build("outputs/sweeps/two-gpu-gpu")   # Site(root, pages)

index.html, in the run site's look: the grid (knobs, values, notebooks, profile), what the grid
cannot show (a point that leaves out a notebook's clean checks measures a rate, not a verdict),
the sweep's figure, one row per point, notebook and arm (corrupted sessions with the Wilson 95%
interval the table holds), and where the points ran (devices, commits, torch and Triton). Each
point's run folder becomes its own run site under points/<id>/ (nblib.publish.site), its nav
leading back here. Every link is relative. Numbers come from sweep.json, the sweep's table
(sweep.csv or sweep.parquet) and the points' results.json, never recomputed.
"""

import json
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from nblib.core.files import write_text
from nblib.publish import pages, show, site
from nblib.schema import results as R

__all__ = [
    "FIGURE",
    "POINTS",
    "RECORD",
    "Limit",
    "SweepRow",
    "build",
    "environment",
    "is_sweep",
    "limits",
    "load_table",
    "rows",
]

RECORD = "sweep.json"
FIGURE = "sweep.png"
POINTS = "points"


class SweepRow(NamedTuple):
    """One line of the points' table: a point, one notebook, one arm of its headline rate."""

    point: str
    page: str | None  # the point's site, relative to the sweep's; None when the point has no run
    values: list[str]  # the point's grid values, in the grid's key order, as shown
    notebook: str
    status: str
    worker: str
    device: str
    commit: str  # short
    arm: str
    corrupted: str  # "k/n [lo%, hi%]", or "-" where the notebook measured no rate
    verdict: str


class Limit(NamedTuple):
    """What the grid leaves out of one notebook's verdict."""

    notebook: str
    every: list[str]  # what no point tests
    some: list[str]  # what some points do not test


def is_sweep(folder: str | Path) -> bool:
    return (Path(folder) / RECORD).exists()


def _shown(v):
    """A grid value as one cell: lists joined, dicts as JSON, scalars as they are."""
    if isinstance(v, list):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return "-" if v is None else str(v)


def load_table(sweep: Path) -> pd.DataFrame:
    """The sweep's table (CSV or Parquet), missing cells as None."""
    csv, parquet = sweep / "sweep.csv", sweep / "sweep.parquet"
    if csv.exists():
        df = pd.read_csv(csv)
    elif parquet.exists():
        df = pd.read_parquet(parquet)
    else:
        raise FileNotFoundError(f"{sweep} holds {RECORD} but no sweep.csv or sweep.parquet")
    return df.astype(object).where(df.notna(), None)


def _corrupted(r):
    """k/n with the table's Wilson interval, as percent."""
    if r.get("sessions") in (None, 0):
        return "-"
    k, n = int(r["corrupted_sessions"]), int(r["sessions"])
    return f"{k}/{n} [{100 * r['lo']:.1f}%, {100 * r['hi']:.1f}%]"


def rows(record: Mapping[str, Any], table: pd.DataFrame, linked: Collection[str]) -> list[SweepRow]:
    """The points' table, in sweep.json's point order; `linked`: the points that have a site."""
    keys = list(record["grid"])
    points = {p["point"]: p for p in record["points"]}
    out = []
    for r in table.to_dict("records"):
        p = points.get(r["point"], {})
        out.append(
            SweepRow(
                point=r["point"],
                page=f"{POINTS}/{r['point']}/index.html" if r["point"] in linked else None,
                values=[_shown(p.get("values", {}).get(k)) for k in keys],
                notebook=r["notebook"],
                status=r["status"],
                worker=_shown(p.get("worker") or r.get("worker")),
                device=_shown(r.get("device")),
                commit=str(r.get("commit") or "-")[:7],
                arm=_shown(r.get("arm")),
                corrupted=_corrupted(r),
                verdict=r.get("verdict") or r.get("error") or "",
            )
        )
    order = list(points)
    return sorted(out, key=lambda x: order.index(x.point) if x.point in order else len(order))


def limits(table: pd.DataFrame) -> list[Limit]:
    """Per notebook, what every point and what some points leave out (the cannot_show column)."""
    out = []
    for notebook, sel in table.groupby("notebook", sort=False):
        per_point = [
            set(filter(None, str(c or "").split("; "))) for c in sel.drop_duplicates("point")["cannot_show"]
        ]
        every = set.intersection(*per_point) if per_point else set()
        some = set.union(*per_point) - every if per_point else set()
        out.append(Limit(notebook, sorted(every), sorted(some)))
    return out


def environment(sweep: Path, record: Mapping[str, Any]) -> str:
    """Where the points ran: one row per distinct (device, backend, commit, torch, triton, python)."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for p in record["points"]:
        for n in record["notebooks"]:
            try:
                res = R.load(sweep / POINTS / p["point"] / f"{n}.results.json")
            except (OSError, json.JSONDecodeError):
                continue
            key = tuple(
                str(getattr(res, k, "-"))[:12] if k == "commit" else str(getattr(res, k, "-"))
                for k in ("device", "backend", "commit", "torch", "triton", "python")
            )
            seen.setdefault(key, []).append(p["point"])
    names = ("device", "backend", "commit", "torch", "triton", "python")
    table = [dict(zip(names, k), points=len(set(v))) for k, v in seen.items()]
    return show.html_table(table) if table else "<p>No point left a results.json.</p>"


def _point_sites(sweep, dest):
    """Each point with a run (index.json) as a run site under dest/points/<id>/; returns their ids."""
    linked = []
    for folder in sorted((sweep / POINTS).glob("*/index.json")):
        point = folder.parent
        site.build(point, dest / POINTS / point.name, up=("../../index.html", "sweep"))
        linked.append(point.name)
    return linked


def _build(sweep, record, dest):
    table = load_table(sweep)
    linked = _point_sites(sweep, dest)
    has_figure = (sweep / FIGURE).exists()
    if has_figure:
        shutil.copy2(sweep / FIGURE, dest / FIGURE)
    status = [p.get("status") for p in record["points"]]
    write_text(
        dest / "index.html",
        pages.render(
            "sweep_index.html.j2",
            title=f"sweep: {sweep.resolve().name}",
            run=sweep.resolve().name,
            profile=record.get("params", "-"),
            grid=[(k, [_shown(v) for v in vs]) for k, vs in record["grid"].items()],
            notebooks=record["notebooks"],
            points=len(record["points"]),
            ok=sum(s in ("ok", "skipped") for s in status),
            limits=limits(table),
            figure=FIGURE if has_figure else None,
            keys=list(record["grid"]),
            rows=rows(record, table, set(linked)),
            environment=environment(sweep, record),
        ),
    )
    return ["index.html", *(f"{POINTS}/{p}/index.html" for p in linked)]


def build(sweep_dir: str | Path, out: str | Path | None = None) -> site.Site:
    """Build the sweep's site; returns Site(root, pages): its index, then each point's landing page.
    The old site is replaced only once the new one is whole."""
    sweep = Path(sweep_dir)
    if not is_sweep(sweep):
        raise FileNotFoundError(f"{sweep} holds no {RECORD}: run python -m nblib sweep into it first")
    record = json.loads((sweep / RECORD).read_text())
    out = Path(out) if out else sweep / site.SITE
    return site.Site(out, site.replace(out, lambda dest: _build(sweep, record, dest)))
