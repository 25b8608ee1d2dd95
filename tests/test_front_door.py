"""The front door: the README a newcomer reads first stays short and true (every command it names
parses, every make target and path it names exists, no commit hashes in its prose), docs/results.md
agrees with the committed results it is generated from, and the tracked text speaks of the software,
never of how it was made."""

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

import nblib.__main__
from nblib.core.paths import ROOT
from nblib.publish import results_doc

cli = importlib.import_module(nblib.__main__.main.__module__)  # the command line, wherever it lives

README = ROOT / "README.md"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NBLIB = re.compile(r"python -m nblib(?: ([^\s`#]+))?")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# How the software was made, not what it does. Read the hits before adding a phrase: "carry" alone
# is legitimate ("the simulator's events carry no timing", "which buckets carry it"), and so is
# "carried over".
MADE = [
    r"device\s+call",
    r"carry\s+list",
    r"\bcarried\b(?!\s+over)",
    r"\byou\s+carry\b",
    r"this\s+session",
    r"session's\s+time",
    r"\bran\s+here\b",
    r"not\s+run\s+here",
    r"issue\s+#",
    r"\bwave\s+\d",
]
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".sh", ".ipynb", ".j2", ".toml")
TEXT_NAMES = ("Makefile", ".gitignore", ".ci/run")


def readme():
    return README.read_text()


def code_lines(text):
    """The lines of the README's fenced blocks, comments cut."""
    return [ln.split("#")[0].strip() for block in FENCE.findall(text) for ln in block.splitlines()[1:-1]]


def test_readme_is_short():
    n = len(readme().splitlines())
    assert n < 110, f"README.md has {n} lines: keep it a front door, move detail to docs/"


def _parse(argv, monkeypatch):
    """argparse's verdict on argv, nothing run: every command is replaced by a no-op."""
    for name in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: None)
    try:
        cli.main(argv)
    except SystemExit as e:
        return e.code
    return 0


def test_every_nblib_command_in_the_readme_parses(monkeypatch):
    text = readme()
    full = [
        ln[ln.index("python -m nblib") :].split()[3:] for ln in code_lines(text) if "python -m nblib" in ln
    ]
    assert full, "the README shows no `python -m nblib` command line"
    for argv in full:
        assert _parse(argv, monkeypatch) == 0, f"README: python -m nblib {' '.join(argv)} does not parse"
    named = {m for m in NBLIB.findall(text) if m and m != "..."}
    assert {"run", "window", "audit", "sweep", "publish", "results"} <= named, named
    for sub in sorted(named):
        assert _parse([sub, "--help"], monkeypatch) == 0, (
            f"README names `python -m nblib {sub}`: no such command"
        )


def test_the_command_line_parser_refuses_what_the_readme_test_would_miss(monkeypatch):
    """The check above can fail: an unknown command and a missing argument do not parse."""
    assert _parse(["nosuch", "--help"], monkeypatch) == 2
    assert _parse(["audit"], monkeypatch) == 2


def makefile_targets():
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_every_make_target_in_the_readme_exists():
    named = set(MAKE.findall(readme()))
    assert {"suite", "test", "bench-suite", "test-newest"} <= named, named
    missing = named - makefile_targets()
    assert not missing, f"README names make targets the Makefile lacks: {sorted(missing)}"


def readme_paths(text):
    """Every repository path the README names: link targets, inline code and command-line tokens
    with a slash; placeholders (<profile>) and the venv (made by make, not tracked) left out."""
    tokens = set(LINK.findall(text))
    tokens |= {t for t in INLINE.findall(text) if " " not in t}
    tokens |= {t for ln in code_lines(text) for t in ln.split()}
    out = set()
    for token in tokens:
        t = token.rstrip(".,;").removeprefix("./")
        if "/" not in t or t.startswith(("-", "http", ".venv")) or "<" in t or "..." in t:
            continue
        out.add(re.sub(r"(\.py):\w+$", r"\1", t).rstrip("/"))  # file.py:function names a file
    return out


def test_every_path_in_the_readme_exists():
    paths = readme_paths(readme())
    assert {"outputs/gpu/landing.png", "docs/results.md", "docs/audit.md"} <= paths, paths
    missing = sorted(p for p in paths if not any(ROOT.glob(p)))
    assert not missing, f"README names paths that do not exist: {missing}"


def test_the_readme_path_check_sees_a_wrong_path():
    assert readme_paths("see `docs/nowhere.md` and ![x](outputs/gpu/none.png)") == {
        "docs/nowhere.md",
        "outputs/gpu/none.png",
    }


def test_readme_prose_names_no_commit_or_issue():
    text = readme()
    assert not HASH.findall(text), f"commit hashes in README: {HASH.findall(text)} (provenance: results.json)"
    assert not re.findall(r"#\d+", text), "issue numbers in README"


def tracked_text():
    """{path: text} of the tracked text files outside outputs/; a notebook's cells' sources joined."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    out = {}
    for name in names.stdout.splitlines():
        if name.startswith("outputs/") or name.endswith(".log") or name == "tests/test_front_door.py":
            continue  # this file lists the phrases it looks for
        if not (name.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES) or not (ROOT / name).exists():
            continue
        text = (ROOT / name).read_text(errors="replace")
        if name.endswith(".ipynb"):
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        out[name] = text
    return out


def made_hits(files):
    hits = []
    for name, text in files.items():
        for i, line in enumerate(text.splitlines(), 1):
            hits += [f"{name}:{i}: {line.strip()}" for p in MADE if re.search(p, line, re.I)]
    return hits


def test_tracked_text_speaks_of_the_software_not_of_how_it_was_made():
    files = tracked_text()
    assert "README.md" in files and "Makefile" in files and "notebooks/00_reproduce.ipynb" in files
    hits = made_hits(files)
    assert not hits, "say what the software does, not how it was made:\n" + "\n".join(hits)


def test_the_phrase_check_flags_what_it_should_and_spares_the_rest():
    flagged = made_hits(
        {
            # assembled from pieces, so this file's own text never holds the phrases it looks for
            "a": "\n".join(
                " ".join(words)
                for words in (
                    ("wheels", "carr" + "ied", "to the GPU"),
                    ("the", "Device", "Call", "took 3 s"),
                    ("see", "issue", "#12"),
                    ("since", "wave", "3"),
                )
            ),
            "b": "the simulator's events carry no timing\nnone is carried over\nthe carry bit",
        }
    )
    assert [h.split(":")[0] for h in flagged] == ["a"] * 4, flagged


def test_results_page_agrees_with_the_committed_results():
    diff = results_doc.differences()
    assert not diff, "docs/results.md is stale: run python -m nblib results\n" + "\n".join(diff[:40])


def test_results_check_exits_1_naming_the_lines_that_differ(tmp_path, capsys):
    page = tmp_path / "results.md"
    lines = results_doc.DOC.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("> "))  # the first verdict
    lines[i] = "> a verdict nobody measured"
    page.write_text("\n".join(lines) + "\n")
    # cli.main is `python -m nblib`: a string given to sys.exit goes to stderr, with status 1
    with pytest.raises(SystemExit) as e:
        cli.main(["results", "--check", "--out", str(page)])
    out = capsys.readouterr().out
    assert isinstance(e.value.code, str), e.value.code
    assert "-> a verdict nobody measured" in out, out
    assert "run python -m nblib results" in e.value.code


def test_results_page_refuses_a_commit_git_does_not_know():
    with pytest.raises(ValueError, match="not in this repository's history"):
        results_doc.newest_first([Path("x")], lambda _: "0123456789abcdef0123456789abcdef01234567")
