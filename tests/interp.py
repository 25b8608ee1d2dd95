"""Run the kernels in Triton's interpreter on the CPU, without setting TRITON_INTERPRET: once set
in a process, that variable breaks triton.compile (and it would leak into every subprocess the
test session starts). Instead, a fixture swaps each @triton.jit function of the kernel modules,
and triton.language's own @jit helpers (tl.sum, tl.cumsum, ...), for interpreted twins; launchers
look their kernel up at call time, so they run the twin. Compile checks run in a subprocess."""

import os
import subprocess
import sys

import numpy as np
import pytest
import triton.language as tl
import triton.runtime.interpreter as _interp
from triton.runtime.jit import JITFunction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _int_of_size1_array_works():
    try:
        int(np.array([1]))
        return True
    except TypeError:
        return False


# Interpreter scalars are shape-(1,) arrays and triton 3.6 turns them into loop bounds with
# int(array); numpy >= 2.4 refuses that, which breaks every data-dependent `range(0, n)`.
# Use .item() instead (test-only shim, a no-op on older numpy). Triton 3.9's interpreter converts
# them itself (the shim is then redundant, and harmless); drop it once the lower bound is 3.9.
# _patch_lang_tensor is private to Triton's interpreter and no public hook exists (the public
# switch, TRITON_INTERPRET=1, gives no say in it); tests/test_private_api.py checks its signature.
if not _int_of_size1_array_works():
    _orig_patch_lang_tensor = _interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        _orig_patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    _interp._patch_lang_tensor = _patch_lang_tensor


def interpret(monkeypatch, *modules):
    """Swap every JITFunction in modules and in triton.language for an interpreted twin."""
    for mod in (*modules, tl):
        for name, fn in list(vars(mod).items()):
            if isinstance(fn, JITFunction):
                monkeypatch.setattr(mod, name, _interp.InterpretedFunction(fn.fn))


@pytest.fixture
def interpreted(monkeypatch):
    """interpreted(module, ...): run those modules' kernels in the interpreter for this test."""
    return lambda *modules: interpret(monkeypatch, *modules)


def run_without_interpreter(args, timeout, unset=()):
    """python args... from the repository root, in a process without TRITON_INTERPRET (nor the
    variables in unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and k not in unset}
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
