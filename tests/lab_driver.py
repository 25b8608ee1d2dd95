"""JupyterLab as a user meets it, for tests/test_lab_browser.py: the server `make lab` starts (on a free
port, in its own process group, stopped by stop()), a notebook of the ci profile opened in Debian's
Chromium through Playwright, its panels switched on in the parameters cell, every cell run from the
Run menu, and the panel's controls set and read as a person would."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

from nblib.core.paths import NOTEBOOK_DIR, ROOT
from nblib.publish import browse
from nblib.schema import params as P

TOKEN = "nblib-lab-test"
DONE = r"\(\d+\.\d s\)$|^error at "  # a panel's status line once a run has ended (a JavaScript regex)
STATUS = ".widget-hprogress + .widget-html .widget-html-content"  # a panel's status line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a lab test's batch cells need not repeat of the ci suite: values no panel the test drives reads
# (the panels call the library with the model, buckets, workload, seed, protocol_runs, logits_policy
# and confirm_replays, kept as the ci profile has them); the panel is what the test checks, the
# batch cells' findings are the suite's tests'. 03 on bf16 alone (the dtype its test audits) finds
# every graph row it needs in 00's run of the same commit and parameters, as the suite's 03 does in
# its lane, and replays none of them itself.
LIGHTER = {
    "00_reproduce": dict(index_dtypes=["bf16"], seed_blocks=[]),
    "03_stream_overlap": dict(index_dtypes=["bf16"], confirm_replays=1),
    "04_persistent_buffer_fix": dict(fix_target=0.2, timing_replays=5),
}


def ci_copy(name: str, root: Path, out: Path) -> Path:
    """The notebook with the ci profile's values injected as papermill injects them (a cell tagged
    injected-parameters after the parameters cell), less the work LIGHTER leaves out, into root; its
    results go to out."""
    profile = {**P.load(ROOT / "params" / "ci.yaml"), **LIGHTER.get(name, {})}
    values = {k: v for k, v in profile.items() if k in P.DECLARES[name]}
    nb = load_notebook_node(str(NOTEBOOK_DIR / f"{name}.ipynb"))
    nb = parameterize_notebook(nb, {**values, "output_dir": str(out)})
    dest = root / f"{name}.ipynb"
    nbformat.write(nb, dest)
    return dest


class Lab:
    """`make lab` on root (a folder of notebooks), with a config and home of its own under state."""

    def __init__(self, root: Path, state: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = state / "config"
        settings = config / "lab" / "user-settings" / "@jupyterlab"
        # no news or update pop-up over the notebook (and no request for them); every cell in the
        # page, not only those in view (JupyterLab's default windowing leaves the others out of the DOM)
        for ext, name, value in (
            ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False}),
            ("notebook-extension", "tracker", {"windowingMode": "none"}),
        ):
            (settings / ext).mkdir(parents=True, exist_ok=True)
            (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
        args = (
            f"--no-browser --port={self.port} --IdentityProvider.token={TOKEN} "
            f"--ServerApp.runtime_dir={state / 'runtime'}"
        )
        # -o .venv/.stamp: the venv as it is (a test must not reinstall it); PY: this interpreter
        cmd = [
            "make",
            "-o",
            ".venv/.stamp",
            "lab",
            f"PY={sys.executable}",
            f"LAB_ARGS={args}",
            f"LAB_ROOT={root}",
        ]
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "HOME": str(state)}
        self.log = open(state / "lab.log", "w")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_up(state / "lab.log")

    def _wait_up(self, log, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("status")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"JupyterLab did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)

    def api(self, path, method="GET"):
        req = urllib.request.Request(f"{self.base}/api/{path}?token={TOKEN}", method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def url(self, name):
        # ?reset: a fresh workspace, so the notebook opened before is not opened again beside it
        return f"{self.base}/lab/tree/{name}.ipynb?reset&token={TOKEN}"

    def shut_kernels(self):
        for s in self.api("sessions"):
            self.api(f"sessions/{s['id']}", "DELETE")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # make and the server it started, nothing else
        self.proc.wait(timeout=60)
        self.log.close()


def browser(pw):
    return pw.chromium.launch(executable_path=str(browse.CHROMIUM), args=browse.FLAGS)


class Notebook:
    """One notebook open in JupyterLab, in a page of its own."""

    def __init__(self, page, lab, name):
        self.page, self.name = page, name
        page.goto(lab.url(name))
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)

    def switch_panels_on(self):
        """As a user would: type INTERACTIVE = True on a line of its own at the end of the parameters
        cell, once its editor has focus (keys pressed before land elsewhere, and a busy machine is
        slow to focus it); the cell's text is read back, the text before with that one line added."""
        cell = self.page.locator(".jp-Cell").filter(has_text="# Parameters").first
        editor = cell.locator(".cm-content")
        before = self._lines(editor)
        editor.click()
        cell.locator(".cm-editor.cm-focused").wait_for(timeout=30_000)
        self.page.keyboard.press("Control+End")
        self.page.keyboard.type("\nINTERACTIVE = True")
        after = self._lines(editor)
        assert after == [*before, "INTERACTIVE = True"], f"{self.name}: the parameters cell reads {after!r}"
        self.page.keyboard.press("Escape")

    def _lines(self, editor) -> list[str]:
        """The editor's document, line by line, from CodeMirror's own state (the DOM holds only the
        lines in view)."""
        return editor.evaluate("e => e.cmView.view.state.doc.toString()").split("\n")

    def run_all(self, timeout_s=420):
        """Run > Run All Cells, then wait until no cell is left running or queued, whatever ended the
        run (the last cell, a traceback, a SyntaxError or a kernel restart, the last two with no
        traceback). A run that ended without the status line fails, saying where (the last cell's
        outputs hold the error, if any)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self._start_all()
        try:
            self.page.wait_for_function(
                """() => {
                     const busy = [...document.querySelectorAll('.jp-InputArea-prompt')]
                       .some(e => /\\[\\*\\]/.test(e.innerText));
                     const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
                     return !busy && ind && ind.dataset.status === 'idle';
                   }""",
                timeout=timeout_s * 1000,
                polling=1000,
            )
        except PlaywrightTimeout:
            raise AssertionError(f"{self.name}: still running after {timeout_s} s; {self._where()}") from None
        outs = self.page.locator(".jp-OutputArea-output").all_inner_texts()
        if not any("status: ok" in t for t in outs):
            raise AssertionError(f"{self.name}: the run stopped before the status line; {self._where()}")

    def _where(self) -> str:
        """What the page shows of the run: the kernel's state, each code cell's prompt, the outputs
        of the last cell run and any dialog open."""
        status = self.page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status")
        prompts = [p.strip() for p in self.page.locator(".jp-InputArea-prompt").all_inner_texts()]
        ran = self.page.locator(".jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea-prompt", has_text=re.compile(r"\[\d+\]"))
        )
        last = ran.last.locator(".jp-OutputArea-output").all_inner_texts() if ran.count() else []
        dialogs = self.page.locator(".jp-Dialog").all_inner_texts()
        return f"kernel {status}, prompts {[p for p in prompts if p]}, last outputs {last}, dialogs {dialogs}"

    def _start_all(self, attempts=3, start_s=60):
        """Click Run > Run All Cells until a cell has started (its prompt shows * or a number): a click
        that lands while the menu is still opening runs nothing and leaves the kernel idle."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        for _ in range(attempts):
            dialog = self.page.locator(".jp-Dialog")
            if dialog.count():  # a modal JupyterLab raised (a kernel choice, an error): say which
                raise AssertionError(f"{self.name}: a dialog blocks Run All: {dialog.first.inner_text()!r}")
            self.page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            self.page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            try:
                self.page.wait_for_function(
                    """() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(e =>
                         /\\[(\\*|\\d+)\\]/.test(e.innerText))""",
                    timeout=start_s * 1000,
                )
                return
            except PlaywrightTimeout:
                self.page.keyboard.press("Escape")
        raise AssertionError(f"{self.name}: Run All Cells started no cell in {attempts} tries")

    def errors(self):
        """The error outputs the page shows (a traceback's first lines each), none when all ran."""
        texts = self.page.locator(".jp-OutputArea-output").all_inner_texts()
        return [t[:400] for t in texts if "Traceback (most recent call last)" in t]

    def saved(self, root: Path, timeout_s=60):
        """Save (Ctrl+S) and read the notebook back from disk once the file has changed (a busy
        machine can take seconds to write it) and reads whole."""
        path = root / f"{self.name}.ipynb"
        before = path.stat().st_mtime_ns
        self.page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.stat().st_mtime_ns != before:
                with contextlib.suppress(json.JSONDecodeError):
                    return json.loads(path.read_text())
            self.page.wait_for_timeout(250)
        raise AssertionError(f"{self.name}: Ctrl+S did not write {path} in {timeout_s} s")


class Panel:
    """The live panel a notebook displayed: its controls by description, its status line, tables."""

    def __init__(self, page):
        self.page = page
        self.root = page.locator(".jp-OutputArea-output .widget-vbox").last
        self.root.wait_for(timeout=60_000)

    def control(self, kind, label):
        return self.root.locator(f".widget-{kind}").filter(has=self.page.locator(f"label:text-is('{label}')"))

    def select(self, label, *values, multiple=False):
        kind = "select-multiple" if multiple else "dropdown"
        self.control(kind, label).locator("select").select_option(list(values))

    def slide(self, label, steps=1):
        handle = self.control("slider", label).locator(".noUi-handle").first
        handle.focus()
        for _ in range(steps):
            handle.press("ArrowRight")

    def slider_value(self, label):
        return int(self.control("slider", label).locator(".widget-readout").inner_text())

    def status(self):
        return self.root.locator(STATUS).inner_text().strip()

    def wait_status(self, pattern, timeout_s=60, other_than=None):
        """Wait until the status line matches `pattern` (a JavaScript regular expression) and differs
        from `other_than`; returns it."""
        self.page.wait_for_function(
            """([root, status, pattern, before]) => {
                 const s = root.querySelector(status);
                 const t = s ? s.innerText.trim() : '';
                 return t !== before && new RegExp(pattern).test(t);
               }""",
            arg=[self.root.element_handle(), STATUS, pattern, other_than],
            timeout=timeout_s * 1000,
        )
        return self.status()

    def click(self, text, timeout_s=600):
        """Click the button and wait until its run has ended (its time, or an error, in the status line)."""
        before = self.status()
        self.root.locator("button", has_text=text).click()
        return self.wait_status(DONE, timeout_s, other_than=before)

    def table(self, title):
        """The rows of the table under the heading `title`, as dicts of the cells' text."""
        t = self.root.locator(f"h4:text-is('{title}') + table")
        cells = t.evaluate("t => [...t.rows].map(r => [...r.cells].map(c => c.innerText.trim()))")
        return [dict(zip(cells[0], r)) for r in cells[1:]]

    def options(self, label):
        """A dropdown's choices as text (the browser shows a non-breaking space as a space)."""
        texts = self.control("dropdown", label).locator("option").all_inner_texts()
        return [t.replace("\xa0", " ") for t in texts]
