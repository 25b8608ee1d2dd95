"""The floor plan: nblib's packages form layers, a package imports only from layers below it,
no module imports itself back through others, and no module grows past 500 lines."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["core", "backends", "engine", "instruments", "studies", "schema", "publish", "lab", "run"]
MAX_LINES = 500


def modules():
    for path in sorted((ROOT / "nblib").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py")):
        yield ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), path


def imports(path):
    """Every nblib/kernels module a file imports, at any depth (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("nblib", "kernels")}


def layer(mod):
    parts = mod.split(".")
    if parts[0] == "kernels":
        return -1  # beside nblib: may use nblib.core only
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer():
    loose = [
        m
        for m, _ in modules()
        if m.startswith("nblib.") and layer(m) is None and m not in ("nblib.__main__",)
    ]
    assert loose == [], f"modules outside the layer packages: {loose}"


def test_lower_layers_never_import_higher_ones():
    bad = []
    for mod, path in modules():
        me = layer(mod)
        if me is None:
            continue
        for dep in imports(path):
            them = layer(dep)
            if them is None:
                continue
            if me == -1 and them not in (-1, 0):
                bad.append(f"{mod} -> {dep} (kernels may use nblib.core only)")
            elif me >= 0 and them > me:
                bad.append(f"{mod} -> {dep}")
    assert bad == [], "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    known = dict(modules())
    graph = {m: {d for d in imports(p) if d in known and d != m} for m, p in known.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for d in graph[m]:
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])
    # a package's __init__ importing its own modules is not a cycle worth reporting
    cycles = [c for c in cycles if len({x.rsplit(".", 1)[0] for x in c}) > 1 or len(c) > 2]
    assert cycles == [], f"import cycles: {cycles}"


@pytest.mark.parametrize("mod,path", list(modules()), ids=[m for m, _ in modules()])
def test_no_module_over_500_lines(mod, path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines: split it by concern"


def test_architecture_names_every_module():
    """docs/architecture.md's index names every module, so a reader finds any module's job there."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [m for m, _ in modules() if f"`{m}`" not in doc]
    assert missing == [], f"docs/architecture.md does not name: {missing}"


def cuda_callers():
    """The nblib modules whose code (not comments or docstrings) names torch.cuda."""
    found = set()
    for mod, path in modules():
        if not mod.startswith("nblib"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Attribute) and node.attr == "cuda"
            named = named and isinstance(node.value, ast.Name) and node.value.id == "torch"
            imported = isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                m.startswith("torch.cuda")
                for m in (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
            )
            if named or imported:
                found.add(mod)
    return found


def test_torch_cuda_is_called_where_the_device_facade_says():
    """nblib.backends.device's docstring names the modules that call torch.cuda; no other does."""
    from nblib.backends import device

    assert cuda_callers() == {
        "nblib.backends.device",
        "nblib.instruments.audit.trace.cuda",
        "nblib.instruments.csan",
    }
    assert all(m in device.__doc__ for m in cuda_callers() - {"nblib.backends.device"})
