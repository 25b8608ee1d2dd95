"""SGLang DeepSeek-V4: the fused WQ-A/WKV multi-stream prepare frees `qkv_a` before the join.

    python -m nblib audit examples/field/sglang_dsv4_qkv_a.py:buggy   # exit 1: write-after-read on qkv_a
    python -m nblib audit examples/field/sglang_dsv4_qkv_a.py:fixed   # exit 0

Repository: sgl-project/sglang. Reference: pull request #36547, "Fix DeepSeek V4 multistream QKV buffer
lifetime" (merged). Engine: python/sglang/srt/models/deepseek_v4.py, MQALayer._forward_prepare_multi_stream
(the CUDA path; the PR changes the NPU multi-stream path the same way, the HIP path keeps Q/KV on the
current stream and is unchanged). Buggy: deepseek_v4.py at commit 000328a8cd54dd3aac97cd9977c39b5408034b26,
the version examples/audit/dsv4_attention.py transcribes (`del qkv_a` before the three joins; the same
order at f8101ac7db91793fa174f5a5c710b58445f040aa). Fixed: the merge of #36547, its id not recorded
(sgl-project/sglang's history was not read, and the stored versions of the file all predate the merge:
examples/field/README.md); the fixed ordering below is the one the pull request describes.

The ordering. With SGLANG_OPT_FUSE_WQA_WKV on, `qkv_a = wqkv_a(x)` is allocated on the current
(capturing) stream and `qkv_a_ready` is recorded there; the KV stream waits on that event and reads the
kv slice of `qkv_a` in its fused norm + rope + cache-write kernel. The event orders the reader after
the producer, but it says nothing to the caching allocator: `del qkv_a` runs on the host before
`current_stream.wait_stream(stream_kv)`, so the block goes back to the current stream's free list while
the KV stream may still be reading it, and the next current-stream allocation of that size (wq_b's
output in `_compute_q_b`) can be handed the same bytes. The fix keeps the Python reference until after
the joins that already exist: no copy, no synchronisation, no kernel.

The buggy target is the suite's own transcription, examples/audit/dsv4_attention.py:fused, imported:
its audit names this hazard (the KV stream, `side`, reading `qkv_a` against main's `wq_b` output). The
fixed target is the same layer with the last reference to `qkv_a` dropped after the joins.
"""

import _field

dsv4 = _field.load_example("audit/dsv4_attention.py")


class HeldThroughJoin(dsv4.Dsv4Attention):
    """The layer with #36547's ordering: `qkv_a` stays referenced until main has joined the KV stream."""

    def prepare(self):
        dev = self.dev
        main = dev.current_stream()
        stream_kv, stream_compressor, stream_indexer = self.streams
        stream_kv.wait_stream(main)
        stream_compressor.wait_stream(main)
        stream_indexer.wait_stream(main)

        qkv_a = self.x @ self.w_qkv_a  # made on main
        qkv_a_ready = main.record_event()
        q_lora = self.compute_q_a(qkv_a)
        q_lora_ready = main.record_event()

        with dev.stream(stream_indexer):
            self.indexer(q_lora, q_lora_ready)

        with dev.stream(stream_kv):
            stream_kv.wait_event(qkv_a_ready)
            self.compute_kv_to_cache(qkv_a)  # reads main's qkv_a on stream_kv

        with dev.stream(stream_compressor):
            self.compressor()

        q = self.compute_q_b(q_lora)
        main.wait_stream(stream_kv)
        main.wait_stream(stream_compressor)
        main.wait_stream(stream_indexer)
        del qkv_a  # after the join: main's later tensors cannot take its bytes while stream_kv reads them
        return q


def buggy(dev):
    """The engine's order before #36547: examples/audit/dsv4_attention.py:fused."""
    return dsv4.fused(dev)


def fixed(dev):
    """#36547's order: the same layer, `qkv_a` held through the joins."""
    layer = HeldThroughJoin(dev, fused=True)
    return _field.warm(dev, layer.step)
