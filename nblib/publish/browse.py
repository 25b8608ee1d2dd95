"""A run folder or its published site, checked in a real headless browser: Debian's Chromium driven
by Playwright (Playwright cannot download its own browser here), the folder served over HTTP.

    check = nblib.publish.browse.check("outputs/gpu/site", screenshot="outputs/gpu/landing.png")
    check = nblib.publish.browse.check("outputs/gpu")     # the run's index, its notebooks' pages, its site
    check.ok, check.problems()

It starts at index.html and follows every internal link. On each page: nothing is requested from
outside the folder (every such request is recorded and refused, so a page that would reach a CDN
fails here even on a machine with a network), no console error (a resource that fails to load logs
one), every image loaded with a natural width > 0, every internal link (and #anchor) resolves, and
no traceback text is visible.
"""

import functools
import http.server
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

__all__ = ["CHROMIUM", "FLAGS", "TRACEBACK", "Check", "check", "chromium_missing", "serve"]

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Check:
    pages: list[str] = field(default_factory=list)  # paths visited, landing page first
    console_errors: list[tuple[str, str]] = field(default_factory=list)  # (page, text)
    # (page, url): a load from outside the folder
    external_requests: list[tuple[str, str]] = field(default_factory=list)
    broken_images: list[tuple[str, str]] = field(default_factory=list)  # (page, src)
    broken_links: list[tuple[str, str]] = field(default_factory=list)  # (page, href)
    tracebacks: list[str] = field(default_factory=list)  # pages showing one
    images: int = 0
    links: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.external_requests
            or self.console_errors
            or self.broken_images
            or self.broken_links
            or self.tracebacks
        )

    def problems(self) -> list[str]:
        return [
            *(f"{p}: loads from outside the folder: {u}" for p, u in self.external_requests),
            *(f"{p}: console error: {t}" for p, t in self.console_errors),
            *(f"{p}: image did not load: {s}" for p, s in self.broken_images),
            *(f"{p}: link does not resolve: {h}" for p, h in self.broken_links),
            *(f"{p}: traceback text is visible" for p in self.tracebacks),
        ]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(root: str | Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An HTTP server for `root` on a free local port, in a daemon thread; returns (server, base url)."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def chromium_missing() -> str | None:
    """Why the browser check cannot run on this machine, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is absent: apt-get install -y chromium"
    try:
        import playwright  # noqa: F401  (optional: only the browser check needs it)
    except ImportError:
        return "playwright is not installed: pip install playwright"
    return None


def check(site_dir: str | Path, screenshot: str | Path | None = None) -> Check:
    """Visit every page reachable from site_dir/index.html (a site, or a run folder: its index, the
    executed notebooks' pages and the site it links); returns a Check. `screenshot`: a path for a
    PNG of the landing page's first screen."""
    from playwright.sync_api import sync_playwright  # optional dependency (see chromium_missing)

    site_dir = Path(site_dir)
    if not (site_dir / "index.html").exists():
        raise FileNotFoundError(f"no {site_dir}/index.html: build it with python -m nblib publish RUN_DIR")
    why = chromium_missing()
    if why:
        raise RuntimeError(why)
    server, base = serve(site_dir)
    out = Check()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
            try:
                _crawl(browser, base, out, screenshot)
            finally:
                browser.close()
    finally:
        server.shutdown()
    return out


def _guard(page, base, out, current):
    """Record and refuse every request that leaves the folder (inline data: URLs load nothing)."""

    def route(r):
        url = r.request.url
        if url.startswith(base) or url.startswith("data:"):
            r.continue_()
        else:
            out.external_requests.append((current["path"], url))
            r.abort()

    page.route("**/*", route)


def _crawl(browser, base, out, screenshot):
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    current = {"path": None}
    _guard(page, base, out, current)
    page.on("console", lambda m: m.type == "error" and out.console_errors.append((current["path"], m.text)))
    page.on("pageerror", lambda e: out.console_errors.append((current["path"], str(e))))
    todo, seen, anchors, ids = ["index.html"], {"index.html"}, [], {}
    status = {}  # url -> HTTP status: a link repeated on every page (the navigation) is fetched once
    while todo:
        path = todo.pop(0)
        current["path"] = path
        page.goto(base + path, wait_until="load")
        out.pages.append(path)
        if path == "index.html" and screenshot:
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot))  # the first screen: what a reader sees on opening
        for src, width in page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.naturalWidth])"):
            out.images += 1
            if not width:
                out.broken_images.append((path, src))
        ids[path] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        if TRACEBACK in page.inner_text("body"):  # innerText: what is shown (folded code is not)
            out.tracebacks.append(path)
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            url, frag = urldefrag(href)
            if not url.startswith(base):
                continue  # an external link: not ours to resolve offline
            out.links += 1
            target = unquote(urlsplit(url).path).lstrip("/") or "index.html"
            if url not in status:
                status[url] = page.request.get(url).status
            if status[url] != 200:
                out.broken_links.append((path, href))
                continue
            if frag:
                anchors.append((path, target, frag, href))
            if target.endswith(".html") and target not in seen:
                seen.add(target)
                todo.append(target)
    for path, target, frag, href in anchors:  # a browser tries the fragment as written, then decoded
        if not {frag, unquote(frag)} & ids.get(target, set()):
            out.broken_links.append((path, href))
