"""The SIM model on a fresh simulator and seeded random decode steps for it (a helper module, not a
test file), shared by the simulator's and the runner's tests."""

import torch
from models import SIM

from nblib.backends.sim import SimDevice
from nblib.engine.model import DecodeModel, ModelConfig


def batches(n, bs, gen, max_pages=16, num_pages=256):
    """n random steps of bs requests: tokens, page tables, lengths and store slots, drawn from gen."""
    for _ in range(n):
        yield (
            torch.randint(0, 512, (bs,), generator=gen),
            torch.randint(1, num_pages, (bs, max_pages), generator=gen, dtype=torch.int32),
            torch.randint(1, max_pages * 64, (bs,), generator=gen, dtype=torch.int32),
            torch.full((bs,), 63),
        )


def sim_model(gen, **knobs):
    """The SIM model on a fresh simulator, every page but the scratch one prefilled from gen."""
    m = DecodeModel(ModelConfig(**SIM, **knobs), SimDevice(seed=0))
    m.prefill_entries(torch.arange(64, 256 * 64), gen)
    return m
