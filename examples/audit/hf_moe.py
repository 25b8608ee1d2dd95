"""A Hugging Face transformers MoE decoder with its shared expert on a side stream, as audit targets.

    python -m nblib audit examples/audit/hf_moe.py:qwen2_moe                   # the race: exit 1
    python -m nblib audit examples/audit/hf_moe.py:qwen2_moe_record_stream     # fixed: exit 0
    python -m nblib audit examples/audit/hf_moe.py:qwen2_moe_hold_until_join   # fixed: exit 0
    (the same three for deepseek_v3; add --backend sim to run on the CPU simulator)

The model is the library's own (transformers' Qwen2MoeForCausalLM or DeepseekV3ForCausalLM, built
from a small config with random weights, no download); the experts run its "batched_mm" experts
implementation, which has no data-dependent branch, so a decode step captures. The one thing added
here is the overlap engines add to MoE layers (SGLang's dual-stream MoE does the same): each decoder
layer's forward is replaced by `SharedExpertOverlap.forward`, which forks the shared expert onto a
side stream while the main stream runs the router and the routed experts, and joins before the sum.

The race, in the form a first version of such a wrapper takes: the side stream reads the normed
hidden states, a tensor the main stream allocated; the name `hidden_states` is then rebound to the
routed experts' output, which drops the normed states' last reference before main waits on the side
stream, and main's next tensor (the residual add, the same size) may get those bytes while the
shared expert still reads them. Two fixes: dev.record_stream(normed, side) (the allocator keeps the
block until the side stream's work is done), or holding the normed states until after the join.

The decode step is one token per sequence against a StaticCache (HF's cache for CUDA graphs), with
explicit position ids and cache position, so the step has no host synchronisation. Each target takes
the device facade `dev` (nblib.backends.device), so the same code runs on CUDA and on the simulator.
"""

import torch

from nblib.instruments.probes import probe

FORMS = ("buggy", "record_stream", "hold_until_join")
BATCH, CACHE_LEN, POSITION = 4, 32, 7
SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
SMALL.update(num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")


def qwen2_moe_config():
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **SMALL,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        experts_implementation="batched_mm",
    )


def deepseek_v3_config():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **{**SMALL, "num_key_value_heads": 4},  # MLA: one key per head (its StaticCache's shape)
        intermediate_size=128,
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=0,  # every layer an MoE layer
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        experts_implementation="batched_mm",
    )


CONFIGS = {"qwen2_moe": qwen2_moe_config, "deepseek_v3": deepseek_v3_config}


def shared_expert(mlp, x):
    """The library's shared expert, as its MoE block computes it."""
    if hasattr(mlp, "shared_expert_gate"):  # Qwen2-MoE: one gated shared expert
        return torch.sigmoid(mlp.shared_expert_gate(x)) * mlp.shared_expert(x)
    return mlp.shared_experts(x)  # DeepSeek-V3


def routed_experts(mlp, x):
    """The library's router and routed experts, as its MoE block calls them."""
    flat = x.view(-1, x.shape[-1])
    _, weights, indices = mlp.gate(flat)
    return mlp.experts(flat, indices, weights).view(x.shape)


class SharedExpertOverlap:
    """One decoder layer's forward with the shared expert on a side stream; `form` picks the race
    ("buggy") or one of its fixes. Everything it calls is the library's module."""

    def __init__(self, layer, dev, side, form, name="layer"):
        self.layer, self.dev, self.side, self.form, self.name = layer, dev, side, form, name

    def forward(self, hidden_states, **kwargs):
        layer, dev, side = self.layer, self.dev, self.side
        residual = hidden_states
        hidden_states = layer.input_layernorm(hidden_states)
        hidden_states, _ = layer.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = layer.post_attention_layernorm(hidden_states)  # made on main

        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            probe(f"{self.name}.shared_expert.in", hidden_states)  # a no-op unless a differential runs
            shared = shared_expert(layer.mlp, hidden_states)  # the side stream reads the normed states
        held = None
        if self.form == "record_stream":
            dev.record_stream(hidden_states, side)  # the allocator waits for side before reusing it
        elif self.form == "hold_until_join":
            held = hidden_states  # a reference kept past the join
        hidden_states = routed_experts(layer.mlp, hidden_states)  # rebound: the normed states' last name
        hidden_states = residual + hidden_states  # main's next tensor, the normed states' size
        main.wait_stream(side)
        del held
        return hidden_states + shared


class DecodeStep:
    """The model with the overlap patched into every decoder layer, its StaticCache and the static
    inputs a graph runner fills before each replay; calling it runs one decode step."""

    def __init__(self, dev, model="qwen2_moe", form="buggy", cache=True, dtype=torch.float32, seed=0):
        from transformers import StaticCache
        from transformers.models.auto.modeling_auto import AutoModelForCausalLM

        if model not in CONFIGS or form not in FORMS:
            raise ValueError(f"model must be one of {', '.join(CONFIGS)} and form one of {', '.join(FORMS)}")
        self.__qualname__ = f"DecodeStep({model}, {form})"  # how a capture failure names the step
        torch.manual_seed(seed)
        cfg = CONFIGS[model]()
        self.model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(dev.torch_device).eval()
        self.side = dev.Stream()
        for i, layer in enumerate(self.model.model.layers):
            layer.forward = SharedExpertOverlap(layer, dev, self.side, form, f"layer{i}").forward
        self.cache = StaticCache(config=cfg, max_cache_len=CACHE_LEN) if cache else None
        on = dict(device=dev.torch_device)
        self.input_ids = torch.randint(0, cfg.vocab_size, (BATCH, 1), **on)
        self.position_ids = torch.full((BATCH, 1), POSITION, **on)
        self.cache_position = torch.tensor([POSITION], **on)

    def rewind(self):
        """Put the cache's write position back to POSITION: HF's StaticCache keeps it in a tensor that
        every step (and so every replay) advances, as a decode loop would."""
        for layer in self.cache.layers if self.cache is not None else ():
            layer.cumulative_length.fill_(POSITION)

    @torch.no_grad()
    def __call__(self):
        out = self.model(
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            cache_position=self.cache_position,
            cache=self.cache,
            use_cache=self.cache is not None,
        )
        return out.logits


def build(dev, model, form, cache=True):
    """The step, warmed up once eagerly (the cache's lazy allocation and the libraries' first calls
    happen here, not inside the capture)."""
    step = DecodeStep(dev, model, form, cache)
    step()
    dev.synchronize()
    step.rewind()
    return step


def qwen2_moe(dev):
    return build(dev, "qwen2_moe", "buggy")


def qwen2_moe_record_stream(dev):
    return build(dev, "qwen2_moe", "record_stream")


def qwen2_moe_hold_until_join(dev):
    return build(dev, "qwen2_moe", "hold_until_join")


def deepseek_v3(dev):
    return build(dev, "deepseek_v3", "buggy")


def deepseek_v3_record_stream(dev):
    return build(dev, "deepseek_v3", "record_stream")


def deepseek_v3_hold_until_join(dev):
    return build(dev, "deepseek_v3", "hold_until_join")


def qwen2_moe_no_cache(dev):
    """The step without a cache. transformers then checks, on the host, whether the position ids
    pack several sequences, unless torch.cuda.is_current_stream_capturing() says a capture is on."""
    return build(dev, "qwen2_moe", "buggy", cache=False)
