"""The stream ordering of SGLang's DeepSeek-V4 attention prepare path, as a capture-audit target.

    python -m nblib audit examples/audit/dsv4_attention.py:fused     # fused q/kv projection on
    python -m nblib audit examples/audit/dsv4_attention.py:unfused   # off

THIS IS A MODEL OF THE ENGINE'S ORDERING, NOT THE ENGINE. Every kernel is a plain torch op of the
same role (a projection, a norm, a rope, a cache write, a top-k) at small sizes; no SGLang code, no
FlashMLA, DeepGEMM or fused JIT kernel runs here. What is kept is what decides a cross-stream race
in a captured graph: which tensor is made on which stream, which stream waits on which event or
stream, and where the last Python reference to a tensor is dropped. Allocation sizes are the
engine's roles scaled down (DeepSeekV4Config's defaults / 16), so whether the caching allocator
hands a freed block to a later tensor here says nothing certain about the engine's own sizes.

Transcribed from sgl-project/sglang (github.com/sgl-project/sglang):
- python/sglang/srt/models/deepseek_v4.py at commit 000328a8cd54dd3aac97cd9977c39b5408034b26:
  MQALayer._forward_prepare_multi_stream, _compute_q_a, _compute_q_b, _compute_kv_to_cache, and the
  part of MQALayer.forward around them (the multi-stream path is taken only while capturing, for
  batches up to 64 tokens, 128 on Blackwell);
- python/sglang/srt/layers/attention/dsv4/indexer.py at commit 00509fc37435a43a8b44aa0d942c980298a2d20c:
  C4IndexerBackendMixin._forward_prepare_multi_stream and forward_c4_indexer (the indexer's own fan-out);
- python/sglang/srt/configs/deepseek_v4.py at commit 008b79d2358b08adf9b6c879625030f890c8c4e2: the
  default sizes scaled here.

What the source shows (and this file reproduces, step by step; `main` is the capturing stream):
  1. stream_kv, stream_compressor, stream_indexer (alt_streams[0..2]) each wait_stream(main).
  2. fused projection on (SGLANG_OPT_FUSE_WQA_WKV): qkv_a = wqkv_a(x) is made ON MAIN, and
     qkv_a_ready = main.record_event().
  3. q_lora = q_norm(qkv_a[..., :q_lora_rank]) (fused) or q_norm(wq_a(x)), on main;
     q_lora_ready = main.record_event().
  4. on stream_indexer: the indexer. Its own fan-out (alt_streams[3..4]): stream_q and
     stream_weights wait_stream(stream_indexer); the indexer's compressor runs on stream_indexer;
     weights = compute_weights(x) on stream_weights, then weights_ready recorded there; stream_q
     waits q_lora_ready and weights_ready and computes the indexer query (reading q_lora, made on
     main) and rescales weights; stream_indexer wait_stream(stream_q) (stream_weights is joined only
     through stream_q's wait on weights_ready); then logits and top-k on stream_indexer write the
     sparse page indices the attention reads.
  5. on stream_kv: wait_event(qkv_a_ready) when fused, then kv = qkv_a[..., q_lora_rank:] (fused:
     a view of main's qkv_a, READ ON stream_kv) or wkv(x) (unfused: made on stream_kv), normed,
     roped and written to the SWA cache in one fused kernel.
  6. `del qkv_a` ON THE HOST, before main waits on stream_kv: with the fused projection on, this
     drops the last reference to a block allocated on main while stream_kv may still be reading
     it; the caching allocator may hand those bytes to main's next tensor. Unfused, qkv_a is None.
  7. on stream_compressor: the compressor (reads x, writes the compressed cache).
  8. q = _compute_q_b(q_lora) on main: wq_b(q_lora), then q_out = empty_like(q) and one fused
     norm + rope kernel writing q_out (tensor-parallel size 1: no q_out is passed in).
  9. main wait_stream(stream_kv), wait_stream(stream_compressor), wait_stream(stream_indexer).
  Then (MQALayer.forward) attention on main reads q, the SWA and compressed caches and the sparse
  indices; the output projection follows.
The snapshot matches the ordering this file was asked to model. One difference from the older
revision at commit f8101ac7db91793fa174f5a5c710b58445f040aa: there the KV stream made a bf16 kv
tensor (kv_norm of the qkv_a slice) and returned it to main instead of writing the cache in the
same kernel; the qkv_a ordering (made on main, read on stream_kv, `del qkv_a` before the join) is
the same in both.

In the audit's report the streams are named in the order they first join the capture: main, then
side (stream_kv), side2 (stream_compressor), side3 (stream_indexer), side4 (stream_q), side5
(stream_weights). On the simulator, `fused` reports a write-after-read: stream_kv reading qkv_a
(freed at `del qkv_a`) against main's wq_b output in compute_q_b, which was handed qkv_a's bytes;
`unfused` is clean (tests/test_audit_cli.py). On CUDA the same verdicts are expected;
scripts/gpu_audit_cli.sh measures them.
"""

import torch

# DeepSeekV4Config's defaults / 16 (hidden 4096, q_lora_rank 1024, head_dim 448 + 64, 64 heads,
# indexer 64 heads of 128), and a decode batch of 8 tokens.
TOKENS = 8
HIDDEN = 256
Q_LORA = 64
HEAD_DIM = 32
ROPE = 4
HEADS = 4
INDEX_HEADS = 4
INDEX_DIM = 8
TOPK = 8
SLOTS = 64  # SWA cache, compressed cache and index-K cache entries
EPS = 1e-6
DTYPE = torch.bfloat16


def rms_norm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight


def rope(x, cos, sin):
    """The rotary part of the last ROPE dims (a stand-in of the engine's fused rope)."""
    r = x[..., -ROPE:]
    return torch.cat([x[..., :-ROPE], r * cos + r.flip(-1) * sin], dim=-1)


class Dsv4Attention:
    """One compress-ratio-4 MQA layer (it has both a compressor and an indexer), decode only."""

    def __init__(self, dev, fused, tokens=TOKENS, seed=0):
        self.dev, self.fused, self.tokens = dev, fused, tokens
        g = torch.Generator().manual_seed(seed)

        def param(*shape, dtype=DTYPE):
            return (torch.randn(*shape, generator=g) * shape[0] ** -0.5).to(dtype).to(dev.torch_device)

        if fused:
            self.w_qkv_a = param(HIDDEN, Q_LORA + HEAD_DIM)
        else:
            self.w_q_a, self.w_kv = param(HIDDEN, Q_LORA), param(HIDDEN, HEAD_DIM)
        self.w_q_b = param(Q_LORA, HEADS * HEAD_DIM)
        self.q_norm_w, self.kv_norm_w = param(Q_LORA), param(HEAD_DIM)
        self.w_comp = param(HIDDEN, HEAD_DIM)
        self.w_idx_comp, self.w_idx_weights = param(HIDDEN, INDEX_DIM), param(HIDDEN, INDEX_HEADS)
        self.w_idx_q = param(Q_LORA, INDEX_HEADS * INDEX_DIM)
        self.w_o = param(HEADS * HEAD_DIM, HIDDEN)
        # persistent state a captured graph reads and writes: caches, static inputs, static output
        self.swa_cache, self.comp_cache = param(SLOTS, HEAD_DIM), param(SLOTS, HEAD_DIM)
        self.index_k_cache = param(SLOTS, INDEX_DIM)
        self.x = param(tokens, HIDDEN)
        self.cos, self.sin = param(tokens, ROPE), param(tokens, ROPE)
        self.out_cache_loc = torch.arange(tokens, device=dev.torch_device)
        self.sparse_indices = torch.zeros(tokens, TOPK, dtype=torch.long, device=dev.torch_device)
        self.out = torch.zeros(tokens, HIDDEN, dtype=DTYPE, device=dev.torch_device)
        alt = [dev.Stream() for _ in range(5)]  # the model's alt_streams
        self.streams, self.indexer_streams = alt[:3], alt[-2:]

    # -- MQALayer._forward_prepare_multi_stream ------------------------------------------------
    def prepare(self):
        dev = self.dev
        main = dev.current_stream()
        stream_kv, stream_compressor, stream_indexer = self.streams
        stream_kv.wait_stream(main)
        stream_compressor.wait_stream(main)
        stream_indexer.wait_stream(main)

        qkv_a, qkv_a_ready = None, None
        if self.fused:
            qkv_a = self.x @ self.w_qkv_a  # made on main
            qkv_a_ready = main.record_event()
        q_lora = self.compute_q_a(qkv_a)
        q_lora_ready = main.record_event()

        with dev.stream(stream_indexer):
            self.indexer(q_lora, q_lora_ready)

        with dev.stream(stream_kv):
            if qkv_a_ready is not None:
                stream_kv.wait_event(qkv_a_ready)
            self.compute_kv_to_cache(qkv_a)  # fused: reads main's qkv_a on stream_kv

        del qkv_a  # as the source: the last reference, before main waits on stream_kv

        with dev.stream(stream_compressor):
            self.compressor()

        q = self.compute_q_b(q_lora)  # main's next tensors
        main.wait_stream(stream_kv)
        main.wait_stream(stream_compressor)
        main.wait_stream(stream_indexer)
        return q

    def compute_q_a(self, qkv_a):
        q = qkv_a[:, :Q_LORA] if qkv_a is not None else self.x @ self.w_q_a
        return rms_norm(q, self.q_norm_w)

    def compute_q_b(self, q_lora):
        q = (q_lora @ self.w_q_b).view(self.tokens, HEADS, HEAD_DIM)
        q_out = torch.empty_like(q)
        # the engine's fused_q_norm_rope writes q_out in one kernel: norm, then rope in place
        scale = torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + EPS).to(q.dtype)
        torch.mul(q, scale, out=q_out)
        q_out[..., -ROPE:].mul_(self.cos[:, None, :])
        return q_out

    def compute_kv_to_cache(self, qkv_a):
        kv = qkv_a[:, Q_LORA:] if qkv_a is not None else self.x @ self.w_kv
        kv = rope(rms_norm(kv, self.kv_norm_w), self.cos, self.sin)
        self.swa_cache.index_copy_(0, self.out_cache_loc, kv)

    def compressor(self):
        kv_c = rms_norm(self.x @ self.w_comp, self.kv_norm_w)
        self.comp_cache.index_copy_(0, self.out_cache_loc, kv_c)

    # -- C4IndexerBackendMixin: _forward_prepare_multi_stream, then forward_c4_indexer ----------
    def indexer(self, q_lora, q_lora_ready):
        dev = self.dev
        current = dev.current_stream()  # stream_indexer
        stream_q, stream_weights = self.indexer_streams
        stream_q.wait_stream(current)
        stream_weights.wait_stream(current)

        k_idx = self.x @ self.w_idx_comp  # the indexer's compressor, on stream_indexer
        self.index_k_cache.index_copy_(0, self.out_cache_loc, k_idx)

        with dev.stream(stream_weights):
            weights = self.x @ self.w_idx_weights
            weights_ready = stream_weights.record_event()

        with dev.stream(stream_q):
            stream_q.wait_event(q_lora_ready)
            stream_q.wait_event(weights_ready)
            q_idx = (q_lora @ self.w_idx_q).view(self.tokens, INDEX_HEADS, INDEX_DIM)
            weights = weights * INDEX_DIM**-0.5  # rebinds: stream_weights' tensor dies here

        current.wait_stream(stream_q)
        logits = torch.einsum("thd,sd->ths", q_idx.float(), self.index_k_cache.float())
        logits = (logits.relu() * weights.float()[:, :, None]).sum(1)
        self.sparse_indices.copy_(logits.topk(TOPK, dim=-1).indices)

    # -- MQALayer.forward: prepare, attention over the selected entries, output projection -------
    def step(self):
        q = self.prepare()
        kv = torch.cat([self.comp_cache[self.sparse_indices], self.swa_cache[: self.tokens][None].expand(
            self.tokens, -1, -1)], dim=1)  # fmt: skip
        p = torch.softmax(torch.einsum("thd,tkd->thk", q.float(), kv.float()) * HEAD_DIM**-0.5, -1)
        o = torch.einsum("thk,tkd->thd", p, kv.float()).to(DTYPE)
        self.out.copy_(o.flatten(1) @ self.w_o)
        return self.out


def build(dev, fused):
    """The layer, warmed up once eagerly (as a graph runner does before capturing), and its step."""
    layer = Dsv4Attention(dev, fused)
    layer.step()
    dev.synchronize()
    return layer.step


def fused(dev):
    """Audit target: the fused q/kv projection on (SGLANG_OPT_FUSE_WQA_WKV)."""
    return build(dev, fused=True)


def unfused(dev):
    """Audit target: separate wq_a and wkv projections."""
    return build(dev, fused=False)
