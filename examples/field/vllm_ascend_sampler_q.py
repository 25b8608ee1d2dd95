"""vLLM-Ascend sampler: `q` is made on the global stream, read on the current one after only `wait_stream`.

    python -m nblib audit examples/field/vllm_ascend_sampler_q.py:buggy   # exit 1: write-after-read on q
    python -m nblib audit examples/field/vllm_ascend_sampler_q.py:fixed   # exit 0

Repository: vllm-project/vllm-ascend. Reference: pull request #13394, "[BugFix][Sampler] Fix inf in
Qwen30b RL sampling by recording stream for q" (merged on main), with the same one-line fix opened
against each release branch: #13396 to #13406 (among them #13400 for releases/v0.20.2rc, #13404 for
releases/v0.25.1rc, #13406 for releases/v0.13.0). Engine: vllm_ascend/sample/sampler.py,
random_sample(). Buggy: 0703581e8d530d2ae8079a740ec70843883add5f (the parent of the fix on main).
Fixed: fc0ce85b58f019e5a1988dbd3f39d014052fb44b (adds `q.record_stream(torch.npu.current_stream())`).

The ordering. `random_sample` switches to `global_stream()`, allocates `q = torch.empty_like(probs)`
there and fills it with `exponential_()`; back on the current stream it calls
`current_stream().wait_stream(global_stream())` and returns `probs.div_(q).argmax(...)`. The wait orders
the division after the fill, but the allocator only knows that `q`'s block belongs to the global stream:
when `q` dies on return, the block is free for the global stream's next allocation, and nothing makes
the global stream wait for the current stream's division. The next decode step's `q` is made on the
global stream in the same block and its multi-kernel `exponential_` overwrites the bytes the previous
division may still be reading (on Ascend a transient negative value, then `0 / -q` wins the argmax and
an out-of-vocabulary id is sampled). The fix records `q` on the current stream before returning.

Sampling runs outside the engine's graphs and the race spans two decode steps, so the target captures
two consecutive `random_sample` calls in one graph, with one fork of the global stream from the
capturing stream at the start standing in for the streams' common past (the engine's global stream
never waits on the current stream). The per-request-generator branch is left out: it writes rows of the
same `q` on the same stream.
"""

import _field
import torch

ROWS, VOCAB, STEPS = 4, 256, 2


class Sampler:
    def __init__(self, dev, record_q):
        p = _field.params(dev)
        self.dev, self.record_q = dev, record_q
        self.probs = [p(ROWS, VOCAB).softmax(-1) for _ in range(STEPS)]  # each step's probabilities
        self.sampled = [torch.zeros(ROWS, dtype=torch.long, device=dev.torch_device) for _ in range(STEPS)]
        self.global_stream = dev.Stream()

    def random_sample(self, probs):
        dev = self.dev
        with dev.stream(self.global_stream):
            q = torch.empty_like(probs)
            q.exponential_()
        dev.current_stream().wait_stream(self.global_stream)
        if self.record_q:
            dev.record_stream(q, dev.current_stream())  # q's block waits for the division below
        return probs.div_(q).argmax(dim=-1).view(-1)

    def step(self):
        self.global_stream.wait_stream(self.dev.current_stream())  # the fork the capture needs
        for probs, out in zip(self.probs, self.sampled):
            out.copy_(self.random_sample(probs))
        return self.sampled


def buggy(dev):
    """random_sample before #13394: wait_stream only."""
    return _field.warm(dev, Sampler(dev, record_q=False).step)


def fixed(dev):
    """random_sample after #13394: q recorded on the consuming stream."""
    return _field.warm(dev, Sampler(dev, record_q=True).step)
