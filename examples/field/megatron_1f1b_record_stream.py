"""Megatron-LM combined 1F1B: `record_stream` inside a CUDA-graph capture holds every freed input until
the capture ends. A memory cost, not a race: the audit finds nothing in either form.

    python -m nblib audit examples/field/megatron_1f1b_record_stream.py:buggy   # exit 0
    python -m nblib audit examples/field/megatron_1f1b_record_stream.py:fixed   # exit 0

Repository: NVIDIA/Megatron-LM. Reference: pull request #4383, "Fix record_stream memory inflation
during CUDA graph capture in combined_1f1b" (closed without merging). Engine:
megatron/core/pipeline_parallel/utils.py, ScheduleNode._forward (free_input: `input.record_stream(
self.stream)` then `input.untyped_storage().resize_(0)`) and stream_acquire_context; which nodes free
their inputs: megatron/core/models/gpt/fine_grained_callables.py, should_free_input (moe_dispatch,
mlp, moe_combine). Buggy: 9985e041a471c42a39aa6144da21f079694c1b65 (main, the pull request's base).
Fixed: the pull request's branch, c8be65180e1af58cd1835abd1a4ab34c05f3bc88 ("fix: CG memory 1f1b using
DeferredReleaseRegistry now") and 643d4a973854dfa9507459b3e770ed1e2d55f48d, never merged.
PyTorch's side: pytorch/pytorch #175560, fixed by pull request #175817 ("[CUDA] Free deferred
record_stream blocks at graph capture end", upstream commit b55e5314fb72f1ea782f72a6c9728a40c12678ea,
cherry-picked as ROCm/pytorch #3241): before it, the deferred blocks were not even returned at capture
end (earlier reports: #155398, #155658).

The ordering. Each schedule node waits on the micro-batch's shared event on its stream (compute or
communication), runs there, and records the event. A node built with free_input then calls
`record_stream(self.stream)` on each input and frees its storage. Outside a capture the allocator
reuses the block once the recorded stream's event has fired; inside a capture events cannot be
queried, so every recorded block stays out of circulation until the capture ends and each freed input
costs a new block. The pull request replaces record_stream + free during capture with a registry: the
tensors are kept with the event and the consuming stream, and freed when a node on the other stream
has waited on that event (so the consumer's work is ordered before any reuse): the same reclamation
point as eager mode. Both orders are race-free; the first holds one more block per freed input.

Sizes: 8 MoE layers of attention (compute stream), dispatch (communication), expert MLP (compute),
combine (communication), 32 tokens of hidden 64. The simulator refuses `resize_` while capturing, so the
free is written `t.data = t.new_empty(0)` (the storage goes at the same host point). `held_bytes` in
examples/field/measure.py reads the allocator's trace of the capture: the buggy form's peak of bytes
held (allocated or waiting on a recorded stream) grows with the layers, the fixed form's does not.
"""

from collections import defaultdict
from contextlib import contextmanager

import _field
import torch

LAYERS, TOKENS, HIDDEN = 8, 32, 64


class DeferredReleaseRegistry:
    """#4383's registry: tensors wait here, keyed by event and consuming stream, until the other stream
    has waited on that event."""

    def __init__(self):
        self.pending = defaultdict(list)

    def defer_release(self, tensors, event, producing_stream):
        self.pending[(id(event), id(producing_stream))].extend(tensors)

    def drain(self, event, waiting_stream):
        for key in [k for k in self.pending if k[0] == id(event) and k[1] != id(waiting_stream)]:
            for t in self.pending.pop(key):
                t.data = t.new_empty(0)  # resize_(0), now that waiting_stream is ordered after the use


class ScheduleNode:
    def __init__(self, plan, fn, stream, free_input):
        self.plan, self.fn, self.stream, self.free_input = plan, fn, stream, free_input

    @contextmanager
    def stream_acquire_context(self):
        plan, dev = self.plan, self.plan.dev
        plan.event.wait(self.stream)
        if plan.deferred and dev.is_current_stream_capturing():
            plan.registry.drain(plan.event, self.stream)
        with dev.stream(self.stream):
            yield
        plan.event.record(self.stream)

    def forward(self, *inputs):
        dev = self.plan.dev
        with self.stream_acquire_context():
            output = self.fn(*inputs)
        if self.free_input:
            if self.plan.deferred and dev.is_current_stream_capturing():
                self.plan.registry.defer_release(list(inputs), self.plan.event, self.stream)
            else:
                for t in inputs:
                    dev.record_stream(t, self.stream)
                    t.data = t.new_empty(0)  # untyped_storage().resize_(0)
        return output


class CombinedOneF1B:
    def __init__(self, dev, deferred):
        p = _field.params(dev)
        self.dev, self.deferred = dev, deferred
        self.x = p(TOKENS, HIDDEN)
        self.w = [[p(HIDDEN, HIDDEN) for _ in range(2)] for _ in range(LAYERS)]
        self.perm = torch.randperm(TOKENS, generator=torch.Generator().manual_seed(3)).to(dev.torch_device)
        self.out = torch.zeros(TOKENS, HIDDEN, device=dev.torch_device)
        self.comm_stream = dev.Stream()
        self.event = dev.Event()
        self.registry = DeferredReleaseRegistry()

    def step(self):
        dev = self.dev
        comp_stream = dev.current_stream()
        self.comm_stream.wait_stream(comp_stream)  # the fork the capture needs
        self.event.record(comp_stream)
        hidden = self.x * 1.0
        for w_attn, w_mlp in self.w:
            attn = ScheduleNode(self, lambda h, w=w_attn: torch.tanh(h @ w) + h, comp_stream, False)
            dispatch = ScheduleNode(self, lambda h: h[self.perm], self.comm_stream, True)
            mlp = ScheduleNode(self, lambda h, w=w_mlp: torch.relu(h @ w), comp_stream, True)
            combine = ScheduleNode(self, lambda h: h[self.perm.argsort()], self.comm_stream, True)
            hidden = combine.forward(mlp.forward(dispatch.forward(attn.forward(hidden))))
        comp_stream.wait_stream(self.comm_stream)
        self.registry.drain(self.event, comp_stream)  # the last combine's inputs, now that comp has joined
        self.out.copy_(hidden)
        return self.out


def buggy(dev):
    """ScheduleNode on main: record_stream + free for each freed input, also inside the capture."""
    return _field.warm(dev, CombinedOneF1B(dev, deferred=False).step)


def fixed(dev):
    """#4383's branch: inside the capture, inputs wait in the registry until the other stream waits."""
    return _field.warm(dev, CombinedOneF1B(dev, deferred=True).step)
