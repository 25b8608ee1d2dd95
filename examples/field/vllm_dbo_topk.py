"""vLLM dual-batch overlap, DeepSeek-V4.1: both micro-batches write one model-wide top-k buffer.

    python -m nblib audit examples/field/vllm_dbo_topk.py:buggy   # exit 0: no race to name
    python -m nblib audit examples/field/vllm_dbo_topk.py:fixed   # exit 0

Repository: vllm-project/vllm. Reference: pull request #56476, "[Bugfix][DSv4.1] Isolate sparse index
state across microbatches" (open; related: #56400, and #56440, which repairs input positions and Engram
histories and leaves the sparse-index storage unfixed). Engine: the DeepSeek-V4.1 sparse indexer's
persistent top-k indices and candidate blocks, kept across decoder layers (a source layer writes them,
later consumer layers read them), under DBO (vllm/v1/worker/ubatching.py: make_ubatch_contexts gives
both micro-batches the same compute stream and the same communication stream). Commits: not
recorded: the pull request is open and vllm-project/vllm's history was not read (README.md); the
ordering below is the one the pull request describes ("a source layer in microbatch 1 can overwrite
state before a later consumer layer in microbatch 0 reads it"; the fix allocates the storage per
micro-batch and selects the active micro-batch's view).

The ordering. Under DBO the two micro-batches run in two threads that take turns issuing work, yielding
at each communication point; their compute kernels go to one compute stream and their all-to-alls to one
communication stream, ordered by per-micro-batch events. Micro-batch 0's source layer writes the shared
buffer and yields at its dispatch; micro-batch 1's source layer then overwrites the buffer; when
micro-batch 0 resumes, its consumer layer reads micro-batch 1's indices. Every one of those accesses is
on the compute stream, in issue order: a write-after-write the program orders, not two streams racing.
The capture audit, which names unordered pairs, rightly finds nothing in either form. What sees it is
comparing the micro-batched step with the two micro-batches run one after the other:
`microbatched_vs_serial(dev, spec)` counts the output rows that differ (the buggy form's micro-batch 0
rows; none in the fixed form).
"""

import _field
import torch

from nblib.instruments.audit import target as audit_target

TOKENS, DIM, POSITIONS, TOPK = 4, 16, 64, 8
UBATCHES = 2


class DboIndexedLayers:
    """A source layer (indexer top-k into the persistent buffer) and a consumer layer (attention over the
    selected positions), with the MoE dispatch between them on the communication stream."""

    def __init__(self, dev, per_microbatch):
        p = _field.params(dev)
        self.dev, self.per_microbatch = dev, per_microbatch
        self.x = [p(TOKENS, DIM) for _ in range(UBATCHES)]  # each micro-batch's hidden states
        self.k_cache = p(POSITIONS, DIM)
        self.w_q = p(DIM, DIM)
        shape = (UBATCHES, TOKENS, TOPK) if per_microbatch else (TOKENS, TOPK)
        self.topk_indices = torch.zeros(shape, dtype=torch.long, device=dev.torch_device)
        self.out = [torch.zeros(TOKENS, DIM, device=dev.torch_device) for _ in range(UBATCHES)]
        self.perm = torch.randperm(TOKENS, generator=torch.Generator().manual_seed(4)).to(dev.torch_device)
        self.comm_stream = dev.Stream()

    def buffer(self, ub):
        return self.topk_indices[ub] if self.per_microbatch else self.topk_indices

    def source_layer(self, ub):
        scores = (self.x[ub] @ self.w_q) @ self.k_cache.T
        self.buffer(ub).copy_(scores.topk(TOPK, dim=-1).indices)

    def dispatch(self, ub):
        """The all-to-all on the communication stream; returns the event the compute stream waits on."""
        dev = self.dev
        self.comm_stream.wait_stream(dev.current_stream())
        with dev.stream(self.comm_stream):
            recv = self.x[ub][self.perm]
            done = self.comm_stream.record_event()
        return recv, done

    def consumer_layer(self, ub, recv, done):
        self.dev.current_stream().wait_event(done)
        kv = self.k_cache[self.buffer(ub)]  # tokens, topk, dim
        attn = torch.softmax(torch.einsum("td,tkd->tk", self.x[ub], kv), -1)
        self.out[ub].copy_(torch.einsum("tk,tkd->td", attn, kv) + recv[self.perm.argsort()])

    def step(self):
        """The two micro-batches as DBO interleaves them: each yields at its dispatch."""
        pending = []
        for ub in range(UBATCHES):
            self.source_layer(ub)
            pending.append(self.dispatch(ub))  # yield to the other micro-batch
        for ub in range(UBATCHES):
            self.consumer_layer(ub, *pending[ub])
        self.dev.current_stream().wait_stream(self.comm_stream)
        return self.out

    def serial(self):
        """The same layers, one micro-batch after the other: what the step must compute."""
        for ub in range(UBATCHES):
            self.source_layer(ub)
            self.consumer_layer(ub, *self.dispatch(ub))
        self.dev.current_stream().wait_stream(self.comm_stream)
        return self.out


def buggy(dev):
    """Before #56476: one model-wide buffer written by both micro-batches."""
    return _field.warm(dev, DboIndexedLayers(dev, per_microbatch=False).step)


def fixed(dev):
    """#56476: one buffer per micro-batch."""
    return _field.warm(dev, DboIndexedLayers(dev, per_microbatch=True).step)


def microbatched_vs_serial(dev, spec):
    """Rows of the step's outputs that differ from the serial run's, both run eagerly on `dev`."""
    step = audit_target.load(spec).fn(dev)
    layers = step.__self__
    got = [t.clone() for t in step()]
    want = layers.serial()
    return int(sum((~torch.isclose(g, w).all(-1)).sum() for g, w in zip(got, want)))
