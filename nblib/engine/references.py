"""Eager reference steps, computed once and reused by every configuration that decodes the same
workload on the same weights.

Every step of run_sessions is compared with runner.reference: the eager single-stream step on the
same padded batch (on CUDA, a replay of that step's serial graph, checked against the eager step
bit for bit: nblib.engine.runner.Runner). That step never forks, so what it returns depends on the
weights and the index dtype, the step's inputs and the caches' live entries, and on nothing the
studies toggle: not the overlap (eager decode never forks), not the logits policy (where the logits
live, not their values), not the mode, not the replay-timing seed, not an instrument. The caches'
live entries are the run's own writes (prefill from the workload's seed, then the compressor's
entries, which come before the fork and which no race touches), so within a workload they follow
from the step's index.

A study that runs one workload on several configurations (the matrix's modes and overlaps, the
protocol's one-knob changes, the designs' arms, the fix's variants) gives their runners one
References (by default the process's, shared()): the first configuration computes each step's
reference, the others compare their own replays with it. The key is the backend, the model's
config (the knobs that do not change the eager step normalised away) and a digest of its weights,
the workload, the step's index and a digest of the step's inputs; a step whose inputs differ is
computed, never looked up.

The store can be backed by a folder (References.attach; nblib.setup attaches the process's to
<output_dir>/.references/<source digest>/), so the notebooks of one run folder, each its own
process, compute each step once between them: a group (backend, model key, weights digest,
workload) is read from its file the first time a step of it is asked for, and run_sessions writes
the groups that gained steps when it ends. The folder is named by a digest of the source
(source_digest), so code that changed never reads another version's steps.

    runner = Runner(model, buckets, references=references.shared())
"""

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from nblib.core import files
from nblib.core.paths import NBLIB, ROOT
from nblib.engine.model import GRAPH_ONLY_KNOBS, PAGE, DecodeModel, ModelConfig

if TYPE_CHECKING:
    from nblib.engine.runner import Runner
    from nblib.engine.workload import WorkloadConfig

__all__ = [
    "WEIGHT_SAMPLE",
    "Reference",
    "References",
    "digest",
    "live_inputs",
    "model_key",
    "shared",
    "source_digest",
    "weights_digest",
]


class Reference(NamedTuple):
    out: torch.Tensor
    topk: torch.Tensor


def model_key(cfg: ModelConfig) -> ModelConfig:
    """The model config with the capture-only knobs fixed: equal keys, equal eager steps."""
    return dataclasses.replace(cfg, **GRAPH_ONLY_KNOBS)  # type: ignore[arg-type]  # str-valued knobs


def digest(args: Sequence[torch.Tensor]) -> bytes:
    """A digest of a step's inputs (tokens, page table, sequence lengths, store slots)."""
    h = hashlib.blake2b(digest_size=16)
    for arg in args:
        t = arg.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        if t.numel():
            h.update(t.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # the bytes in place, not a copy
    return h.digest()


def live_inputs(
    args: Sequence[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's inputs with the page table cut to the pages its longest request holds: the step
    reads no column past a request's length (the indexer stops at seq_len, the top-k indices stay
    below it, the compressor writes through store_slots), and the rest of a [bs, max_ctx / 64]
    table is most of the bytes a digest would hash."""
    tokens, table, seq_lens, slots = args
    live = -(-int(seq_lens.max()) // PAGE) if seq_lens.numel() else 0
    return tokens, table[:, :live], seq_lens, slots


# values of each weight the digest reads: a different draw (another seed or shape, another torch's
# generator) differs in its first values, and reading 800 MB of H200-profile weights back to hash
# them all cost each notebook seconds
WEIGHT_SAMPLE = 4096


def weights_digest(model: DecodeModel) -> bytes:
    """A digest of the model's weights, computed once per weight set (weights never change after
    they are drawn, and models of the same shapes and seed share one set: DecodeModel.weight_set;
    the caches do change, and their live entries follow from the workload): each weight's shape,
    dtype and first WEIGHT_SAMPLE values."""
    ws = model.weight_set
    if ws.digest is None:
        every = [t for v in ws.tensors.values() for t in (v if isinstance(v, list) else [v])]
        ws.digest = digest(
            [t.reshape(-1)[:WEIGHT_SAMPLE] for t in every] + [torch.tensor(t.shape) for t in every]
        )
    return ws.digest


class References:
    """Eager reference steps by group (backend, model key, weights digest, workload) and, within a
    group, by step index and input digest; hits and misses counted (a miss computes the step and
    keeps it). attach(folder) backs the store with files, one a group: a group not in memory is read
    from its file, and flush() writes the groups that gained steps (atomically, merged with what the
    file held), so the notebooks of one run folder compute each eager step once between them."""

    def __init__(self, folder: str | Path | None = None):
        self._groups: dict[tuple, dict[str, Reference]] = {}
        self._fresh: set[tuple] = set()  # groups with steps their file lacks
        self.folder = Path(folder) if folder else None
        self.hits = 0
        self.misses = 0
        self.read = 0  # steps read from files

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def attach(self, folder: str | Path | None) -> None:
        """Back the store with `folder` (None: memory only); groups already in memory stay."""
        self.folder = Path(folder) if folder else None

    def get(
        self,
        runner: "Runner",
        workload: "WorkloadConfig",
        index: int,
        args: Sequence[torch.Tensor],
        host_args: Sequence[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """runner.reference(*args), from the store when this step was computed before. host_args:
        the same inputs on the host, to digest without copying from the device (no sync)."""
        if runner.model.plant_divergence:  # a check of the instruments: never share its model's steps
            return runner.reference(*args)
        m = runner.model
        group = (runner.dev.name, model_key(m.cfg), weights_digest(m), workload)
        steps = self._group(group, runner.dev.torch_device)
        key = f"{index}:{digest(live_inputs(host_args or args)).hex()}"
        ref = steps.get(key)
        if ref is not None:
            self.hits += 1
            return ref
        self.misses += 1
        out, topk = runner.reference(*args)
        ref = steps[key] = Reference(out.clone(), topk.clone())
        self._fresh.add(group)
        return ref

    def flush(self) -> None:
        """Write each group that gained steps to its file (no-op without a folder)."""
        if self.folder is None:
            self._fresh.clear()
            return
        for group in sorted(self._fresh, key=repr):
            steps = {k: (r.out.cpu(), r.topk.cpu()) for k, r in self._groups[group].items()}
            payload = dict(group=repr(group), steps=steps)
            # atomic: another reader sees the old file or the new one
            files.write_with(self._file(group), functools.partial(torch.save, payload))
        self._fresh.clear()

    def _file(self, group):
        return self.folder / f"{hashlib.blake2b(repr(group).encode(), digest_size=12).hexdigest()}.pt"

    def _group(self, group, device):
        steps = self._groups.get(group)
        if steps is None:
            steps = self._groups[group] = self._load(group, device)
        return steps

    def _load(self, group, device):
        if self.folder is None or not self._file(group).exists():
            return {}
        data = torch.load(self._file(group), map_location=device, weights_only=True)
        if data.get("group") != repr(group):  # a digest collision: never trust another group's steps
            return {}
        self.read += len(data["steps"])
        return {k: Reference(*v) for k, v in data["steps"].items()}


def source_digest() -> str:
    """A digest of the engine's and kernels' source (nblib and kernels, every .py file): a file of
    references is read only by the code that wrote it, committed or not."""
    h = hashlib.blake2b(digest_size=8)
    for f in sorted(p for d in (NBLIB, ROOT / "kernels") for p in d.rglob("*.py")):
        h.update(f.relative_to(ROOT).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_SHARED = References()


def shared() -> References:
    """The process's References: every study in one notebook shares it."""
    return _SHARED
