"""What the field targets share: seeded weights, the eager warm-up, and loading another example by path.

A target file imports this as `_field`: the audit loads a target file with its own folder on the path.
"""

import importlib.util
import sys
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1]


def params(dev, seed=0):
    """param(*shape, dtype=...): a tensor made once, outside any capture, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)

    def param(*shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=g) * shape[-1] ** -0.5).to(dtype).to(dev.torch_device)

    return param


def warm(dev, step):
    """Run the step once eagerly (lazy initialisations happen here, not inside the capture)."""
    step()
    dev.synchronize()
    return step


def load_example(relpath):
    """The module of examples/<relpath>, loaded once by path under a name of its own."""
    name = "_field_" + relpath.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / relpath)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]
