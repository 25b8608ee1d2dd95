"""The engine assembled from a profile's plain values: one place that every study and
instrument builds through, so none of them spells the assembly out by hand.

    m = build.model(dev, profile["model"], index_dtype="bf16", overlap="on")
    run = build.bucket_run(runner, profile["workload"], bucket=8)   # run.result, run.counts
    batch = build.full_batch(m, bucket=8)                           # runner.run(*batch)
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from nblib.core import phases
from nblib.engine.model import PAGE, DecodeModel, ModelConfig
from nblib.engine.runner import Runner
from nblib.engine.workload import Instrument, WorkloadConfig, in_bucket, run_sessions

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["Batch", "BucketRun", "bucket_run", "full_batch", "model"]


def model(dev: "Device", shapes: Mapping[str, Any], **knobs: Any) -> DecodeModel:
    """A DecodeModel from a profile's `model` dict (shapes) and the knobs (index_dtype, overlap,
    logits_policy); ModelConfig checks both and fails in one line on a bad value."""
    cfg = ModelConfig(**shapes, **knobs)
    with phases.phase("setup"):
        return DecodeModel(cfg, dev)


class BucketRun(NamedTuple):
    result: dict[str, Any]  # run_sessions' verdicts over every step, tail included
    counts: dict[str, int]  # in_bucket: the sessions and steps replayed in this bucket's graph only


def bucket_run(
    runner: Runner,
    workload: Mapping[str, Any],
    bucket: int,
    instruments: Sequence[Instrument] = (),
    **overrides: Any,
) -> BucketRun:
    """The workload (a profile's dict, plus overrides such as seed or sessions) with at most `bucket`
    sessions decoding together; counts are the steps this bucket's graph replayed (the tail's
    smaller buckets excluded: see in_bucket)."""
    w = WorkloadConfig(**{**workload, **overrides, "concurrency": bucket})
    r = run_sessions(runner, w, instruments)
    return BucketRun(r, in_bucket(r, bucket))


class Batch(NamedTuple):
    """One step's inputs, in runner.run's order (so runner.run(*batch) works)."""

    tokens: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    store_slots: torch.Tensor

    def step(self, index: int = 0) -> dict[str, Any]:
        """The step record run_sessions hands its instruments (live_pages left to the canary)."""
        bs = len(self.tokens)
        return dict(index=index, bs=bs, bucket=bs, **self._asdict())


def full_batch(m: DecodeModel, bucket: int, seed: int = 0, ctx: int | None = None) -> Batch:
    """A full bucket of requests of `ctx` entries each (default: half the longest context), on
    distinct pages, prefilled; fewer entries when the cache cannot hold them all."""
    per = ctx or m.cfg.max_ctx // 2
    npages = -(-per // PAGE)
    if 1 + bucket * npages > m.cfg.num_pages:
        npages = max(1, (m.cfg.num_pages - 1) // bucket)
        per = npages * PAGE - 1
    d = m.dev.torch_device
    table = torch.zeros(bucket, m.cfg.max_ctx // PAGE, dtype=torch.int32)
    table[:, :npages] = torch.arange(1, 1 + bucket * npages, dtype=torch.int32).view(bucket, npages)
    m.prefill_entries(
        torch.arange(PAGE, PAGE * (1 + bucket * npages), device=d),
        torch.Generator(device=d).manual_seed(seed),
    )
    lens = torch.full((bucket,), per, dtype=torch.int32)
    stores = table[:, (per - 1) // PAGE].long() * PAGE + (per - 1) % PAGE
    tokens = torch.arange(bucket) * 7 % m.cfg.vocab
    return Batch(*(x.to(d) for x in (tokens, table, lens, stores)))
