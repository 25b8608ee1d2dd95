"""The run's index page and the published site, built from the shared ci suite run, then opened in
a real headless browser (Debian's chromium through Playwright): pages load without console errors,
images load, internal links resolve, no traceback shows. A broken site must fail the same check."""

import json
import re

import pytest
from markupsafe import escape

from nblib.publish import browse, site, suite

needs_chromium = pytest.mark.skipif(
    not browse.CHROMIUM.exists(), reason=f"{browse.CHROMIUM} is absent (apt-get install -y chromium)"
)


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


@needs_chromium
def test_the_site_in_a_headless_browser(ci_suite, built):
    shot = ci_suite / "landing.png"
    check = browse.check(built.root, screenshot=shot)
    assert check.problems() == []
    assert sorted(check.pages) == sorted(built.pages)  # every page is reachable from the landing page
    assert check.images >= 3 and check.links > len(built.pages)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


@needs_chromium
def test_the_browser_check_catches_a_broken_site(tmp_path):
    (tmp_path / "index.html").write_text(
        '<!doctype html><link rel="icon" href="data:,"><a href="two.html">two</a>'
        '<a href="gone.html">gone</a><a href="two.html#nowhere">anchor</a><img src="missing.png">'
    )
    (tmp_path / "two.html").write_text(
        '<!doctype html><link rel="icon" href="data:,"><pre>Traceback (most recent call last):\n  boom</pre>'
        "<script>undefined_function()</script>"
    )
    check = browse.check(tmp_path)
    assert check.pages == ["index.html", "two.html"]
    assert [h.rsplit("/", 1)[-1] for _, h in check.broken_links] == ["gone.html", "two.html#nowhere"]
    assert [s.rsplit("/", 1)[-1] for _, s in check.broken_images] == ["missing.png"]
    assert check.tracebacks == ["two.html"]
    pages_with_errors = {p for p, _ in check.console_errors}
    assert pages_with_errors == {"index.html", "two.html"}  # the missing image, the script error
    assert not check.ok
