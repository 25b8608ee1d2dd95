"""The main job: execute the notebooks headlessly with papermill, render each to HTML with the
code hidden, and write an index page with every notebook's verdict.

A notebook counts as done only when its results.json says status "ok" (its last cell writes that):
papermill's own success is not enough, since a cell timeout leaves no error in the notebook.
A failed notebook stops the run, is marked failed with its failing cell, and earlier results stay.
"""

import html
import json
import time
from pathlib import Path

import nbformat
import papermill as pm
from nbconvert import HTMLExporter
from tqdm.auto import tqdm

from nblib.core.files import write_json, write_text
from nblib.core.paths import NOTEBOOK_DIR, NOTEBOOKS, ROOT
from nblib.publish import params as P


def available(only=None):
    """The notebooks to run, in order; an unknown --only prefix fails here, before anything exists."""
    nbs = [n for n in NOTEBOOKS if (NOTEBOOK_DIR / f"{n}.ipynb").exists()]
    if only:
        unknown = [o for o in only if not any(n.startswith(o) for n in NOTEBOOKS)]
        if unknown:
            raise ValueError(f"unknown notebook {unknown[0]!r}: choose among {', '.join(NOTEBOOKS)}")
        nbs = [n for n in nbs if any(n.startswith(o) for o in only)]
    return nbs


def output_dir(params_path=None, out=None):
    """Where a run writes: --out, else outputs/<profile name>."""
    params_path = Path(params_path or P.default_profile())
    return Path(out or ROOT / "outputs" / params_path.stem).resolve()


def run(params_path=None, out=None, only=None, timeout=1800):
    """Execute the suite; returns the list of per-notebook records written to index.json.
    Everything that can be checked is checked before the output folder is created: the notebook
    selection, the whole profile against the schema, and the backend."""
    notebooks = available(only)
    params_path = Path(params_path or P.default_profile())
    profile = P.load(params_path)  # one line naming the bad key, before anything runs
    P.resolve_backend(profile["backend"])  # a missing GPU fails here, in one line
    out = output_dir(params_path, out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"suite: {len(notebooks)} notebook(s), profile {params_path}, outputs in {out}")
    records = _load_index(out)
    bar = tqdm(notebooks, desc="suite", unit="nb")
    for name in bar:
        bar.set_postfix_str(name)
        dest = out / f"{name}.ipynb"
        rec = dict(notebook=name, status="failed", html=f"{name}.html", error=None)
        t0 = time.perf_counter()
        # each notebook gets the keys it declares, defaults applied, so results.json records them
        values = {k: v for k, v in profile.items() if k in P.DECLARES[name]}
        try:
            pm.execute_notebook(
                str(NOTEBOOK_DIR / f"{name}.ipynb"),
                str(dest),
                parameters={**values, "output_dir": str(out)},
                cwd=str(ROOT),
                progress_bar=False,
                execution_timeout=timeout,
                kernel_name="python3",
            )
        except Exception as e:  # papermill raises PapermillExecutionError with the cell
            rec["error"] = _describe(e)
        res = _results(out, name)
        if rec["error"] is None and res.get("status") != "ok":
            rec["error"] = f"results.json says status {res.get('status')!r}: the notebook did not finish"
        rec.update(
            status="ok" if rec["error"] is None else "failed",
            seconds=round(time.perf_counter() - t0, 1),
            verdict=res.get("verdict"),
            backend=res.get("backend"),
            device=res.get("device"),
            commit=res.get("commit"),
        )
        if dest.exists():
            _render_html(dest, out / rec["html"])
        records = [r for r in records if r["notebook"] != name] + [rec]
        _write_index(out, records, params_path)
        if rec["status"] != "ok":
            bar.close()
            raise SystemExit(
                f"{name} failed: {rec['error']}\n(executed copy: {dest}; earlier results kept in {out})"
            )
    return records


def _describe(e):
    cell = getattr(e, "exec_count", None)
    ename, evalue = getattr(e, "ename", type(e).__name__), getattr(e, "evalue", str(e))
    return f"cell {cell}: {ename}: {evalue}" if cell is not None else f"{ename}: {evalue}"


def _results(out, name):
    path = out / f"{name}.results.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _render_html(nb_path, html_path):
    body, _ = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    ).from_notebook_node(nbformat.read(nb_path, 4))
    write_text(html_path, body)


def _load_index(out):
    try:
        return json.loads((out / "index.json").read_text())["notebooks"]
    except (OSError, ValueError, KeyError):
        return []


def _write_index(out, records, params_path):
    records = sorted(records, key=lambda r: r["notebook"])
    write_json(out / "index.json", dict(params=str(params_path), notebooks=records))
    rows = "\n".join(
        f"<tr class='{r['status']}'><td><a href='{html.escape(r['html'])}'>{r['notebook']}</a></td>"
        f"<td>{r['status']}</td><td>{html.escape(str(r.get('verdict') or r.get('error') or ''))}</td>"
        f"<td>{html.escape(str(r.get('device')))}</td><td>{r.get('seconds', '')}</td></tr>"
        for r in records
    )
    page = f"""<!doctype html><meta charset="utf-8"><title>capture-corruption suite: {out.name}</title>
<style>body{{font-family:sans-serif;max-width:70em;margin:2em auto}}td,th{{padding:.3em .8em;text-align:left}}
tr.failed{{background:#fdd}}tr.ok td:nth-child(2){{color:#070}}</style>
<h1>Capture-corruption investigation: run {html.escape(out.name)}</h1>
<p>params: {html.escape(str(params_path))}</p>
<table><tr><th>notebook</th><th>status</th><th>verdict</th><th>device</th><th>seconds</th></tr>
{rows}</table>"""
    write_text(out / "index.html", page)
