"""nblib.schema.tuned: a tuned profile's file is named by the device it was tuned on."""

import types

from nblib.schema import tuned


def test_the_gpu_slug_names_the_file():
    gpu = types.SimpleNamespace(name="cuda", device_name=lambda: "NVIDIA GeForce RTX 4090")
    assert tuned.device_slug(gpu) == "nvidia-geforce-rtx-4090"
    assert tuned.device_slug(types.SimpleNamespace(name="sim", device_name=lambda: "CPU simulator")) == "sim"
