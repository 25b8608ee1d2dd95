"""Eager reference steps, computed once and reused by every configuration that decodes the same
workload on the same weights.

Every step of run_sessions is compared with runner.reference: the eager single-stream step on the
same padded batch. That step never forks, so what it returns depends on the weights and the index
dtype, the step's inputs and the caches' live entries, and on nothing the studies toggle: not the
overlap (eager decode never forks), not the logits policy (where the logits live, not their
values), not the mode, not the replay-timing seed, not an instrument. The caches' live entries are
the run's own writes (prefill from the workload's seed, then the compressor's entries, which come
before the fork and which no race touches), so within a workload they follow from the step's index.

A study that runs one workload on several configurations (the matrix's modes and overlaps, the
protocol's one-knob changes, the designs' arms, the fix's variants) gives their runners one
References (by default the process's, shared()): the first configuration computes each step's
reference, the others compare their own replays with it. The key is the backend, the model's
config (the knobs that do not change the eager step normalised away) and a digest of its weights,
the workload, the step's index and a digest of the step's inputs; a step whose inputs differ is
computed, never looked up.

    runner = Runner(model, buckets, references=references.shared())
"""

import dataclasses
import hashlib
from typing import NamedTuple

import torch

from nblib.engine.model import PAGE

# knobs of ModelConfig that change only what the graph captures, never the eager step's values
GRAPH_ONLY_KNOBS = dict(overlap="off", logits_policy="transient")


class Reference(NamedTuple):
    out: torch.Tensor
    topk: torch.Tensor


def model_key(cfg):
    """The model config with the capture-only knobs fixed: equal keys, equal eager steps."""
    return dataclasses.replace(cfg, **GRAPH_ONLY_KNOBS)


def digest(args):
    """A digest of a step's inputs (tokens, page table, sequence lengths, store slots)."""
    h = hashlib.blake2b(digest_size=16)
    for arg in args:
        t = arg.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.digest()


def live_inputs(args):
    """The step's inputs with the page table cut to the pages its longest request holds: the step
    reads no column past a request's length (the indexer stops at seq_len, the top-k indices stay
    below it, the compressor writes through store_slots), and the rest of a [bs, max_ctx / 64]
    table is most of the bytes a digest would hash."""
    tokens, table, seq_lens, slots = args
    live = -(-int(seq_lens.max()) // PAGE) if seq_lens.numel() else 0
    return tokens, table[:, :live], seq_lens, slots


def weights_digest(model):
    """A digest of the model's weights, computed once per weight set (weights never change after
    they are drawn, and models of the same shapes and seed share one set: DecodeModel.weight_set;
    the caches do change, and their live entries follow from the workload)."""
    ws = model.weight_set
    if ws.digest is None:
        ws.digest = digest([t for v in ws.tensors.values() for t in (v if isinstance(v, list) else [v])])
    return ws.digest


class References:
    """Eager reference steps by (model key, workload, step index, input digest); hits and misses
    counted (a miss computes the step and keeps it)."""

    def __init__(self):
        self._steps: dict[tuple, Reference] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._steps)

    def get(self, runner, workload, index, args, host_args=None):
        """runner.reference(*args), from the store when this step was computed before. host_args:
        the same inputs on the host, to digest without copying from the device (no sync)."""
        if runner.model.plant_divergence:  # a check of the instruments: never share its model's steps
            return runner.reference(*args)
        m = runner.model
        key = (
            runner.dev.name,
            model_key(m.cfg),
            weights_digest(m),
            workload,
            index,
            digest(live_inputs(host_args or args)),
        )
        ref = self._steps.get(key)
        if ref is not None:
            self.hits += 1
            return ref
        self.misses += 1
        out, topk = runner.reference(*args)
        ref = self._steps[key] = Reference(out.clone(), topk.clone())
        return ref


_SHARED = References()


def shared():
    """The process's References: every study in one notebook shares it."""
    return _SHARED
