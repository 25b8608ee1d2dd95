"""Profiles (params/*.yaml) are plain values; they are checked here before anything heavy runs."""

from pathlib import Path

import yaml

from nblib.backends import device
from nblib.core.paths import ROOT

PROFILES = ("gpu", "gpu-long", "sim", "ci")


def load(path):
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no params file {path}: use one of params/{{{','.join(PROFILES)}}}.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of parameter names to values")
    return data


def resolve_backend(name):
    """The device for a profile's backend, failing in one line when this machine can't give it."""
    return device.get(name)


def default_profile():
    """The README's main command: the GPU profile where there is CUDA, the simulator elsewhere."""
    return ROOT / "params" / ("gpu.yaml" if device.has_cuda() else "sim.yaml")
