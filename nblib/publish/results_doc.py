"""docs/results.md, written from the committed results alone: every notebook's verdict and key
figures with the commit and device each came from, the window search, the audit on CUDA, what the
instruments cost, and the kernels' newest timing table with the tables before it.

    python -m nblib results            # write docs/results.md (atomically)
    python -m nblib results --check    # exit 1, naming the lines, when docs/results.md and the results differ

Nothing here measures or rounds a figure into a claim: each number is read from a results file that
names its commit, and the page says which file. The measurement notes that no file holds (how the
kernels are timed, how to read a per-bucket row) are the template's hand-written preamble
(templates/results.md.j2). Which results are newest is told by their commits' dates in git, so the
page is the same on every clone.
"""

import difflib
import json
import re
import subprocess
from pathlib import Path

import jinja2
from pydantic import BaseModel

from nblib.core.files import write_text
from nblib.core.paths import NOTEBOOKS, ROOT
from nblib.publish import results_figures as rf
from nblib.publish import results_runs
from nblib.schema import results as R

DOC = ROOT / "docs" / "results.md"
TEMPLATE = "results.md.j2"
# The committed run folders, in the order the page lists them, and what each one is for.
RUNS = (
    (
        "outputs/gpu-timed",
        "notebooks 00 and 02 on params/gpu.yaml as it stands: tool calls of 0.5-4 ms on the engine's clock, "
        "buckets every 4 from 20 to 32",
    ),
    ("outputs/gpu", "the suite, notebook by notebook, on the profile before it: tool calls of 1-8 steps"),
    ("outputs/gpu-repeat", "notebooks 00 and 02 again on the same commit: how far the figures move"),
    ("outputs/gpu-long", "notebook 00 alone on params/gpu-long.yaml"),
    (
        "outputs/gpu-method",
        "notebooks 03 and 07 on params/gpu.yaml (scripts/gpu_method.sh): each hazard under the forced order, "
        "and the method on transformers' MoE decoders",
    ),
    (
        "outputs/gpu-h100",
        "notebooks 00 and 02 on params/gpu.yaml on an H100, a GPU the profile was not tuned on; "
        "02's forced order",
    ),
    (
        "outputs/gpu-h100-suite",
        "the whole suite on params/gpu.yaml on an H100, one commit, notebook 07 on CUDA",
    ),
    (
        "outputs/sim-timed",
        "notebooks 00, 02, 03 and 07 on params/sim.yaml: the CPU simulator, tool calls in time on its clock",
    ),
)
BENCH = "outputs/bench"
WINDOW = "outputs/probe/window"
AUDIT = "outputs/audit-zoo/results.json"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=False,  # markdown, not HTML
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the build instead of rendering blank
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


class Provenance(BaseModel):
    """Where a file's figures came from, as the file records it."""

    path: str
    commit: str  # short, "+dirty" kept: a run from an uncommitted tree says so
    device: str
    torch: str = "-"
    triton: str = "-"

    @property
    def line(self):
        return f"`{self.path}`: {self.device}, commit {self.commit}, torch {self.torch}, triton {self.triton}"


class NotebookRun(BaseModel):
    source: Provenance
    notebook: str
    status: str
    seconds: float | None = None
    verdict: str = ""
    figures: list[rf.Block] = []


class RunFolder(BaseModel):
    folder: str
    what: str
    runs: list[NotebookRun]


def _read(path):
    try:
        return json.loads((ROOT / path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e}); restore it with git") from e


def provenance(path, meta):
    return Provenance(
        path=str(path),
        commit=rf.short(meta.get("commit")),
        device=str(meta.get("device", "-")),
        torch=str(meta.get("torch", "-")),
        triton=str(meta.get("triton", "-")),
    )


def notebook_run(path):
    """One committed results.json, through its model (a file that does not fit it fails the doc,
    named); the figures' extractors read the file's tables as written."""
    raw = _read(path)
    try:
        r = R.validate(raw)
    except ValueError as e:
        raise ValueError(f"{path}: does not fit its model in nblib.schema.results: {e}") from e
    ok = r.status == "ok"
    return NotebookRun(
        source=provenance(path, raw),
        notebook=r.notebook,
        status=r.status,
        seconds=r.seconds,
        verdict=(r.verdict or "") if ok else "",
        figures=rf.for_notebook(raw) if ok else [],
    )


def run_folders():
    out = []
    for folder, what in RUNS:
        paths = [
            f"{folder}/{n}.results.json" for n in NOTEBOOKS if (ROOT / folder / f"{n}.results.json").exists()
        ]
        if paths:
            out.append(RunFolder(folder=folder, what=what, runs=[notebook_run(p) for p in paths]))
    return out


def commit_times(shas):
    """{sha: its commit time in git}; a sha git does not know is left out."""
    times = {}
    for sha in sorted(set(shas)):
        got = subprocess.run(
            ["git", "log", "-1", "--format=%ct", sha.partition("+")[0], "--"],
            cwd=ROOT,
            check=False,  # an unknown commit is reported by newest_first, with what to do
            capture_output=True,
            text=True,
        )
        if got.returncode == 0 and got.stdout.strip():
            times[sha] = int(got.stdout.strip())
    return times


def newest_first(items, sha_of):
    """items ordered newest commit first; an item whose commit git does not know is an error, since
    its place cannot be told (a clone without history cannot order the tables)."""
    times = commit_times([sha_of(i) for i in items])
    unknown = [sha_of(i) for i in items if sha_of(i) not in times]
    if unknown:
        raise ValueError(
            f"commit(s) {', '.join(sorted(set(unknown)))} not in this repository's history: "
            "run `python -m nblib results` in a full clone (git fetch --unshallow)"
        )
    return sorted(items, key=lambda i: (times[sha_of(i)], sha_of(i)), reverse=True)


def context():
    """Everything the template reads, from the committed files."""
    folders = run_folders()
    by_notebook = {n: [r for f in folders for r in f.runs if r.notebook == n] for n in NOTEBOOKS}
    benches = newest_first(rf.benches(ROOT / BENCH), lambda b: b.meta.get("commit", ""))
    costs = newest_first(rf.instrument_costs(ROOT / BENCH), lambda c: c.commit)
    windows = newest_first(rf.windows(ROOT / WINDOW), lambda w: w.commit)
    notes = newest_first(rf.bench_notes(ROOT / BENCH), lambda n: n.commit)
    audit = _read(AUDIT)
    return dict(
        folders=folders,
        notebooks=NOTEBOOKS,
        by_notebook=by_notebook,
        windows=windows,
        audit=rf.audit_blocks(audit),
        audit_source=provenance(AUDIT, audit.get("meta", {})),
        costs=rf.cost_table(costs),
        kernels=rf.kernel_tables(benches),
        kernel_history=rf.kernel_history(benches),
        notes=rf.notes_list(notes),
        sweeps=results_runs.sweeps(ROOT),
        speeds=results_runs.suite_speeds(ROOT),
    )


def render():
    text = _env.get_template(TEMPLATE).render(**context())
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"  # the template's blocks leave blank runs


def differences(path=DOC):
    """The unified diff between the page at `path` and what the results give; empty when they agree."""
    path = Path(path)
    have = path.read_text().splitlines() if path.exists() else []
    want = render().splitlines()
    return list(difflib.unified_diff(have, want, str(path), "generated", lineterm="", n=0))


def write(path=DOC):
    return write_text(path, render())
