"""Captured decode graphs, one per batch-size bucket, the way serving engines keep them.

Buckets are captured largest first into one shared graph pool (so smaller buckets reuse the
larger ones' freed blocks, as SGLang and vLLM do); a batch is padded up to its bucket.
Padding rows read page 0, the scratch page, and store into its last slot.
"""

import contextlib
import warnings
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from nblib.core import phases
from nblib.engine.model import PAGE, DecodeModel

__all__ = ["MODES", "SCRATCH_SLOT", "Runner", "StaticBatch", "bucket_for", "check_buckets", "same_bits"]

SCRATCH_SLOT = PAGE - 1  # page 0, last slot: where rows with nothing to store write
MODES = ("graph", "eager")


def bucket_for(bs: int, buckets: Iterable[int]) -> int:
    fits = [b for b in sorted(buckets) if b >= bs]
    if not fits:
        raise ValueError(f"batch of {bs} is larger than the largest bucket {max(buckets)}")
    return fits[0]


def check_buckets(buckets: Iterable[int]) -> list[int]:
    bad = [b for b in buckets if not isinstance(b, int) or b < 1]
    if bad or not buckets:
        raise ValueError(f"buckets must be positive integers, got {buckets!r}")
    return sorted(set(buckets))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bytes (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


class StaticBatch:
    """The fixed input buffers a graph reads: tokens, page table, sequence lengths, store slots."""

    def __init__(self, bucket: int, max_pages: int, device: torch.device):
        self.tokens = torch.zeros(bucket, dtype=torch.long, device=device)
        self.page_table = torch.zeros(bucket, max_pages, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(bucket, dtype=torch.int32, device=device)
        self.store_slots = torch.full((bucket,), SCRATCH_SLOT, dtype=torch.long, device=device)

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tokens, self.page_table, self.seq_lens, self.store_slots

    def fill(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        store_slots: torch.Tensor,
    ) -> None:
        n = len(tokens)
        self.tokens[:n].copy_(tokens)
        self.tokens[n:].zero_()
        self.page_table[:n].copy_(page_table)
        self.page_table[n:].zero_()
        self.seq_lens[:n].copy_(seq_lens)
        self.seq_lens[n:].fill_(1)
        self.store_slots[:n].copy_(store_slots)
        self.store_slots[n:].fill_(SCRATCH_SLOT)


class Runner:
    """mode "graph": replay the bucket's captured graph; mode "eager": run the step eagerly
    on the same padded batch (eager decode never forks streams). references: a
    nblib.engine.references.References shared with other runners of the same workload, so each
    step's eager reference is computed once (None: run_sessions computes every one).

    serial_references: compute each reference by replaying a serial graph of the eager step (no
    fork, its own pool, captured the first time a bucket needs one) instead of running the step
    eagerly. None: on CUDA only, where an eager step's ~150 launches cost the host milliseconds and
    a replay one launch. Each serial graph's first replay is checked bit for bit against the eager
    step on the same inputs (serial_checks); a mismatch turns the runner back to eager references."""

    def __init__(
        self,
        model: DecodeModel,
        buckets: Iterable[int],
        mode: str = "graph",
        references: Any = None,  # References | None; untyped here, as references.py types Runner
        serial_references: bool | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
        self.model, self.dev, self.mode = model, model.dev, mode
        self.buckets = check_buckets(buckets)
        self.max_pages = model.cfg.max_ctx // PAGE
        self.static = {b: StaticBatch(b, self.max_pages, self.dev.torch_device) for b in self.buckets}
        self._reference_static: dict[int, StaticBatch] = {}  # bucket -> the reference's input buffers
        self.graphs: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.references = references
        self.serial_references = self.dev.name == "cuda" if serial_references is None else serial_references
        self._serial: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}  # bucket -> its serial graph
        self.serial_checks: dict[int, bool] = {}  # bucket -> whether its serial graph gave the eager bits

    def capture(
        self, record: Callable[[int], AbstractContextManager[Any]] | None = None, keep_graph: bool = False
    ) -> "Runner":
        """Warm up each bucket eagerly, then capture largest first into one shared pool.
        `record(bucket)`, if given, is a context manager wrapped around each capture (tracing).
        keep_graph: keep CUDA's graph after instantiation, so it can be read back (audit_graph)."""
        if self.mode != "graph":
            return self
        with phases.phase("capture"):
            return self._capture(record, keep_graph)

    def _capture(self, record, keep_graph):
        dev, model = self.dev, self.model
        model.captures = []
        self.pool = dev.graph_pool_handle()
        for b in sorted(self.buckets, reverse=True):
            model.prepare(b)
            st = self.static[b]
            warm = dev.Stream()
            warm.wait_stream(dev.current_stream())
            with dev.stream(warm):
                model.step(*st.args())
            dev.current_stream().wait_stream(warm)
            dev.synchronize()
            g = dev.CUDAGraph(keep_graph=keep_graph)
            model.bucket = b
            with record(b) if record else contextlib.nullcontext(), dev.graph(g, pool=self.pool):
                out, topk = model.step(*st.args())
            model.bucket = None
            self.graphs[b] = (g, out, topk)
        dev.synchronize()
        return self

    def run(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        store_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Decode one step for a batch of len(tokens) requests; returns (out, topk, bucket)."""
        bs = len(tokens)
        b = bucket_for(bs, self.buckets)
        st = self.static[b]
        st.fill(tokens, page_table, seq_lens, store_slots)
        if self.mode == "graph":
            g, out, topk = self.graphs[b]
            g.replay()
        else:
            out, topk = self.model.step(*st.args())
        return out[:bs], topk[:bs], b

    def reference(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        store_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager single-stream step on the same padded batch: what every step must equal."""
        b = bucket_for(len(tokens), self.buckets)
        st = self._reference_static.get(b)
        if st is None:  # the reference's own buffers, apart from the graph's: fill rewrites every entry
            st = self._reference_static[b] = StaticBatch(b, self.max_pages, self.dev.torch_device)
        st.fill(tokens, page_table, seq_lens, store_slots)
        m = self.model
        if not self.serial_references or m.gediff is not None or m.plant_divergence:
            out, topk = m.step(*st.args())  # an instrument's captured work must stay out of the reference
        elif b in self._serial:
            g, out, topk = self._serial[b]
            g.replay()
        else:
            out, topk = self._capture_serial(b, st)
        return out[: len(tokens)], topk[: len(tokens)]

    def _capture_serial(self, b, st):
        """The eager step on st's inputs (it also warms up the capture), then its serial graph,
        replayed once on the same inputs and kept only if it gave the same bits; returns the
        eager step's (out, topk)."""
        dev, model = self.dev, self.model
        with phases.phase("capture"):
            out, topk = model.step(*st.args())
            dev.synchronize()
            g = dev.CUDAGraph()
            with model.serial(), dev.graph(g, pool=dev.graph_pool_handle()):
                g_out, g_topk = model.step(*st.args())
            g.replay()
            same = same_bits(g_out, out) and same_bits(g_topk, topk)
        self.serial_checks[b] = same
        if same:
            self._serial[b] = (g, g_out, g_topk)
        else:
            self.serial_references = False
            warnings.warn(
                f"bucket {b}: the serial graph's step differs from the eager step; "
                "eager references from here on",
                stacklevel=2,
            )
        return out, topk

    def aliases(self) -> list[dict[str, Any]]:
        """Pairs of transients noted during capture that share bytes but are used on different
        streams: the block reuse that lets two graph nodes race."""
        found = []
        notes = self.model.captures
        for i, a in enumerate(notes):
            for b in notes[i + 1 :]:
                if a["bucket"] != b["bucket"] or a["stream"] == b["stream"]:
                    continue
                lo = max(a["addr"], b["addr"])
                hi = min(a["addr"] + a["nbytes"], b["addr"] + b["nbytes"])
                if lo < hi:
                    found.append(
                        dict(
                            bucket=a["bucket"],
                            first=a["tensor"],
                            first_stream=a["stream"],
                            first_addr=hex(a["addr"]),
                            first_nbytes=a["nbytes"],
                            second=b["tensor"],
                            second_stream=b["stream"],
                            second_addr=hex(b["addr"]),
                            second_nbytes=b["nbytes"],
                            shared_bytes=hi - lo,
                        )
                    )
        return found
