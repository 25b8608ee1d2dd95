"""The public API says what it is: each module covered here names its public names in `__all__`, every
name there exists, every public function and class of the module is in it, and every public function
and method is annotated (each parameter but self/cls, and the return). COVERED names the packages and
modules held to this; `make lint` runs mypy on them (the Makefile's MYPY_FILES), but for those
MYPY_PENDING names."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a package (every module under it) or one module, as a path from the repository root
COVERED = [
    "nblib/core",
    "nblib/lab",
    "nblib/engine/buffers.py",
    "nblib/engine/build.py",
    "nblib/engine/references.py",
    "nblib/engine/runner.py",
    "nblib/engine/workload.py",
    "nblib/instruments/canary.py",
    "nblib/instruments/canary_graph.py",
    "nblib/instruments/buffer_canary.py",
    "nblib/instruments/csan.py",
    "nblib/instruments/gediff.py",
    "nblib/instruments/overhead.py",
    "nblib/instruments/probes.py",
    "nblib/studies/counts.py",
    "nblib/studies/designs.py",
    "nblib/studies/design_evidence.py",
    "nblib/studies/fix.py",
    "nblib/studies/forced.py",
    "nblib/studies/method.py",
    "nblib/studies/microbatch.py",
    "nblib/studies/protocol.py",
    "nblib/schema/params.py",
    "nblib/schema/speed.py",
    "nblib/publish/browse.py",
    "nblib/publish/caveats.py",
    "nblib/publish/pages.py",
    "nblib/publish/results_runs.py",
    "nblib/publish/runindex.py",
    "nblib/publish/show.py",
    "nblib/publish/site.py",
    "nblib/publish/sweep_site.py",
]
# covered modules mypy does not check yet (left out of the Makefile's MYPY_FILES), and why
MYPY_PENDING = {
    "nblib/schema/params.py": "models built by create_model as bases, and Literal over tuples of choices",
    "nblib/instruments/buffer_canary.py": "locals that need a type: _runs' runs, BufferCanary._before",
}
# what MYPY_FILES holds beside the covered modules
MYPY_ALSO = ["kernels"]
# methods with two leading underscores that are part of a class's public face: their parameters are
# annotated too (and __call__'s return; __init__ returns None)
DUNDERS_CHECKED = {"__init__", "__call__"}


def covered():
    for entry in COVERED:
        path = ROOT / entry
        for p in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if p.name != "__main__.py":  # a script: its names are no one's API
                yield p


def top_level(tree):
    """The statements at module level, with those inside top-level if/try blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If | ast.Try):
            todo[:0] = (
                node.body + node.orelse + getattr(node, "handlers", []) + getattr(node, "finalbody", [])
            )
        elif isinstance(node, ast.ExceptHandler):
            todo[:0] = node.body
        else:
            yield node


def bound_names(tree):
    names = set()
    for node in top_level(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def declared_all(tree):
    """The names in `__all__` (None when the module has none), from a literal list or tuple."""
    for node in top_level(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node.value, ast.List | ast.Tuple), "__all__ is a literal list or tuple"
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def unannotated(fn, method):
    """What of fn's signature lacks an annotation: parameter names, and 'return'."""
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
    decorators = {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    skip_first = method and "staticmethod" not in decorators
    missing = [p.arg for i, p in enumerate(params) if p.annotation is None and not (skip_first and i == 0)]
    if fn.returns is None and fn.name != "__init__":
        missing.append("return")
    return missing


def public_functions(tree):
    """(qualified name, function, is a method) for each public function and each method of a public
    class, at any depth of public classes."""

    def public(name):
        return not name.startswith("_") or name in DUNDERS_CHECKED

    def walk(body, prefix, method):
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and public(node.name):
                yield prefix + node.name, node, method
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from walk(node.body, f"{prefix}{node.name}.", True)

    yield from walk(list(top_level(tree)), "", False)


CASES = list(covered())
IDS = [str(p.relative_to(ROOT)) for p in CASES]


def test_covered_paths_exist():
    assert [e for e in COVERED if not (ROOT / e).exists()] == []


def mypy_files():
    """The Makefile's MYPY_FILES: its words, continuation lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("MYPY_FILES :="))
    return line.split(":=", 1)[1].split()


def test_lint_type_checks_the_covered_modules():
    want = [e for e in COVERED if e not in MYPY_PENDING] + MYPY_ALSO
    assert sorted(mypy_files()) == sorted(want)


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_all_lists_the_public_names(path):
    tree = ast.parse(path.read_text())
    public_defs = [
        n.name
        for n in top_level(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not n.name.startswith("_")
    ]
    names = declared_all(tree)
    if names is None:
        assert public_defs == [], f"no __all__, and public definitions {public_defs}"
        return
    assert len(names) == len(set(names)), "a name twice in __all__"
    assert [n for n in names if n not in bound_names(tree)] == [], "names in __all__ the module lacks"
    assert [n for n in public_defs if n not in names] == [], "public functions and classes not in __all__"


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_public_functions_are_annotated(path):
    tree = ast.parse(path.read_text())
    bad = {q: m for q, fn, method in public_functions(tree) if (m := unannotated(fn, method))}
    assert bad == {}, "unannotated parameters and returns"
