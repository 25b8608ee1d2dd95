"""The run's index page and the published site, built from the shared ci suite run, then opened in
a real headless browser (Debian's chromium through Playwright): pages load without console errors,
images load, internal links resolve, no traceback shows. A broken site must fail the same check."""

import json
import re

import pytest
from browsers import MUST_BROWSE, chromium_or_skip
from conclusions import displayed, missing, page
from markupsafe import escape

from nblib.core.paths import ROOT
from nblib.publish import browse, site
from nblib.run import suite

needs_chromium = pytest.mark.usefixtures("chromium")


@pytest.fixture
def chromium():
    chromium_or_skip()


def links(page):
    """Every href and src of a page but inline data (the empty favicon)."""
    return [u for u in re.findall(r'(?:href|src)="([^"]*)"', page) if not u.startswith("data:")]


def test_the_run_index_has_the_story_relative_links_and_the_writeup(ci_suite):
    page = (ci_suite / "index.html").read_text()
    assert "caching allocator hands the" in page  # the introduction
    assert 'href="05_report.html"' in page and 'href="writeup.md"' in page
    assert "params/ci.yaml" in page and str(ci_suite) not in page  # no machine path
    for href in links(page):
        assert not re.match(r"^(/|[a-z]+:)", href), href
        assert (ci_suite / href).exists(), href


@pytest.fixture(scope="module")
def built(ci_suite):
    return site.build(ci_suite)


def test_the_site_has_every_page_with_relative_links(ci_suite, built):
    index = json.loads((ci_suite / "index.json").read_text())["notebooks"]
    assert built.root == ci_suite / "site"
    assert built.pages == ["index.html"] + [f"{n}.html" for n in suite.NOTEBOOKS] + [
        "writeup.html",
        "environment.html",
    ]
    landing = (built.root / "index.html").read_text()
    for r in index:
        assert str(escape(r["verdict"][:60])) in landing  # as the template escapes it
    assert 'href="writeup.html"' in landing and 'href="environment.html"' in landing
    env = (built.root / "environment.html").read_text()
    res = json.loads((ci_suite / "00_reproduce.results.json").read_text())
    assert res["commit"] in env and res["device"] in env and "num_pages" in env
    nb = (built.root / "00_reproduce.html").read_text()
    assert '<details class="code">' in nb and "<script" not in nb  # code folded, nothing fetched
    for name in built.pages:
        for href in links((built.root / name).read_text()):
            assert not re.match(r"^(/|file:|https?:)", href), (name, href)
    assert 'href="site/index.html"' in (ci_suite / "index.html").read_text()  # the run's index links it


@pytest.mark.parametrize("name", suite.NOTEBOOKS)
def test_every_conclusion_is_on_the_notebooks_published_page(ci_suite, built, name):
    res = json.loads((ci_suite / f"{name}.results.json").read_text())
    assert missing(res, page(built.root / f"{name}.html")) == []


NOT_ON_THE_H200_YET = pytest.mark.xfail(
    strict=True, raises=FileNotFoundError, reason="outputs/gpu holds no H200 run of notebook 07 yet"
)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=NOT_ON_THE_H200_YET) if n.startswith("07") else n for n in suite.NOTEBOOKS],
)
def test_the_committed_h200_run_shows_every_conclusion_in_its_notebook_and_on_its_page(name):
    run = ROOT / "outputs" / "gpu"
    res = json.loads((run / f"{name}.results.json").read_text())
    assert res["backend"] == "cuda"
    assert missing(res, displayed(run / f"{name}.ipynb")) == []
    assert missing(res, page(run / "site" / f"{name}.html")) == []


@pytest.mark.parametrize("name", suite.NOTEBOOKS)
def test_the_committed_h100_suite_shows_every_conclusion_in_its_notebook_on_one_commit(name):
    """outputs/gpu-h100-suite: the whole suite on CUDA, 07 included, each notebook ok on the run's
    one commit, and what its results.json concludes displayed in its executed notebook."""
    run = ROOT / "outputs" / "gpu-h100-suite"
    res = json.loads((run / f"{name}.results.json").read_text())
    assert (res["backend"], res["status"]) == ("cuda", "ok")
    assert "H100" in res["device"]
    commits = {json.loads(f.read_text())["commit"] for f in run.glob("*.results.json")}
    assert commits == {res["commit"]} and len(res["commit"]) == 40
    assert missing(res, displayed(run / f"{name}.ipynb")) == []


@needs_chromium
def test_the_site_in_a_headless_browser(ci_suite, built):
    shot = ci_suite / "landing.png"
    check = browse.check(built.root, screenshot=shot)
    assert check.problems() == []
    assert sorted(check.pages) == sorted(built.pages)  # every page is reachable from the landing page
    assert check.images >= 3 and check.links > len(built.pages)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


@needs_chromium
def test_no_page_of_the_run_folder_loads_anything_from_outside_it(ci_suite, built):
    """The run's index, every executed notebook's page and the site it links, in the browser: no
    request leaves the folder, no console error, on every page."""
    check = browse.check(ci_suite)
    assert check.external_requests == [] and check.console_errors == []
    assert check.problems() == []
    notebooks = {f"{n}.html" for n in suite.NOTEBOOKS}
    assert notebooks <= set(check.pages)  # the executed notebooks' own pages
    assert {f"site/{p}" for p in built.pages} <= set(check.pages)  # and the site, through its link


def test_the_site_pages_share_one_type_and_each_notebook_page_has_its_contents(built):
    """One font family for prose (the site's --font, also JupyterLab's on the notebook pages),
    code folded under a summary in the same family, a table of contents linking the page's sections."""
    nb = (built.root / "00_reproduce.html").read_text()
    assert "--jp-content-font-family: var(--font)" in nb and "--jp-ui-font-family: var(--font)" in nb
    assert "details.code > summary { font-family: var(--font)" in nb
    toc = re.search(r'<nav class="toc">(.*?)</nav>', nb, re.S)
    assert toc, "no table of contents"
    anchors = re.findall(r'href="#([^"]+)"', toc.group(1))
    ids = set(re.findall(r'<h[23] id="([^"]+)"', nb))
    assert anchors and set(anchors) == ids  # every section listed, every entry a section
    for name in ("index.html", "writeup.html", "environment.html"):
        page = (built.root / name).read_text()
        assert "body { font-family: var(--font)" in page, name


@needs_chromium
def test_the_browser_check_catches_a_broken_site(tmp_path):
    (tmp_path / "index.html").write_text(
        '<!doctype html><link rel="icon" href="data:,"><a href="two.html">two</a>'
        '<a href="gone.html">gone</a><a href="two.html#nowhere">anchor</a><img src="missing.png">'
    )
    (tmp_path / "two.html").write_text(
        '<!doctype html><link rel="icon" href="data:,"><pre>Traceback (most recent call last):\n  boom</pre>'
        "<script>undefined_function()</script>"
        '<script src="https://cdn.example.invalid/require.js"></script>'  # refused, never fetched
    )
    check = browse.check(tmp_path)
    assert check.pages == ["index.html", "two.html"]
    assert [h.rsplit("/", 1)[-1] for _, h in check.broken_links] == ["gone.html", "two.html#nowhere"]
    assert [s.rsplit("/", 1)[-1] for _, s in check.broken_images] == ["missing.png"]
    assert check.tracebacks == ["two.html"]
    assert check.external_requests == [("two.html", "https://cdn.example.invalid/require.js")]
    pages_with_errors = {p for p, _ in check.console_errors}
    assert pages_with_errors == {"index.html", "two.html"}  # the missing image, the script error
    assert not check.ok


@pytest.mark.parametrize("env", [{MUST_BROWSE: "1"}, {"CI": "true"}, {}])
def test_a_missing_browser_fails_where_it_is_required_and_skips_elsewhere(monkeypatch, tmp_path, env):
    monkeypatch.setattr(browse, "CHROMIUM", tmp_path / "chromium")
    for k in (MUST_BROWSE, "CI"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    outcome = pytest.fail.Exception if env else pytest.skip.Exception
    with pytest.raises(outcome, match="chromium is absent"):
        chromium_or_skip()
