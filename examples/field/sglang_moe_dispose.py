"""SGLang dual-stream MoE: `dispose_tensor` empties hidden states the shared expert reads on the side stream.

    python -m nblib audit examples/field/sglang_moe_dispose.py:null_pointer   # exit 2: the op refuses it
    python -m nblib audit examples/field/sglang_moe_dispose.py:buggy          # exit 1: write-after-read
    python -m nblib audit examples/field/sglang_moe_dispose.py:fixed          # exit 0

Repository: sgl-project/sglang. Engine: python/sglang/srt/models/deepseek_v2.py,
DeepseekV2MoE.forward_normal_dual_stream (capture mode, num_fused_shared_experts == 0, e.g. Kimi-K2.5
NVFP4); python/sglang/srt/layers/moe/moe_runner/deep_gemm.py, pre_permute_standard_to_deep_gemm, which
calls python/sglang/srt/utils/common.py dispose_tensor(hidden_states): `x.set_(torch.empty((0,)))`. The
commits below were read in a snapshot of HYGON-AI/sglang-das, a fork that merges sgl-project/sglang's
main (sgl-project/sglang's own history was not read), as the fork carries them: committed
by GitHub, titled with the upstream pull request numbers.
- #29142, "Run routed experts on main stream in dual-stream MoE", 999199f9ff4bae422b97f20ca9c0e6a9c14f6cfc
  (reverted by #29452, 7b02eab7a6885cc9fec99a894f190d8702e6e533): routed experts on main first, then the
  shared expert on the side stream reading `hidden_states` after the routed deep_gemm pre-permute has
  disposed of it: the kernel's pointer is captured as null (gsm8k fell from ~0.7 to 0.005). Target
  `null_pointer`.
- #29463, "Reland: run routed experts on main stream in dual-stream MoE",
  6bdecb8206b8d066e9cfb4ed6032e5a1e9b14340: the shared expert is launched on the side stream first, then
  the routed experts on main, whose pre-permute still disposes of `hidden_states` before
  `current_stream.wait_stream(alt_stream)`. Target `buggy`.
- #30460, "Reorder dual-stream MoE to main-first to avoid CUDA graph stream explosion",
  87992eeec4072995e8fa98fb2d0f3a7e5e581f2d (after #30025, 6ce02b95ad9daeb476d4c1c84dde3c4b8ce735ff, the same
  reorder for the DSA indexer): main first again, with `dispose_tensor` a no-op while a graph is being
  captured ("so the routed deep_gemm does not free hidden_states, which the shared expert reads on the
  alt stream"). Target `fixed`.

The ordering. #29463 describes its own fix as "not a cross-stream race": #29142's failure was a
host-side mutation between two kernel launches. The transcription of #29463's order shows what that
order leaves: the side stream's shared expert reads `hidden_states`, then on main the router and the
routed experts' pre-permute gather it into a permuted copy and dispose of it. dispose_tensor replaces
the storage of the tensor object every caller holds, so the block returns to main's free list while the
side stream may still be reading it, and the routed experts' next main-stream allocations (the
post-permute output has `hidden_states`' shape) can take those bytes before main joins the side stream.
That is the freed-block reuse case, and #30460's disabling of dispose_tensor during capture removes it:
the block stays allocated until the layer's reference dies after the join.

The simulator refuses `set_` while capturing, so dispose_tensor is written
`x.data = x.new_empty(0)`: the same swap of the storage every holder of the tensor object sees, at the
same host point. Sizes are small: 8 tokens, hidden 64, 4 routed experts of top 2, one shared expert.
"""

import _field
import torch

TOKENS, HIDDEN, FFN, EXPERTS, TOPK = 8, 64, 128, 4, 2


class DualStreamMoE:
    def __init__(self, dev, order, dispose_in_capture):
        p = _field.params(dev)
        self.dev, self.order, self.dispose_in_capture = dev, order, dispose_in_capture
        self.x = p(TOKENS, HIDDEN)  # the layer's input, a static buffer the runner fills
        self.norm_w = p(HIDDEN)
        self.w_gate = p(HIDDEN, EXPERTS)
        self.w13, self.w2 = p(EXPERTS, HIDDEN, 2 * FFN), p(EXPERTS, FFN, HIDDEN)  # routed experts
        self.s13, self.s2 = p(HIDDEN, 2 * FFN), p(FFN, HIDDEN)  # the shared expert
        self.out = torch.zeros(TOKENS, HIDDEN, device=dev.torch_device)
        self.alt_stream = dev.Stream()

    def dispose_tensor(self, x):
        if not self.dispose_in_capture and self.dev.is_current_stream_capturing():
            return  # #30460: disabled while a graph is being captured
        x.data = x.new_empty(0)  # x.set_(torch.empty((0,))): the storage every holder sees is released

    def shared_experts(self, h):
        gate, up = (h @ self.s13).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ self.s2

    def routed_experts(self, hidden_states, topk_ids, topk_weights):
        shape = hidden_states.shape
        # pre_permute_standard_to_deep_gemm: gather the tokens per expert, then dispose of the input
        order = topk_ids.flatten().argsort()
        permuted = hidden_states[order // TOPK]
        self.dispose_tensor(hidden_states)
        expert = topk_ids.flatten()[order]
        gate, up = torch.bmm(permuted[:, None], self.w13[expert])[:, 0].chunk(2, dim=-1)
        down = torch.bmm((torch.nn.functional.silu(gate) * up)[:, None], self.w2[expert])[:, 0]
        # post-permute: scatter back into an output of the input's shape
        output = torch.zeros(shape, device=down.device)
        output.index_add_(0, order // TOPK, down * topk_weights.flatten()[order][:, None])
        return output

    def route(self, hidden_states):
        router_logits = hidden_states @ self.w_gate
        topk_weights, topk_ids = router_logits.softmax(-1).topk(TOPK, dim=-1)
        return self.routed_experts(hidden_states, topk_ids, topk_weights)

    def forward_normal_dual_stream(self, hidden_states):
        dev = self.dev
        current_stream = dev.current_stream()
        self.alt_stream.wait_stream(current_stream)
        if self.order == "alt_first":  # #29463
            with dev.stream(self.alt_stream):
                shared_output = self.shared_experts(hidden_states)
            final_hidden_states = self.route(hidden_states)
        else:  # main first: #29142, and #30460 with dispose_tensor off while capturing
            final_hidden_states = self.route(hidden_states)
            with dev.stream(self.alt_stream):
                shared_output = self.shared_experts(hidden_states)
        current_stream.wait_stream(self.alt_stream)
        return final_hidden_states + shared_output

    def forward_normal(self, hidden_states):
        shared_output = self.shared_experts(hidden_states)
        return self.route(hidden_states) + shared_output

    def step(self):
        xf = self.x
        hidden_states = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_w
        if self.dev.is_current_stream_capturing():  # the dual-stream path is taken in capture mode only
            self.out.copy_(self.forward_normal_dual_stream(hidden_states))
        else:
            self.out.copy_(self.forward_normal(hidden_states))
        return self.out


def null_pointer(dev):
    """#29142: main first, the shared expert then reads the disposed (emptied) hidden states."""
    return _field.warm(dev, DualStreamMoE(dev, "main_first", dispose_in_capture=True).step)


def buggy(dev):
    """#29463: the shared expert first on the side stream; the routed pre-permute disposes before the join."""
    return _field.warm(dev, DualStreamMoE(dev, "alt_first", dispose_in_capture=True).step)


def fixed(dev):
    """#30460: main first, dispose_tensor disabled while capturing."""
    return _field.warm(dev, DualStreamMoE(dev, "main_first", dispose_in_capture=False).step)
