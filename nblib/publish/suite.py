"""The main job: execute the notebooks headlessly with papermill, render each to HTML with the
code hidden, and write an index page with every notebook's verdict.

A notebook counts as done only when its results.json says status "ok" (its last cell writes that):
papermill's own success is not enough, since a cell timeout leaves no error in the notebook.
A failed notebook stops the run, is marked failed with its failing cell, and earlier results stay.
"""

import json
import time
from pathlib import Path

import nbformat
import papermill as pm
from nbconvert import HTMLExporter
from tqdm.auto import tqdm

from nblib.core.files import write_json, write_text
from nblib.core.paths import NOTEBOOK_DIR, NOTEBOOKS, ROOT
from nblib.publish import pages
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
        _write_index(out, records, shown_path(params_path))
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


def shown_path(path):
    """A profile as a reader should see it: relative to the repository when it lives there (a
    machine's absolute path means nothing on another), else its file name."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(P.ROOT))
    except ValueError:
        return path.name


def write_index(out):
    """Render the run's index page again from its index.json (after `publish` adds the site)."""
    out = Path(out)
    index = json.loads((out / "index.json").read_text())
    _write_index(out, index["notebooks"], index["params"])


def _write_index(out, records, params):
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
