"""The house rules on imports and names, read from the source (no module is imported):

1. the device facade is the only door to a backend: no module outside nblib/backends/sim/ imports
   the simulator, except nblib/backends/device.py, which imports it lazily in get() (and for type
   hints only);
2. no module reads or sets another object's private attribute (`x._name` where x is not self or
   cls), except the torch, Triton, Python and IPython names listed in FOREIGN_PRIVATE, each with why;
3. no module imports a private name of another module (`from nblib.x import _name`).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = "nblib.backends.sim"
FACADE = Path("nblib/backends/device.py")

# Private names of other libraries that nblib and kernels use on purpose, as `X._name`. A dotted key
# is matched against the whole expression; a bare name, against the attribute on any object (the
# object is one of that library's, whatever the variable is called).
FOREIGN_PRIVATE = {
    # torch: no public API does the job (tests/test_private_api.py checks each one)
    "torch.cuda._sleep": "a spin kernel on the current stream, the audit's forced schedule",
    "torch.cuda.memory._record_memory_history": "the allocator's alloc/free trace with stacks",
    "torch.cuda.memory._snapshot": "the allocator's trace recorded by _record_memory_history",
    "_schema": "OpOverload._schema: the only source of alias_info (which arguments an op writes)",
    # Triton
    "_pack_args": "JITFunction._pack_args: compiling a kernel without a GPU (kernels/launch.py)",
    # Python
    "sys._getframe": "the caller's frames, cheaper than inspect.stack() on every recorded op",
    "_asdict": "namedtuple's public API (underscored so that no field name can clash)",
    "_fields": "namedtuple's public API (underscored so that no field name can clash)",
    "_replace": "namedtuple's public API (underscored so that no field name can clash)",
    # IPython
    "_repr_mimebundle_": "IPython's display protocol: a widget's rich representation",
}


def sources():
    """(path relative to the repository, parsed module) for every file of nblib/ and kernels/."""
    for top in ("nblib", "kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text(), filename=str(path))


def parents(tree):
    """node -> its parent, for every node of the tree."""
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def imports_simulator(node):
    """Whether an import statement imports the simulator or one of its modules, in any form."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        return False
    return any(m == SIM or m.startswith(SIM + ".") for m in names)


def lazy_or_typing_only(node, up):
    """Whether an import sits inside a function or under `if TYPE_CHECKING:` (never at import time)."""
    while node in up:
        node = up[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def simulator_imports(rel, tree):
    if rel.parts[:3] == ("nblib", "backends", "sim"):
        return []
    up = parents(tree)
    return [
        f"{rel}:{node.lineno}: imports the simulator ({ast.unparse(node)}); reach it through the facade "
        "(nblib.backends.device) or move what it needs into a backend-neutral module"
        for node in ast.walk(tree)
        if imports_simulator(node) and not (rel == FACADE and lazy_or_typing_only(node, up))
    ]


def is_private(name):
    return name.startswith("_") and not name.startswith("__")


def own_object(value):
    """self.x, cls.x and super().x are the object's own attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def private_attributes(rel, tree):
    return [
        f"{rel}:{node.lineno}: reaches into {ast.unparse(node)}; give its owner a public method or "
        "attribute named for the job (or, for another library's private API, add it to FOREIGN_PRIVATE "
        "with why)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and is_private(node.attr)
        and not own_object(node.value)
        and node.attr not in FOREIGN_PRIVATE
        and ast.unparse(node) not in FOREIGN_PRIVATE
    ]


def private_imports(rel, tree):
    return [
        f"{rel}:{node.lineno}: imports {a.name} from {node.module}; make it public there (a name "
        "without the underscore, in __all__) or keep its use inside that module"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and not node.level
        and (node.module or "").split(".")[0] in ("nblib", "kernels")
        for a in node.names
        if is_private(a.name)
    ]


def everywhere(check):
    return [line for rel, tree in sources() for line in check(rel, tree)]


def test_only_the_facade_imports_the_simulator():
    found = everywhere(simulator_imports)
    assert found == [], "\n".join(found)


def test_no_module_reaches_into_another_object_s_private_attributes():
    found = everywhere(private_attributes)
    assert found == [], "\n".join(found)


def test_no_module_imports_another_module_s_private_name():
    found = everywhere(private_imports)
    assert found == [], "\n".join(found)


# the checks themselves, on code written for them
HERE = Path("nblib/engine/example.py")


@pytest.mark.parametrize(
    "code,caught",
    [
        ("from nblib.backends.sim.rules import RULES", True),
        ("from nblib.backends import sim", True),
        ("import nblib.backends.sim.facade", True),
        ("import nblib.backends.simulated", False),
        ("from nblib.backends.device import get", False),
    ],
)
def test_the_simulator_check_sees_every_form_of_import(code, caught):
    assert bool(simulator_imports(HERE, ast.parse(code))) is caught


def test_the_facade_may_import_the_simulator_lazily_but_not_at_import_time():
    lazy = "def get():\n    from nblib.backends import sim\n"
    typing = "if TYPE_CHECKING:\n    from nblib.backends.sim.facade import SimDevice\n"
    eager = "from nblib.backends import sim\n"
    assert simulator_imports(FACADE, ast.parse(lazy)) == []
    assert simulator_imports(FACADE, ast.parse(typing)) == []
    assert len(simulator_imports(FACADE, ast.parse(eager))) == 1
    assert len(simulator_imports(HERE, ast.parse(lazy))) == 1


@pytest.mark.parametrize(
    "code,caught",
    [
        ("dev._cap", True),
        ("self.dev._cur", True),
        ("rec._begin(main)", True),
        ("self._cap", False),
        ("cls._cache", False),
        ("super()._install()", False),
        ("x.__class__", False),
        ("torch.cuda._sleep(1)", False),
        ("cfg._asdict()", False),
        ("torch.cuda._lazy_init()", True),
    ],
)
def test_the_private_attribute_check(code, caught):
    assert bool(private_attributes(HERE, ast.parse(code))) is caught


@pytest.mark.parametrize(
    "code,caught",
    [
        ("from nblib.backends.sim.rules import _r", True),
        ("from kernels.logits import _check_bf16_args", True),
        ("from nblib.core import paths", False),
        ("from torch.utils._pytree import tree_flatten", False),
    ],
)
def test_the_private_import_check(code, caught):
    assert bool(private_imports(HERE, ast.parse(code))) is caught
