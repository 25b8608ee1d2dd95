"""A sweep's results in one table (pandas: CSV or Parquet) and one figure: each notebook's headline
corruption rate, with its Wilson 95% interval, against the swept knob.

The headline of a notebook is the rate its question turns on, read from its results.json:
  00  corrupted sessions, graph mode, overlap on, buckets > 1, per index dtype
  01  the same under the canary, per overlap setting
  02  the pooled rate with the differential off and on
  03  graph mode, overlap on, buckets > 1, per (logits policy, index dtype)
  04  the pooled rate of each variant (buggy overlap and the fixes)

A grid can leave out what a notebook's verdict checks (a grid of graph mode alone has no eager
clean check, so no fingerprint). Each row says what its point cannot test (`cannot_show`); where
notebook 00's fingerprint is not testable, `verdict` is the rate measured, not a fingerprint
verdict, and each panel of the figure says what its points leave out.
"""

import io
import json
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.transforms import offset_copy

from nblib.core import stats
from nblib.core.files import write_bytes
from nblib.publish.plots import DPI
from nblib.schema import params as P
from nblib.schema import results as R


def _pool(rows, key, where):
    """{arm: (corrupted, sessions)} over the rows that pass `where`, one arm per key(row)."""
    out = {}
    for r in rows:
        if where(r):
            k, n = out.get(key(r), (0, 0))
            out[key(r)] = (k + r.corrupted_sessions, n + r.sessions)
    return out


def headline(res):
    """{arm: (corrupted sessions, sessions)} for one notebook's finished results (a model of
    nblib.schema.results; empty when it has none)."""
    racy = lambda r: (
        r.bucket > 1 and getattr(r, "overlap", "on") == "on" and getattr(r, "mode", "graph") == "graph"
    )
    if isinstance(res, R.Reproduce00):
        return _pool(res.matrix, lambda r: f"{r.index_dtype} graph overlap on", racy)
    if isinstance(res, R.Canary01):
        return _pool(res.canary, lambda r: f"overlap {r.overlap}", lambda r: r.bucket > 1)
    if isinstance(res, R.GraphVsEager02):
        arms = [res.off, *res.designs]
        return {f"differential {a.design}": (a.corrupted_sessions, a.sessions) for a in arms}
    if isinstance(res, R.Overlap03):
        return _pool(res.toggles, lambda r: f"{r.logits_policy} {r.index_dtype}", racy)
    if isinstance(res, R.Fix04):
        return {p.variant: (p.corrupted_sessions, p.sessions) for p in res.pooled}
    return {}


def _shown(v):
    """A grid value as one table cell: lists joined, dicts as JSON, scalars as they are."""
    if isinstance(v, list):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


# What each notebook's verdict needs from a point's parameters: (key, value, what it shows). A
# point without one cannot test that part; notebook 00's verdict is the campaign's fingerprint, so
# a point that misses any of its parts reports the rate it measured, not a fingerprint verdict.
NEEDS = {
    "00": [
        ("index_dtypes", "bf16", "the corrupting configuration (bf16 index keys)"),
        ("modes", "graph", "the corrupting configuration (graph replays)"),
        ("overlaps", "on", "the corrupting configuration (overlap on)"),
        ("modes", "eager", "the eager clean check"),
        ("index_dtypes", "fp8", "the fp8 clean check"),
        ("overlaps", "off", "the overlap-off clean check"),
        ("buckets", 1, "the bucket-1 clean check"),
    ],
    "01": [("overlaps", "on", "the corrupting runs (overlap on)"), ("overlaps", "off", "the clean runs")],
    "03": [
        ("overlaps", "on", "the racing configuration (overlap on)"),
        ("overlaps", "off", "the overlap-off check"),
        ("index_dtypes", "fp8", "the fp8 check"),
    ],
}


def cannot_show(notebook, params):
    """What a point's parameters leave out of the notebook's verdict ([] when it can test all of it).
    params: the point's profile (defaults are filled in from the schema)."""
    applied = P.validate(params)
    out = [what for key, value, what in NEEDS.get(notebook[:2], []) if value not in applied[key]]
    if notebook[:2] in ("00", "01", "03") and not any(b > 1 for b in applied["buckets"]):
        out.append("a bucket > 1 (the race needs two requests in a batch)")
    if notebook[:2] == "04" and applied["index_dtypes"][0] != "bf16":
        out.append("the bug itself (notebook 04 runs the first index dtype; the race is bf16's)")
    return list(dict.fromkeys(out))


def _verdict(notebook, verdict, arms, missing):
    """The notebook's verdict where the point can test it; otherwise the rate it measured and what
    it could not test (a fingerprint without its clean checks is not a fingerprint)."""
    if not missing:
        return verdict
    if notebook.startswith("00"):
        rates = "; ".join(f"{arm} {stats.fmt_rate(k, n)}" for arm, (k, n) in arms.items()) or "no rate"
        return f"rate only: {rates}. Not tested by this point: {', '.join(missing)}."
    return f"{verdict} Not tested by this point: {', '.join(missing)}."


def collect(out, grid, points, outcomes):
    """One row per (point, notebook, arm); a notebook without results still gets a row (its status).
    `cannot_show`: what the point's parameters leave out of the notebook's verdict."""
    rows = []
    for p in points:
        o = outcomes[p.id]
        base = dict(
            point=p.id, **{k: _shown(v) for k, v in p.values.items()}, attempts=o.attempts, worker=o.worker
        )
        for n in grid.notebooks:
            try:
                res = R.load(Path(out) / "points" / p.id / f"{n}.results.json")
            except (OSError, json.JSONDecodeError):
                res = None
            ok = res is not None and res.status == "ok"
            arms = headline(res) if ok else {}
            missing = cannot_show(n, p.params)
            meta = dict(
                notebook=n,
                status="ok" if ok else "failed",
                error=None if ok else o.error,
                seconds=res.seconds if res else None,
                device=res.device if res else None,
                commit=res.commit if res else None,
                verdict=_verdict(n, res.verdict, arms, missing) if ok else None,
                cannot_show="; ".join(missing),
            )
            for arm, (k, total) in arms.items():
                r = stats.rate(k, total)
                rows.append(
                    {**base, **meta, "arm": arm, "corrupted_sessions": k, "sessions": total}
                    | {x: r[x] for x in ("rate", "lo", "hi")}
                )
            if not arms:
                rows.append({**base, **meta, "arm": None})
    return pd.DataFrame(rows)


MARKERS = "os^Dvp"  # with 20 colours, every series up to 60 gets its own (colour, marker)


def _style(i):
    """The i-th series' colour and marker: tab20's dark half first, then its light half."""
    tab20 = plt.get_cmap("tab20").colors
    order = tab20[0::2] + tab20[1::2]
    return order[i % len(order)], MARKERS[i % len(MARKERS)]


def _limits_note(sel):
    """What the points of one panel leave out of the notebook's verdict, wrapped for the title."""
    per_point = [set(filter(None, str(c).split("; "))) for c in sel.drop_duplicates("point")["cannot_show"]]
    if not per_point:
        return ""
    every = set.intersection(*per_point)
    some = set.union(*per_point) - every
    parts = [f"no point tests {', '.join(sorted(every))}"] if every else []
    parts += [f"some points lack {', '.join(sorted(some))}"] if some else []
    return textwrap.fill("the rate, not the verdict: " + "; ".join(parts), 95) if parts else ""


def _columns(series, others):
    """Legend columns: two when every series name fits half the panel's width."""
    longest = max(len(str(k)) + sum(len(o) + 4 for o in others) for k, _ in series) if series else 0
    return 2 if longest < 48 else 1


def _panel(ax, n, sel, xs, grid, others):
    series = list(sel.groupby(["arm", *others], sort=False, dropna=False))
    for i, (key, s) in enumerate(series):
        dodge = (i - (len(series) - 1) / 2) * min(0.08, 0.7 / len(series))  # side by side at each x
        x = [xs.index(str(v)) + dodge for v in s[grid.x]]
        err = [s["rate"] - s["lo"], s["hi"] - s["rate"]]
        label = key if isinstance(key, tuple) else (key,)
        name = ", ".join([str(label[0]), *(f"{k}={v}" for k, v in zip(others, label[1:]))])
        colour, marker = _style(i)
        ax.errorbar(x, s["rate"], yerr=err, fmt=marker, color=colour, capsize=3, label=name)
    ax.set_xticks(range(len(xs)), xs)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(grid.x)
    ax.set_ylabel("corrupted sessions\n(rate, Wilson 95%)")
    note = _limits_note(sel) if "cannot_show" in sel else ""
    ax.set_title(
        f"{n}" + (f"\n{note}" if note else "") if not sel.empty else f"{n}: no rate to plot", fontsize=9
    )
    if series:  # below the panel, never over the points; two columns when the names are short
        below = offset_copy(ax.transAxes, fig=ax.figure, y=-38, units="points")  # under the x label
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, ncol=_columns(series, others),
            fontsize=9, frameon=False,
        )  # fmt: skip


def figure(df, grid):
    """Rate against grid.x, one panel per notebook (stacked, so each reads at the page's width),
    one series per (arm, other swept values), each with its own colour and marker; every panel
    says what its points cannot test."""
    have = df[df["sessions"].fillna(0) > 0] if "sessions" in df else df.iloc[0:0]
    notebooks = [n for n in grid.notebooks if (have["notebook"] == n).any()] or list(grid.notebooks[:1])
    xs = [str(_shown(v)) for v in grid.values[grid.keys.index(grid.x)]]
    others = [k for k, v in zip(grid.keys, grid.values) if k != grid.x and len(v) > 1]  # constants: no series
    groups = [list(have[have["notebook"] == n].groupby(["arm", *others], dropna=False)) for n in notebooks]
    lines = [-(-len(g) // _columns(g, others)) for g in groups]
    heights = [3.6 + 0.3 * n for n in lines]  # the panel, then its legend's lines
    fig, axes = plt.subplots(
        len(notebooks), 1, figsize=(8.4, sum(heights) + 0.6), squeeze=False, layout="constrained",
        gridspec_kw=dict(height_ratios=heights),
    )  # fmt: skip
    for ax, n in zip(axes[:, 0], notebooks):
        _panel(ax, n, have[have["notebook"] == n], xs, grid, others)
    failed = int((df.drop_duplicates(["point", "notebook"])["status"] != "ok").sum())
    note = f" ({failed} point-notebook(s) failed, not shown)" if failed else ""
    fig.suptitle(f"sweep {grid.name}{note}", fontsize=11)
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
    fig.savefig(png, dpi=DPI)
    plt.close(fig)
    write_bytes(out / "sweep.png", png.getvalue())
    return table, out / "sweep.png"
