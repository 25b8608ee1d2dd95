"""A sweep's results in one table (pandas: CSV or Parquet) and one figure: each notebook's headline
corruption rate, with its Wilson 95% interval, against the swept knob.

The headline of a notebook is the rate its question turns on, read from its results.json:
  00  corrupted sessions, graph mode, overlap on, buckets > 1, per index dtype
  01  the same under the canary, per overlap setting
  02  the pooled rate with the differential off and on
  03  graph mode, overlap on, buckets > 1, per (logits policy, index dtype)
  04  the pooled rate of each variant (buggy overlap and the fixes)
"""

import io
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from nblib.core import stats
from nblib.core.files import write_bytes


def _pool(rows, key, where):
    """{arm: (corrupted, sessions)} over the rows that pass `where`, one arm per key(row)."""
    out = {}
    for r in rows:
        if where(r):
            k, n = out.get(key(r), (0, 0))
            out[key(r)] = (k + r["corrupted_sessions"], n + r["sessions"])
    return out


def headline(notebook, res):
    """{arm: (corrupted sessions, sessions)} for one notebook's results (empty when it has none)."""
    racy = lambda r: r["bucket"] > 1 and r.get("overlap", "on") == "on" and r.get("mode", "graph") == "graph"
    if notebook.startswith("00"):
        return _pool(res.get("matrix", []), lambda r: f"{r['index_dtype']} graph overlap on", racy)
    if notebook.startswith("01"):
        return _pool(res.get("canary", []), lambda r: f"overlap {r['overlap']}", lambda r: r["bucket"] > 1)
    if notebook.startswith("02"):
        pooled = res.get("pooled", [])
        return {f"differential {p['arm']}": (p["corrupted_sessions"], p["sessions"]) for p in pooled}
    if notebook.startswith("03"):
        return _pool(res.get("toggles", []), lambda r: f"{r['logits_policy']} {r['index_dtype']}", racy)
    if notebook.startswith("04"):
        return {p["variant"]: (p["corrupted_sessions"], p["sessions"]) for p in res.get("pooled", [])}
    return {}


def _shown(v):
    """A grid value as one table cell: lists joined, dicts as JSON, scalars as they are."""
    if isinstance(v, list):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def collect(out, grid, points, outcomes):
    """One row per (point, notebook, arm); a notebook without results still gets a row (its status)."""
    rows = []
    for p in points:
        o = outcomes[p.id]
        base = dict(
            point=p.id, **{k: _shown(v) for k, v in p.values.items()}, attempts=o.attempts, worker=o.worker
        )
        for n in grid.notebooks:
            try:
                res = json.loads((Path(out) / "points" / p.id / f"{n}.results.json").read_text())
            except (OSError, ValueError):
                res = {}
            ok = res.get("status") == "ok"
            meta = dict(
                notebook=n,
                status="ok" if ok else "failed",
                error=None if ok else o.error,
                seconds=res.get("seconds"),
                device=res.get("device"),
                commit=res.get("commit"),
                verdict=res.get("verdict"),
            )
            arms = headline(n, res) if ok else {}
            for arm, (k, total) in arms.items():
                r = stats.rate(k, total)
                rows.append(
                    {**base, **meta, "arm": arm, "corrupted_sessions": k, "sessions": total}
                    | {x: r[x] for x in ("rate", "lo", "hi")}
                )
            if not arms:
                rows.append({**base, **meta, "arm": None})
    return pd.DataFrame(rows)


def figure(df, grid):
    """Rate against grid.x, one panel per notebook, one series per (arm, other swept values)."""
    have = df[df["sessions"].fillna(0) > 0] if "sessions" in df else df.iloc[0:0]
    notebooks = [n for n in grid.notebooks if (have["notebook"] == n).any()] or list(grid.notebooks[:1])
    fig, axes = plt.subplots(1, len(notebooks), figsize=(6 * len(notebooks), 4.2), squeeze=False)
    xs = [str(_shown(v)) for v in grid.values[grid.keys.index(grid.x)]]
    others = [k for k, v in zip(grid.keys, grid.values) if k != grid.x and len(v) > 1]  # constants: no series
    failed = int((df.drop_duplicates(["point", "notebook"])["status"] != "ok").sum())
    for ax, n in zip(axes[0], notebooks):
        sel = have[have["notebook"] == n]
        series = list(sel.groupby(["arm", *others], sort=False, dropna=False))
        for i, (key, s) in enumerate(series):
            dodge = (i - (len(series) - 1) / 2) * 0.08  # series side by side at each x
            x = [xs.index(str(v)) + dodge for v in s[grid.x]]
            err = [s["rate"] - s["lo"], s["hi"] - s["rate"]]
            label = key if isinstance(key, tuple) else (key,)
            name = ", ".join([str(label[0]), *(f"{k}={v}" for k, v in zip(others, label[1:]))])
            ax.errorbar(x, s["rate"], yerr=err, fmt="o", capsize=3, label=name)
        ax.set_xticks(range(len(xs)), xs)
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(grid.x)
        ax.set_ylabel("corrupted sessions (rate, Wilson 95%)")
        ax.set_title(n if not sel.empty else f"{n}: no rate to plot")
        if series:
            ax.legend(fontsize=7)
    note = f" ({failed} point-notebook(s) failed, not shown)" if failed else ""
    fig.suptitle(f"sweep {grid.name}{note}")
    fig.tight_layout()
    return fig


def save(df, grid, out, fmt="csv"):
    """Write the table and the figure beside the points; returns their paths."""
    out = Path(out)
    table = out / f"sweep.{fmt}"
    buf = io.BytesIO()
    if fmt == "parquet":
        df.to_parquet(buf, index=False)
    else:
        buf.write(df.to_csv(index=False).encode())
    write_bytes(table, buf.getvalue())
    fig = figure(df, grid)
    png = io.BytesIO()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    write_bytes(out / "sweep.png", png.getvalue())
    return table, out / "sweep.png"
