"""Kernels started ahead: while one notebook runs, the next one's kernel starts and imports the
modules that notebook imports, so the suite does not wait for a kernel's start and `import torch`
between notebooks (about 5 s a notebook on the 2-core CPU machine, 6-9 s on the H200's host).

The warm-up only imports: it opens no device (a CUDA context beside a running notebook's would
share its GPU) and binds no name in the notebook's namespace. It then checks every import statement
of the notebook's code cells as Python would run it, those a batch run skips included (a live
panel's import under `if INTERACTIVE:`): one that fails fails the warm-up's request with one line
naming the statement, and the suite marks the notebook failed with it (`failure()`).
"""

import ast
import json
import queue
import time
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

# what nblib.setup imports lazily (nblib.__getattr__), which no import statement names; and
# torch._dynamo, which torch imports at the first call of a custom op (torch.library wraps each in
# a dynamo-disabled function): the csi ops' first call, 1.7 s on the 2-core machine, in every notebook
ALWAYS = ("torch", "torch._dynamo", "nblib.run.notebook")

WARM_CODE = """def _nblib_warm(names, statements):
    import importlib
    for name in names:  # ahead of the notebook: `from m import a` names m.a, which may be no module
        try:
            importlib.import_module(name)
        except Exception:
            pass
    failed = []
    for module, attrs in statements:  # as the notebook's own statements would run
        try:
            m = importlib.import_module(module)
            for a in attrs:
                if not hasattr(m, a):
                    try:
                        importlib.import_module(module + "." + a)
                    except ModuleNotFoundError as e:
                        if e.name != module + "." + a:  # the submodule exists; its own import failed
                            raise
                        raise ImportError(f"cannot import name {{a!r}} from {{module!r}}") from None
        except Exception as e:
            what = f"from {{module}} import {{', '.join(attrs)}}" if attrs else f"import {{module}}"
            failed.append(f"{{what}}: {{type(e).__name__}}: {{e}}")
    if failed:
        raise ImportError("; ".join(failed))
_nblib_warm({names!r}, {statements!r})
del _nblib_warm"""


def _code_trees(notebook: Path):
    nb = json.loads(Path(notebook).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            yield ast.parse("".join(cell["source"]))
        except SyntaxError:  # a cell with magics: its imports are the notebook's own business
            continue


def import_statements(notebook: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Each absolute import statement of the notebook's code cells, wherever it stands (inside
    `if INTERACTIVE:` too): (module, ()) for `import module`, (module, names) for `from module
    import names`; once each, in order."""
    found = []
    for tree in _code_trees(notebook):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((node.module, tuple(a.name for a in node.names if a.name != "*")))
    return list(dict.fromkeys(found))


def imported_modules(notebook: Path) -> list[str]:
    """The modules the notebook's code cells import (for `from m import a`, m and m.a, which may be
    a submodule), in order, once each; ALWAYS first, and last what the notebook's metadata lists
    under nblib.warm (what its functions import lazily, e.g. transformers for notebook 06)."""
    names = list(ALWAYS)
    for module, attrs in import_statements(notebook):
        names += [module] + [f"{module}.{a}" for a in attrs]
    nb = json.loads(Path(notebook).read_text())
    names += nb.get("metadata", {}).get("nblib", {}).get("warm", [])
    return list(dict.fromkeys(names))


class WarmKernel:
    """A python3 kernel started now, in `cwd`, already importing what `notebook` imports; hand its
    `km` to papermill (which then neither starts nor stops a kernel) and close() it after."""

    def __init__(self, notebook: Path, cwd: Path):
        # an unreadable notebook: no kernel
        code = WARM_CODE.format(names=imported_modules(notebook), statements=import_statements(notebook))
        self.km = AsyncKernelManager(kernel_name="python3")
        self.kc = None
        self.reply = None  # the warm-up's execute_reply content, once ready() has seen it
        run_sync(self.km.start_kernel)(cwd=str(cwd))
        try:
            # sent without waiting: the kernel imports while the current notebook runs; the
            # notebook's first request queues behind it on the kernel's shell channel
            self.kc = self.km.blocking_client()
            self.kc.start_channels()
            self.msg_id = self.kc.execute(code, silent=True, store_history=False)
        except BaseException:
            self.close()  # a started kernel is never left behind
            raise

    def ready(self, timeout=120.0) -> bool:
        """Wait until the warm-up's imports are done (its reply); False after `timeout` seconds."""
        if self.reply is not None:  # seen already
            return True
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.kc.get_shell_msg(timeout=left)
            except queue.Empty:
                return False
            if msg["parent_header"].get("msg_id") == self.msg_id:
                self.reply = msg["content"]
                return True
        return False

    def failure(self) -> str | None:
        """None when the warm-up's imports all ran (or its reply was not seen); else one line: the
        import statements that failed, each with its error."""
        if self.reply is None or self.reply.get("status") != "error":
            return None
        return f"an import of the notebook fails: {self.reply.get('evalue', '')}"

    def alive(self) -> bool:
        return bool(run_sync(self.km.is_alive)())

    def close(self):
        """Stop the channels and the kernel (idempotent)."""
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km.has_kernel:
            run_sync(self.km.shutdown_kernel)(now=True)
        run_sync(self.km.cleanup_resources)()
