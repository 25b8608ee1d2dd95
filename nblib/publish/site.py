"""`python -m nblib publish RUN_DIR`: one run as a static site, RUN_DIR/site/ by default.

    site = nblib.publish.site.build("outputs/gpu")      # Site(root, pages)

Pages: index.html (the story, every notebook's verdict, the investigation step by step, the
figures), one page per executed notebook (nbconvert with our template: JupyterLab's look in the
site's type, a table of contents, code folded under each cell), writeup.html (writeup.md),
environment.html (device, versions, commit, params). Figures are copied beside the pages and every
link is relative, so the folder can be served or attached as it is; no page loads anything from the
network. nbconvert and jinja2 do the work (Jupyter Book 2 would add a Node toolchain to render the
same six pages).
"""

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from nbconvert.filters import markdown2html

from nblib.core.files import write_text
from nblib.publish import pages, report, runindex, show
from nblib.schema import results as R

__all__ = ["HEADING", "SITE", "TOC_MARK", "Site", "build", "replace", "toc"]

SITE = "site"
_Made = TypeVar("_Made")


@dataclass
class Site:
    root: Path
    pages: list[str]  # file names, landing page first


def _index(run):
    path = run / "index.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{run} holds no index.json: run the suite into it first (python -m nblib run --out {run})"
        )
    return json.loads(path.read_text())


def _results(run, name):
    """The notebook's results.json through its model; None when it is absent or not JSON."""
    try:
        return R.load(run / f"{name}.results.json")
    except (OSError, json.JSONDecodeError):
        return None


def _written(res, key):
    """What the notebook wrote under key, "-" where it wrote nothing (no file, or died first)."""
    return getattr(res, key) if res is not None and key in res.model_fields_set else "-"


# a heading as nbconvert writes it: its id, then its text up to the anchor link it appends
HEADING = re.compile(r'<h([23]) id="([^"]+)">(.*?)<a class="anchor-link"', re.S)
TOC_MARK = "<!-- toc -->"


def toc(html: str) -> str:
    """The page's table of contents: one link per section (h2) and subsection (h3), in order.
    The headings' text is nbconvert's HTML already; only its tags are dropped."""
    items = [
        f'<li class="h{level}"><a href="#{anchor}">{re.sub(r"<[^>]+>", "", text).strip()}</a></li>'
        for level, anchor, text in HEADING.findall(html)
    ]
    if not items:
        return ""
    return f'<nav class="toc"><strong>On this page</strong><ol>{"".join(items)}</ol></nav>'


def _notebook_page(ipynb, dest, nav):
    """The page, its table of contents under its title (or under the nav when it has none)."""
    html = pages.notebook_html(ipynb, "nbpage", resources={"site_nav": nav})
    contents = toc(html)
    if "</h1>" in html:
        html = html.replace(TOC_MARK, "", 1).replace("</h1>", "</h1>" + contents, 1)
    else:
        html = html.replace(TOC_MARK, contents, 1)
    write_text(dest, html)


def _environment(run, records):
    rows, groups = [], {}
    for r in records:
        res = _results(run, r["notebook"])
        rows.append(
            dict(
                notebook=r["notebook"],
                status=r["status"],
                **{k: _written(res, k) for k in ("device", "backend", "torch", "triton", "python")},
                commit=str(_written(res, "commit"))[:12],
                seconds=_written(res, "seconds"),
            )
        )
        params = res.params if res else {}
        text = yaml.safe_dump(params, sort_keys=False, default_flow_style=None, width=100)
        groups.setdefault(text, []).append(r["notebook"])  # notebooks that shared their parameters
    commits = sorted({str(_written(_results(run, r["notebook"]), "commit")) for r in records})
    return show.html_table(rows), [(", ".join(names), text) for text, names in groups.items()], commits


def build(run_dir: str | Path, out: str | Path | None = None, up: tuple[str, str] | None = None) -> Site:
    """Build the site; returns Site(root, pages). The old site is replaced only once the new one is whole.
    up: (href, label), a first nav link out of the site (a sweep's page, for a point's site)."""
    run = Path(run_dir)
    index = _index(run)
    out = Path(out) if out else run / SITE
    names = replace(out, lambda dest: _build(run, index, index["notebooks"], dest, up))
    if out == run / SITE:
        runindex.write_index(run)  # the run's own index links to the site now
    return Site(out, names)


def replace(out: str | Path, make: Callable[[Path], _Made]) -> _Made:
    """make(folder) fills a fresh folder beside `out`, which then takes out's place: a failed build
    leaves the old site whole. Returns what make returns."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes 0700; the site is for everyone to read
    try:
        made = make(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return made


def _build(run, index, records, dest, up=None):
    executed = [r for r in records if (run / f"{r['notebook']}.ipynb").exists()]
    nav = [up] if up else []
    nav.append(("index.html", "overview"))
    if (run / "writeup.md").exists():
        nav.append(("writeup.html", "writeup"))
    nav += [(f"{r['notebook']}.html", r["notebook"][:2]) for r in executed]
    nav.append(("environment.html", "environment"))
    ctx = dict(run=run.resolve().name, nav=nav)
    names = ["index.html"]

    for r in executed:
        _notebook_page(run / f"{r['notebook']}.ipynb", dest / f"{r['notebook']}.html", nav)
        names.append(f"{r['notebook']}.html")
    figures = report.figures(run)
    for f, _ in figures:
        shutil.copy2(run / f, dest / f)
    if (run / "writeup.md").exists():
        write_text(
            dest / "writeup.html",
            pages.render(
                "site_page.html.j2",
                title=f"writeup: {ctx['run']}",
                content=markdown2html((run / "writeup.md").read_text()),
                **ctx,
            ),
        )
        names.append("writeup.html")
    table, params, commits = _environment(run, records)
    write_text(
        dest / "environment.html",
        pages.render(
            "environment.html.j2",
            title=f"environment: {ctx['run']}",
            environment=table,
            params=params,
            commits=commits,
            params_file=index.get("params", "-"),
            **ctx,
        ),
    )
    names.append("environment.html")

    results = report.load(run)
    first = next((r for r in results.values() if r), None)
    ok = sum(r["status"] == "ok" for r in records)
    summary = (
        f"{ok} of {len(records)} notebooks finished on {first.device if first else 'an unknown device'} "
        f"(backend {first.backend if first else '-'}, commit {first.commit[:12] if first else '-'})."
    )
    write_text(
        dest / "index.html",
        pages.render(
            "site_index.html.j2",
            title=f"capture-corruption investigation: {ctx['run']}",
            records=[dict(r, page=f"{r['notebook']}.html" if r in executed else None) for r in records],
            steps=report.investigation(results),
            figures=figures,
            summary=summary,
            has_writeup="writeup.html" in names,
            **ctx,
        ),
    )
    return names
