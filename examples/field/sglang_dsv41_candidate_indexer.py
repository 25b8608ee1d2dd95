"""SGLang DeepSeek-V4.1 candidate indexer: side-stream tensors read on main carry no `record_stream`.

    python -m nblib audit examples/field/sglang_dsv41_candidate_indexer.py:buggy   # exit 0 (latent)
    python -m nblib audit examples/field/sglang_dsv41_candidate_indexer.py:fixed   # exit 0

Repository: sgl-project/sglang. Reference: pull request #39671, "dsv4.1: candidate indexer library"
(merged), and its review (BBuf, "record_stream is applied in one direction only"). Engine:
python/sglang/srt/layers/attention/dsv4/candidate_indexer_deep_gemm.py,
DeepGemmCandidateIndexer.publish_decode and select_decode. Buggy: the revision the review read, in which
`publish_decode` records `logits` (made on main, read on the side stream) on `alt_stream` but not the
tensors it allocates inside `with torch.cuda.stream(self.alt_stream)` (`blocks`, `schedule`,
`phys_blocks`, `row_valid_lens`), which `select_decode` reads on the main stream. The review quotes that
code; the revision itself was a commit on the pull request's branch before it merged, its id not
recorded. Fixed: every stored version of the file, e.g. at commit
097df40dc4346e7332083e06d7530f35bcf10513, loops `t.record_stream(main_stream)` over those four tensors
("select_decode reads these on the main stream"): the fix landed in the pull request before it merged.

The ordering. The publishing layer computes dense `logits` on main; `alt_stream.wait_stream(main)`;
`logits.record_stream(alt_stream)`; main runs the layer's own top-k; on the side stream the block
selection allocates and writes `nblocks, row_valid_lens` (candidate_row_lens), `blocks`
(amax_topk_blocks, then sorted in place), `phys_blocks` (the blocks as pool pages) and `schedule`
(DeepGEMM's schedule metadata), then records `ready`. Each consumer layer makes main wait on `ready` and
reads `schedule` and `blocks` (sparse_logits) and `phys_blocks` and `valid_lens` (topk_transform_sparse)
on main. The table lives on the forward metadata and is dropped after the last consumer: its blocks go
back to the side stream's free list with main's reads not recorded. As the review says, in the engine's
steady-state loop the next `publish_decode` opens with `alt_stream.wait_stream(current_stream)`, which
orders every later side-stream use of those bytes after main's reads: the missing `record_stream` is a
broken allocator contract, not a race in this ordering.

The targets capture two forwards (one publishing layer and two consumer layers each), so the second
publish's side-stream tensors do reuse the first table's freed blocks in the buggy form. The audit finds
no race in either form, as it should: the reuse is ordered by the second publish's `wait_stream`. What
the fix changes is where the blocks go: with `record_stream(main)` the allocator holds them until the
capture ends (the cost docs/audit.md describes), so the second table gets fresh bytes.
"""

from dataclasses import dataclass

import _field
import torch

ROWS, DIM = 4, 16  # decode rows, index-head dim
POSITIONS, BLOCK = 64, 8  # compressed positions visible to every row, positions per candidate block
TOPK_BLOCKS, TOPK = 4, 8  # published blocks per row, top-k per layer
CONSUMERS, FORWARDS = 2, 2


@dataclass
class SparseBlockTable:
    blocks: torch.Tensor
    schedule: torch.Tensor
    phys_blocks: torch.Tensor
    valid_lens: torch.Tensor
    ready: object  # the event recorded on the side stream once the fields above are complete


class CandidateIndexer:
    def __init__(self, dev, record_both_ways):
        p = _field.params(dev)
        self.dev, self.record_both_ways = dev, record_both_ways
        self.k_cache = p(POSITIONS, DIM)  # the index-K pool
        self.q = [p(ROWS, DIM) for _ in range(1 + CONSUMERS)]  # the layers' index queries
        self.weights = p(ROWS, 1)
        self.seq_lens = torch.full((ROWS,), POSITIONS, dtype=torch.int32, device=dev.torch_device)
        self.page_table = torch.randperm(POSITIONS // BLOCK, generator=torch.Generator().manual_seed(1))
        self.page_table = self.page_table.to(dev.torch_device)
        self.page_indices = [
            torch.zeros(ROWS, TOPK, dtype=torch.long, device=dev.torch_device) for _ in range(1 + CONSUMERS)
        ]
        self.alt_stream = dev.Stream()

    def publish_decode(self, q, page_indices):
        dev = self.dev
        logits = (q @ self.k_cache.T) * self.weights  # dense logits, on main
        main_stream = dev.current_stream()
        self.alt_stream.wait_stream(main_stream)
        dev.record_stream(logits, self.alt_stream)  # the block selection reads logits after main moves on
        page_indices.copy_(logits.topk(TOPK, dim=-1).indices)  # the publishing layer's own top-k
        with dev.stream(self.alt_stream):
            nblocks = torch.clamp(self.seq_lens // BLOCK, max=TOPK_BLOCKS)
            row_valid_lens = nblocks * BLOCK
            blocks = logits.view(ROWS, -1, BLOCK).amax(-1).topk(TOPK_BLOCKS, dim=-1).indices
            blocks = blocks.sort(dim=-1).values  # ascending block ids
            phys_blocks = self.page_table[blocks]  # the blocks as pool pages
            schedule = torch.cumsum(row_valid_lens, 0).to(torch.int32)  # the sparse kernel's row offsets
            if self.record_both_ways:  # select_decode reads these on the main stream
                for t in (blocks, schedule, phys_blocks, row_valid_lens):
                    dev.record_stream(t, main_stream)
            ready = self.alt_stream.record_event()
        return SparseBlockTable(blocks, schedule, phys_blocks, row_valid_lens, ready)

    def select_decode(self, table, q, page_indices):
        dev = self.dev
        dev.current_stream().wait_event(table.ready)
        # sparse_logits: score only the published blocks (reads schedule and blocks)
        k = self.k_cache.view(-1, BLOCK, DIM)[table.blocks]  # rows, blocks, positions, dim
        logits = torch.einsum("rd,rbpd->rbp", q, k).flatten(1) * self.weights
        starts = torch.cat([table.schedule.new_zeros(1), table.schedule[:-1]])
        width = (table.schedule - starts)[:, None]
        logits = logits.masked_fill(torch.arange(logits.shape[1], device=logits.device) >= width, -1e9)
        # topk_transform_sparse: column j of a sparse row is slot phys_blocks[j // 8] * 8 + j % 8
        j = logits.topk(TOPK, dim=-1).indices
        live = j < table.valid_lens[:, None]
        slots = table.phys_blocks.gather(1, j // BLOCK) * BLOCK + j % BLOCK
        page_indices.copy_(torch.where(live, slots, -1))

    def forward(self):
        table = self.publish_decode(self.q[0], self.page_indices[0])
        for layer in range(CONSUMERS):
            self.select_decode(table, self.q[1 + layer], self.page_indices[1 + layer])
        del table  # the forward's metadata goes away: the table's blocks return to the side stream

    def step(self):
        for _ in range(FORWARDS):
            self.forward()
        return self.page_indices


def buggy(dev):
    """#39671 as reviewed: only `logits` is recorded (on the side stream)."""
    return _field.warm(dev, CandidateIndexer(dev, record_both_ways=False).step)


def fixed(dev):
    """#39671 as merged: the side-stream tensors main reads are recorded on main too."""
    return _field.warm(dev, CandidateIndexer(dev, record_both_ways=True).step)
