"""A sweep's published site: a sweep folder made from the shared ci suite run (each point a copy of
notebook 00's run, sweep.json, the table and the figure written by the sweep's own functions), then
built and opened in headless Chromium. A point's missing site must fail the same check."""

import json
import re
import shutil
import time

import pytest
from test_site import chromium, links  # noqa: F401  (chromium: the fixture, skip or fail without it)

from nblib.core.paths import ROOT
from nblib.core.results import write_json
from nblib.publish import browse, sweep_site
from nblib.run import cli, sweep
from nblib.schema import params as P

NOTEBOOK = "00_reproduce"


def _point(ci_suite, dest, point):
    """A point folder as `nblib run --only 00` leaves it: notebook 00's files and an index of it alone."""
    dest.mkdir(parents=True)
    for f in ci_suite.glob("00_*"):
        shutil.copy2(f, dest / f.name)
    record = json.loads((ci_suite / "index.json").read_text())
    record["notebooks"] = [r for r in record["notebooks"] if r["notebook"] == NOTEBOOK]
    write_json(dest / "index.json", record)
    write_json(dest / "point.json", dict(id=point.id, values=point.values))


@pytest.fixture(scope="module")
def sweep_dir(ci_suite, tmp_path_factory):
    """Two seeds, graph mode only: the grid leaves out notebook 00's eager clean check."""
    out = tmp_path_factory.mktemp("sweep")
    params = ROOT / "params" / "ci.yaml"
    grid = sweep.Grid((NOTEBOOK,), ("seed", "modes"), ([0, 1], [["graph"]]), "seed", "ci-seeds")
    points = sweep.points(P.load(params), grid)
    outcomes = []
    for p in points:
        _point(ci_suite, out / "points" / p.id, p)
        outcomes.append(sweep.Outcome(p, "ok", 1, None, 1.0, "cpu", time.time()))
    sweep.record(out, params, grid, outcomes)
    return out, points


@pytest.fixture(scope="module")
def built(sweep_dir):
    return sweep_site.build(sweep_dir[0])


def test_the_sweep_site_links_every_point_to_its_own_site(sweep_dir, built):
    out, points = sweep_dir
    assert built.root == out / "site"
    page = (built.root / "index.html").read_text()
    for p in points:
        href = f"points/{p.id}/index.html"
        assert f'href="{href}"' in page, p.id
        assert (built.root / href).exists() and (built.root / f"points/{p.id}/{NOTEBOOK}.html").exists()
        back = (built.root / f"points/{p.id}/index.html").read_text()
        assert 'href="../../index.html"' in back  # the point's nav leads back to the sweep
    for href in links(page):
        assert not re.match(r"^(/|[a-z]+:)", href), href
        assert (built.root / href).exists(), href
    assert built.pages == ["index.html", *(f"points/{p}/index.html" for p in sorted(x.id for x in points))]


def test_the_sweep_site_shows_the_figure_the_limits_and_the_environment(sweep_dir, built, ci_suite):
    out, _ = sweep_dir
    assert (built.root / "sweep.png").read_bytes() == (out / "sweep.png").read_bytes()
    page = (built.root / "index.html").read_text()
    assert '<img src="sweep.png"' in page
    assert "the rate, not the verdict" in page and "No point tests the eager clean check" in page
    table = sweep_site.load_table(out)
    for r in table.to_dict("records"):  # the table's numbers, as the page shows them
        assert f"{r['corrupted_sessions']}/{r['sessions']} [{100 * r['lo']:.1f}%" in page
    res = sweep_site.R.load(ci_suite / f"{NOTEBOOK}.results.json")
    assert res.torch in page and res.commit[:7] in page and "params/ci.yaml" in page


@pytest.mark.usefixtures("chromium")
def test_publish_builds_the_sweep_site_and_the_browser_check_passes(sweep_dir, capsys):
    out, points = sweep_dir
    cli.main(["publish", str(out), "--check"])
    said = capsys.readouterr().out
    assert f"({1 + len(points)} pages)" in said and "checked" in said
    check = browse.check(out / "site")
    assert check.ok, check.problems()
    assert {"index.html", *(f"points/{p.id}/index.html" for p in points)} <= set(check.pages)
    shutil.rmtree(out / "site" / "points" / points[0].id)  # a point's site gone: its link is broken
    broken = browse.check(out / "site")
    assert not broken.ok and any(points[0].id in h for _, h in broken.broken_links)
