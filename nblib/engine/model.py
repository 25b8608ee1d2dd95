"""The miniature decode step, in the shape of DeepSeek-V4's sparse-attention layer as SGLang runs it.

One step for a batch of requests:
  main stream   compressor (4:1): append one index-K entry and one KV entry for requests that
                crossed a 4-token boundary; project the indexer's queries and head weights
  indexer       logits[b, t] = sum_h w[b,h] relu(q[b,h] . k[t]) over the paged index-K cache,
                then top-k (the entries sparse attention will read)
  main stream   the trunk: `trunk_layers` small layers (layer norm, [bs, W] x [W, W], silu,
                residual), many short kernels that leave most SMs idle at decode batch sizes (what
                makes the overlap pay), then the MLP, whose large transients come from the large pool
  join          sparse attention over the top-k entries, output projection

The race's window: with overlap on, the main stream frees the bf16 logits right after forking, and
its first op that reuses the block is a transient of the MLP, after the trunk. The side branch
(indexer over this step's contexts, then top-k reading the logits) must finish before that op
writes, or the two touch the same bytes. The trunk's duration is the main branch's lead; the
indexer's grows with the batch's contexts, so only long-context steps lose the race.

Knobs, as in the real engine:
  index_dtype   bf16 | fp8     the index-K cache layout (kernels.indexer)
  overlap       on | off       on: while capturing, the indexer forks to an alternate stream
                               (eager decode never forks, as in the engine)
  logits_policy transient | persistent | record_stream
                transient: the bf16 path allocates its logits with torch.empty on the main stream
                before forking, the way the faulty engine did; the fp8 path allocates its own on
                the stream it runs on (a kernel library's habit). persistent (the fix): one buffer
                per (stream, bucket, shape), allocated before capture, outside the graph pool
                (nblib.engine.buffers). record_stream (the textbook fix): transient, but
                logits.record_stream(side) before the free, so the allocator does not reuse the
                block while the capture lasts.
"""

import contextlib
import functools
import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import indexer as kx
from nblib.core import files
from nblib.core.live import live_columns
from nblib.engine.buffers import PersistentBuffers

INDEX_DTYPES = ("bf16", "fp8")
OVERLAPS = ("on", "off")
LOGITS_POLICIES = ("transient", "persistent", "record_stream")
TOPK_KERNELS = ("torch", "triton")
# index dtypes whose transient logits the main stream allocates and hands to the side stream (the
# bug's path); fp8's indexer allocates its own logits on the stream it runs on
HANDS_LOGITS_ACROSS = ("bf16",)
PAGE = kx.PAGE
# knobs that change only what a capture records, never the eager step's values: fixed to these, a
# capture records the eager step's work (DecodeModel.serial)
GRAPH_ONLY_KNOBS = dict(overlap="off", logits_policy="transient")


def check_choice(name, value, choices):
    """One-line error naming the valid choices, raised before anything is allocated."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: choose one of {', '.join(map(str, choices))}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    heads: int = 64  # index heads
    dim: int = 128  # index head dim (also the KV entry width)
    topk: int = 512
    max_ctx: int = 65536  # compressed entries a request may hold (max_c4_seq_len)
    d_model: int = 4096
    ffn: int = 32768
    num_pages: int = 4096  # pages in each cache, page 0 is scratch
    vocab: int = 4096
    trunk_layers: int = 0  # main-branch layers between the fork and the MLP (the race's lead)
    trunk_width: int = 2048
    # indexer programs per request: 0 fills the GPU (the main branch then waits for SMs, and the
    # race's margin does not depend on the contexts); n > 0 leaves SMs to the overlapped main
    # branch, so the indexer's time follows the longest context in the batch
    indexer_programs: int = 0
    # the indexer's top-k: "torch" (torch.topk, several kernels, as the campaign's engine ran it) or
    # "triton" (kernels.topk: a bound, then a radix select; 2.8x faster at [32, 65536] on an H200).
    # Either shortens or lengthens the side branch, so it moves the race's window.
    topk_kernel: str = "torch"
    index_dtype: str = "bf16"
    overlap: str = "on"
    logits_policy: str = "transient"
    seed: int = 0

    def __post_init__(self):
        check_choice("index dtype", self.index_dtype, INDEX_DTYPES)
        check_choice("topk kernel", self.topk_kernel, TOPK_KERNELS)
        check_choice("overlap mode", self.overlap, OVERLAPS)
        check_choice("logits policy", self.logits_policy, LOGITS_POLICIES)
        if self.max_ctx % PAGE:
            raise ValueError(f"max_ctx must be a multiple of the page size {PAGE}, got {self.max_ctx}")


@dataclass
class WeightSet:
    """A model's weights (name -> tensor, w_trunk a list), and their digest once someone asks
    (nblib.engine.references keys eager steps by it)."""

    tensors: dict
    digest: bytes | None = None


# weights are read-only once built: every DecodeModel of the same shapes, seed and device shares one
# set, so a study that builds a model per configuration draws them once (the draw is the CPU's
# torch.randn: seconds at the H200 profile's sizes, the same values on every backend). The sets live
# outside any capture's pool, like the weights each model used to own; the last few are kept.
_WEIGHT_SETS: OrderedDict = OrderedDict()
KEPT_WEIGHT_SETS = 4


# A folder where drawn sets are kept as files (None: memory only): nblib.setup points it at the run
# folder's store, beside the eager references, so the suite's notebooks (each its own process) draw
# a set once between them and the others read it (about a second, against 4.5 s of drawing at the
# H200 profile's 800 MB).
WEIGHT_FOLDER: list = [None]


def keep_weights_in(folder):
    """Keep drawn weight sets as files in `folder` (None: memory only)."""
    WEIGHT_FOLDER[0] = Path(folder) if folder else None


def weights_kept_in():
    """The folder drawn weight sets are kept in (None: memory only)."""
    return WEIGHT_FOLDER[0]


def weight_set(cfg, dev):
    """The WeightSet for cfg's shapes and seed on dev's device, drawn on first use (or read from
    the file a process of the same run folder wrote: keep_weights_in)."""
    key = (
        replace(cfg, index_dtype="bf16", overlap="on", logits_policy="transient"),
        dev.name,
        str(dev.torch_device),
    )
    got = _WEIGHT_SETS.get(key)
    if got is None:
        got = _WEIGHT_SETS[key] = WeightSet(_stored_weights(key, cfg, dev.torch_device))
        while len(_WEIGHT_SETS) > KEPT_WEIGHT_SETS:
            _WEIGHT_SETS.popitem(last=False)
    _WEIGHT_SETS.move_to_end(key)
    return got


def _stored_weights(key, cfg, d):
    """The set from the weight folder's file for `key` when it holds one written for the same key,
    else drawn (and written there, atomically, for the run folder's next process)."""
    folder = weights_kept_in()
    if folder is None:
        return _draw_weights(cfg, d)
    name = repr((key[0], key[1]))  # the device index is not the weights' business
    path = folder / f"weights-{hashlib.blake2b(name.encode(), digest_size=12).hexdigest()}.pt"
    if path.exists():
        data = torch.load(path, map_location=d, weights_only=True)
        if data.get("key") == name:  # a digest collision never hands over another set
            return data["tensors"]
    out = _draw_weights(cfg, d)
    files.write_with(path, functools.partial(torch.save, dict(key=name, tensors=out)))  # whole, or none
    return out


def _draw_weights(cfg, d):
    g = torch.Generator(device="cpu").manual_seed(cfg.seed)

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(d)

    D, H, M, W = cfg.dim, cfg.heads, cfg.d_model, cfg.trunk_width
    out = dict(embed=w(cfg.vocab, M, scale=1.0))
    out["w_idx_k"] = w(M, D, scale=M**-0.5)  # compressor: index-K entry
    out["w_kv"] = w(M, D, scale=M**-0.5)  # compressor: KV entry for sparse attention
    out["w_q"] = w(M, H * D, scale=M**-0.5)
    out["w_head"] = w(M, H, scale=M**-0.5)
    out["w_qa"] = w(M, D, scale=M**-0.5)
    out["w_o"] = w(D, M, scale=D**-0.5)
    out["w_up"] = w(M, cfg.ffn, scale=M**-0.5)
    out["w_down"] = w(cfg.ffn, M, scale=cfg.ffn**-0.5)
    out["w_tin"] = w(M, W, scale=M**-0.5)
    out["w_trunk"] = [w(W, W, scale=W**-0.5) for _ in range(cfg.trunk_layers)]
    out["w_tout"] = w(W, M, scale=W**-0.5)
    return out


class DecodeModel:
    """Weights and caches live here, allocated once, before any capture."""

    def __init__(self, cfg: ModelConfig, dev):
        self.cfg, self.dev = cfg, dev
        d, D = dev.torch_device, cfg.dim
        self.weight_set = weight_set(cfg, dev)
        for name, t in self.weight_set.tensors.items():
            setattr(self, name, t)
        slots = cfg.num_pages * PAGE
        if cfg.index_dtype == "bf16":
            self.index_cache = torch.zeros(cfg.num_pages, PAGE, D, dtype=torch.bfloat16, device=d)
        else:
            self.index_cache = torch.zeros(cfg.num_pages, kx.fp8_page_bytes(D), dtype=torch.uint8, device=d)
        self.kv_cache = torch.zeros(slots, D, dtype=torch.bfloat16, device=d)
        self.side = dev.Stream()
        self.buffers = PersistentBuffers(dev)  # logits_policy persistent: made before capture
        self.captures = []  # (bucket, name, tensor, stream) noted while capturing
        self._eager_logits = {}  # batch size -> the CPU's eager logits scratch (_eager_scratch)

    # -- cache writes, used by prefill (eager) and by the compressor inside the step ------------
    def store(self, slots, h_idx, h_kv):
        """Append index-K and KV entries at flat slots (page * 64 + offset)."""
        if self.cfg.index_dtype == "bf16":
            kx.write_entries_bf16_(self.index_cache, slots, h_idx)
        else:
            kx.write_entries_fp8_(self.index_cache, slots, h_idx)
        self.kv_cache.index_copy_(0, slots, h_kv.to(self.kv_cache.dtype))

    def prefill_entries(self, slots, gen):
        """Random index-K and KV entries for a prompt's compressed tokens (prefill is not studied)."""
        n, D = slots.numel(), self.cfg.dim
        k = torch.randn(n, D, generator=gen, device=gen.device)
        v = torch.randn(n, D, generator=gen, device=gen.device)
        self.store(slots, k, v)

    def prepare(self, bucket):
        """What must exist before capturing `bucket`: the persistent logits buffer, if used."""
        if self.cfg.logits_policy == "persistent":
            self.buffers.reserve(self._logits_stream(), bucket, (bucket, self.cfg.max_ctx))
        if self.gediff is not None:
            self.gediff.prepare(bucket)  # a design whose stash is made before capture

    def _logits_stream(self):
        """The stream that uses the logits while capturing (the persistent buffer's owner)."""
        return "side" if self.cfg.overlap == "on" else "main"

    @contextlib.contextmanager
    def serial(self):
        """Capture the eager step's work: no fork, transient logits, the capture's notes dropped
        (Runner.reference's serial graph; where the logits live never changes their values)."""
        cfg, notes = self.cfg, self.captures
        self.cfg, self.captures = replace(cfg, **GRAPH_ONLY_KNOBS), []
        try:
            yield
        finally:
            self.cfg, self.captures = cfg, notes

    # -- the step -------------------------------------------------------------------------------
    def step(self, tokens, page_table, seq_lens, store_slots):
        """One decode step. Returns (out [bs, d_model], topk [bs, topk]). Plain torch + facade."""
        cfg, dev = self.cfg, self.dev
        x = self.embed[tokens]  # [bs, M]
        # compressor: every request writes one slot; those not at a 4-token boundary write scratch
        self.store(store_slots, x @ self.w_idx_k, x @ self.w_kv)
        q = (x @ self.w_q).view(-1, cfg.heads, cfg.dim)
        head_w = (x @ self.w_head).float()
        capturing = dev.is_current_stream_capturing()
        if self.gediff is not None and capturing:
            self.gediff.before_fork(q, head_w, page_table, seq_lens)  # on main, where they are made
        fork = cfg.overlap == "on" and capturing
        if fork:
            main = dev.current_stream()
            self.side.wait_stream(main)
            logits = self._logits_buffer(len(tokens), use="side")
            with dev.stream(self.side):
                topk = self.indexer(q, head_w, page_table, seq_lens, logits)
            if cfg.logits_policy == "record_stream" and logits is not None:
                dev.record_stream(logits, self.side)  # the free waits for the side stream's use
            del logits  # the engine's transient dies here, before the join
            y = self.main_branch(x)
            main.wait_stream(self.side)
        else:
            topk = self.indexer(q, head_w, page_table, seq_lens, self._logits_buffer(len(tokens), use="main"))
            y = self.main_branch(x)
        return y + self.sparse_attention(x, topk, page_table, seq_lens), topk

    def _logits_buffer(self, bs, use):
        """bf16 transient: torch.empty on the calling (main) stream, as the faulty engine did.
        fp8 transient: None, the indexer allocates on its own stream. persistent: the bucket's buffer."""
        cfg = self.cfg
        if cfg.logits_policy == "persistent":
            return self.buffers.get(self._logits_stream(), bs, (bs, cfg.max_ctx))
        if cfg.index_dtype not in HANDS_LOGITS_ACROSS:
            return None
        t = self._eager_scratch(bs)
        if t is None:
            t = torch.empty(bs, cfg.max_ctx, dtype=torch.float32, device=self.dev.torch_device)
        self.note("indexer.logits", t, use)
        return t

    def _eager_scratch(self, bs):
        """On the CPU outside a capture, one [bs, max_ctx] fp32 logits scratch per batch size,
        reused step after step: the indexer writes every column, and a fresh 20 MB tensor costs
        the host its page faults each step, several times the indexer's work. Else None (the
        caller allocates, where a capture's allocation site is reported)."""
        d = self.dev.torch_device
        if d.type != "cpu" or self.dev.is_current_stream_capturing():
            return None
        t = self._eager_logits.get(bs)
        if t is None:
            t = self._eager_logits[bs] = torch.empty(bs, self.cfg.max_ctx, dtype=torch.float32, device=d)
        return t

    gediff = None  # the graph-vs-eager differential's hook (nblib.instruments.gediff), called while capturing
    # A check of the instruments only, never of the bug: True adds one captured op that makes the
    # graph's logits differ from what eager computes (+1 on every row's first entry), so a test or
    # notebook 02 can prove that a differential design would report a divergence.
    plant_divergence = False

    def indexer(self, q, head_w, page_table, seq_lens, logits):
        logits = self.index_logits(q, head_w, page_table, seq_lens, logits)
        if self.plant_divergence and self.dev.is_current_stream_capturing():
            logits[:, 0].add_(1.0)
        if self.gediff is not None and self.dev.is_current_stream_capturing():
            self.gediff(q, head_w, page_table, seq_lens, logits)  # its clones are captured too
        if self.cfg.topk_kernel == "triton":
            return kx.topk_indices_op(logits, self.cfg.topk)  # csi::topk_indices: Triton on CUDA
        if logits.device.type == "cpu" and not self.dev.is_current_stream_capturing():
            # the same indices from the columns before the -inf tail (a replay's top-k node takes
            # the same shortcut, the simulator's fastops); a capture records the op over every column
            logits = logits[:, : live_columns(logits, self.cfg.topk)]
        return kx.topk_indices(logits, self.cfg.topk)

    def index_logits(self, q, head_w, page_table, seq_lens, logits=None, programs=None):
        """The indexer's logits kernel; `logits` None: allocated here, on the current stream.
        programs: programs per request (None: the model's indexer_programs; 0: fill the GPU).
        It changes only how many tiles each program walks, never a token's arithmetic."""
        cfg = self.cfg
        programs = cfg.indexer_programs if programs is None else programs
        if logits is None:
            bs = q.shape[0]
            logits = self._eager_scratch(bs)
            if logits is None:
                logits = torch.empty(bs, cfg.max_ctx, dtype=torch.float32, device=self.dev.torch_device)
            self.note("indexer.logits", logits)
        if cfg.index_dtype == "bf16":
            kx.indexer_logits_bf16(q, head_w, self.index_cache, page_table, seq_lens, logits, programs)
        else:
            kx.indexer_logits_fp8(
                q.to(torch.float8_e4m3fn),
                head_w,
                self.index_cache,
                page_table,
                seq_lens,
                logits,
                programs,
            )
        return logits

    def main_branch(self, x):
        """The main stream's work while the indexer runs: the trunk, then the MLP."""
        return self.mlp(x + self.trunk(x)) if self.cfg.trunk_layers else self.mlp(x)

    def trunk(self, x):
        """Small residual layers: each a handful of short kernels on [bs, trunk_width]."""
        h = x @ self.w_tin
        for wl in self.w_trunk:
            h = h + F.silu(F.layer_norm(h, h.shape[-1:]) @ wl)
        return h @ self.w_tout

    def mlp(self, x):
        h = x @ self.w_up
        a = F.gelu(h, approximate="tanh")
        y = a @ self.w_down
        for name, t in (("mlp.up", h), ("mlp.act", a), ("mlp.down", y)):
            self.note(name, t, "main")
        return y

    def sparse_attention(self, x, topk, page_table, seq_lens):
        """Attend over the selected compressed entries only. Like the engine's kernel, it masks
        any index outside [0, seq_len): -1 marks an empty selection, and a top-k computed from
        corrupted logits (NaN bit patterns) can hold garbage indices."""
        valid = (topk >= 0) & (topk < seq_lens.unsqueeze(1))
        t = torch.where(valid, topk, 0).long()
        slots = page_table.long().gather(1, t // PAGE) * PAGE + t % PAGE
        kv = self.kv_cache[slots].float()  # [bs, K, D]
        qa = (x @ self.w_qa).float()  # [bs, D]
        scores = (kv @ qa.unsqueeze(-1)).squeeze(-1) / math.sqrt(self.cfg.dim)
        p = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
        attn = (p.unsqueeze(1) @ kv).squeeze(1).to(torch.bfloat16)
        return attn @ self.w_o

    # -- what the capture allocated, for naming aliases ----------------------------------------
    bucket = None  # set by the runner while it captures

    def note(self, name, t, use=None):
        """Remember a transient's bytes and the stream that uses them (default: the current one),
        while capturing."""
        if self.dev.is_current_stream_capturing():
            use = use or ("side" if self.dev.current_stream() == self.side else "main")
            self.captures.append(
                dict(
                    bucket=self.bucket,
                    tensor=name,
                    addr=t.data_ptr(),
                    nbytes=t.numel() * t.element_size(),
                    stream=use,
                )
            )
