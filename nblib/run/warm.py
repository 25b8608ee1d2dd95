"""Kernels started ahead: while one notebook runs, the next one's kernel starts and imports the
modules that notebook imports, so the suite does not wait for a kernel's start and `import torch`
between notebooks (about 5 s a notebook on the 2-core CPU machine, 6-9 s on the H200's host).

The warm-up only imports: it opens no device (a CUDA context beside a running notebook's would
share its GPU) and binds no name in the notebook's namespace. A module that fails to import is
left to the notebook's own import cell, which raises it where the reader sees it.
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

WARM_CODE = """def _nblib_warm(names):
    import importlib
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the notebook's own import cell raises it, where the reader sees it
            pass
_nblib_warm({names!r})
del _nblib_warm"""


def imported_modules(notebook: Path) -> list[str]:
    """The modules the notebook's code cells import (for `from m import a`, m and m.a, which may be
    a submodule), in order, once each; ALWAYS first, and last what the notebook's metadata lists
    under nblib.warm (what its functions import lazily, e.g. transformers for notebook 06)."""
    nb = json.loads(Path(notebook).read_text())
    names = list(ALWAYS)
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:  # a cell with magics: its imports are the notebook's own business
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    names += nb.get("metadata", {}).get("nblib", {}).get("warm", [])
    return list(dict.fromkeys(names))


class WarmKernel:
    """A python3 kernel started now, in `cwd`, already importing what `notebook` imports; hand its
    `km` to papermill (which then neither starts nor stops a kernel) and close() it after."""

    def __init__(self, notebook: Path, cwd: Path):
        code = WARM_CODE.format(names=imported_modules(notebook))  # an unreadable notebook: no kernel
        self.km = AsyncKernelManager(kernel_name="python3")
        self.kc = None
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
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.kc.get_shell_msg(timeout=left)
            except queue.Empty:
                return False
            if msg["parent_header"].get("msg_id") == self.msg_id:
                return True
        return False

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
