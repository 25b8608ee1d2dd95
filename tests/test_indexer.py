"""CPU tests for the indexer: page layouts and writes (kernels.paged), the logits kernel
(kernels.logits) in Triton's interpreter, the custom ops (kernels.ops), the CLI.

The interpreter computes tl.dot on bf16 operands from raw bit patterns, so the
"bf16" kernel's math is tested with float32/float16 operands (same kernel, a
launcher test path); the fp8 kernel is tested directly. The real bf16 path and
performance are checked on the GPU (test marked `gpu`); what the compiler makes of
the kernels for sm_80 ... sm_120 is checked in tests/test_kernel_compile.py.
"""

import numpy as np
import pytest
import torch
from interp import interpret, run_without_interpreter

from kernels import indexer as ix
from kernels import logits as lg
from kernels.launch import run

COMPILED_KERNEL = lg._indexer_logits_kernel  # before any fixture swaps in the interpreted twin


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    interpret(monkeypatch, lg)


PAGE = ix.PAGE
NEG_INF = float("-inf")


# ---------------------------------------------------------------- helpers


def naive_logits(q, w, k_pages, scales, page_table, seq_lens, max_len):
    """Loop-by-loop float64 definition: the spec, written as plainly as possible."""
    bs, H, _ = q.shape
    out = torch.full((bs, max_len), NEG_INF, dtype=torch.float64)
    for b in range(bs):
        for t in range(min(int(seq_lens[b]), max_len)):
            p = int(page_table[b, t // PAGE])
            k = k_pages[p, t % PAGE].double()
            s = 1.0 if scales is None else float(scales[p, t % PAGE])
            out[b, t] = sum(float(w[b, h]) * max(float(q[b, h].double() @ k) * s, 0.0) for h in range(H))
    return out


def rel_err(out, ref):
    fin = ~torch.isneginf(ref)
    return float((out[fin].double() - ref[fin]).norm() / ref[fin].norm())


def assert_logits(out, ref, tol):
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN elements in out"
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs"
    err = rel_err(out, ref)
    assert err < tol, f"relative error {err:.3g} >= {tol}"


def inputs(bs=3, seq_lens=(130, 7, 64), heads=4, dim=32, max_len=None, seed=0):
    if max_len is None:
        max_len = (-(-max(seq_lens) // PAGE) + 2) * PAGE
    return ix.make_inputs(bs, list(seq_lens), heads, dim, max_len, "cpu", seed)


def poisoned(bs, max_len):
    return torch.full((bs, max_len), float("nan"))


CONFIGS = [
    dict(block_t=64, tiles_per_prog=1, num_warps=4, num_stages=2, min_programs=0),
    dict(block_t=128, tiles_per_prog=3, num_warps=4, num_stages=2, min_programs=0),
    # TMA page tiles; a persistent grid of one program (num_sms patched to 1) walking every item
    dict(block_t=64, tiles_per_prog=2, num_warps=4, num_stages=2, min_programs=0, k_load="tma"),
    dict(block_t=128, tiles_per_prog=1, num_warps=4, num_stages=2, min_programs=0, persistent=1),
    # fp8's scales loaded a tile ahead: 3 tiles a program, so one program holds a live tile
    # followed by a live one, by a dead one, and none at all (bf16 has no scales: tma again)
    dict(block_t=64, tiles_per_prog=3, num_warps=4, num_stages=2, min_programs=0, k_load="tma")
    | dict(scale_load="prefetch"),
]
CONFIG_IDS = ["t64x1", "t128x3", "tma", "persistent", "prefetch"]


@pytest.fixture(autouse=True)
def _one_sm(monkeypatch):
    monkeypatch.setattr(lg, "num_sms", lambda device: 1)


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("seq_lens", [(130, 7, 64), (0, 200, 1)])
def test_ref_bf16_matches_naive(seq_lens):
    x = inputs(seq_lens=seq_lens)
    q, k = x["q"].double(), x["k"].double()
    ref = ix.ref_logits_bf16(q, x["w"].double(), k, x["page_table"], x["seq_lens"], x["max_len"])
    want = naive_logits(q, x["w"], k, None, x["page_table"], x["seq_lens"], x["max_len"])
    assert torch.equal(torch.isneginf(ref), torch.isneginf(want))
    assert rel_err(ref, want) < 1e-12


def test_ref_fp8_matches_naive():
    x = inputs(seq_lens=(130, 7, 64))
    pages = ix.quantize_fp8_pages(x["k"])
    q8 = x["q"].to(torch.float8_e4m3fn)
    ref = ix.ref_logits_fp8(q8, x["w"], pages, x["page_table"], x["seq_lens"], x["max_len"], torch.float64)
    want = naive_logits(
        q8.double(),
        x["w"],
        ix.fp8_values(pages),
        ix.fp8_scales(pages),
        x["page_table"],
        x["seq_lens"],
        x["max_len"],
    )
    assert torch.equal(torch.isneginf(ref), torch.isneginf(want))
    assert rel_err(ref, want) < 1e-12
    # the production (bf16 compute) reference is close, not exact: scores round to bf16
    ref_bf16 = ix.ref_logits_fp8(q8, x["w"], pages, x["page_table"], x["seq_lens"], x["max_len"])
    assert rel_err(ref_bf16, want) < 1e-2


# ---------------------------------------------------------------- kernels (interpreter)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_dense_path_matches_reference(cfg, dtype):
    x = inputs(bs=3, seq_lens=(300, 7, 64), heads=5, dim=32)
    q, k = x["q"].to(dtype), x["k"].to(dtype)
    out = poisoned(3, x["max_len"])
    ix.indexer_logits_bf16_(q, x["w"], k, x["page_table"], x["seq_lens"], out, config=cfg)
    ref = ix.ref_logits_bf16(
        q.double(), x["w"].double(), k.double(), x["page_table"], x["seq_lens"], x["max_len"]
    )
    assert_logits(out, ref, 1e-6 if dtype == torch.float32 else 1e-5)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_kernel_fp8_matches_reference(cfg):
    x = inputs(bs=3, seq_lens=(300, 7, 64), heads=8, dim=32)
    pages = ix.quantize_fp8_pages(x["k"])
    q8 = (x["q"] * 4).to(torch.float8_e4m3fn)
    out = poisoned(3, x["max_len"])
    ix.indexer_logits_fp8_(q8, x["w"], pages, x["page_table"], x["seq_lens"], out, config=cfg)
    ref = ix.ref_logits_fp8(q8, x["w"], pages, x["page_table"], x["seq_lens"], x["max_len"], torch.float64)
    assert_logits(out, ref, 1e-6)


@pytest.mark.parametrize("is_fp8", [False, True], ids=["bf16", "fp8"])
def test_tma_gather_path_on_sm100(is_fp8):
    """The Blackwell path (TMA gather of any rows; two pages a tile) computes the same logits."""
    x = inputs(bs=3, seq_lens=(300, 7, 64), heads=8, dim=32)
    out = poisoned(3, x["max_len"])
    cfg = dict(block_t=128, tiles_per_prog=2, num_warps=4, num_stages=2, min_programs=0, k_load="gather")
    args = (x["w"], x["page_table"], x["seq_lens"], out)
    if is_fp8:
        q, pages = (x["q"] * 4).to(torch.float8_e4m3fn), ix.quantize_fp8_pages(x["k"])
        launch = lg.plan_fp8(q, args[0], pages, *args[1:], config=cfg, arch=100)
        ref = ix.ref_logits_fp8(q, x["w"], pages, x["page_table"], x["seq_lens"], x["max_len"], torch.float64)
    else:
        q, k = x["q"], x["k"]
        launch = lg.plan_bf16(q, args[0], k, *args[1:], config=cfg, arch=100)
        ref = ix.ref_logits_bf16(
            q.double(), x["w"].double(), k.double(), x["page_table"], x["seq_lens"], x["max_len"]
        )
    assert launch.args["K_LOAD"] == 2 and launch.args["k_desc"].block_shape == [1, 32]
    run(launch)
    assert_logits(out, ref, 1e-6)


def test_persistent_grid_is_capped_by_the_sm_count(monkeypatch):
    x = inputs(bs=3, seq_lens=(300, 7, 64), heads=8, dim=32)
    out = poisoned(3, x["max_len"])
    cfg = dict(CONFIGS[3])
    monkeypatch.setattr(lg, "num_sms", lambda device: 2)
    launch = lg.plan_bf16(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out, config=cfg)
    assert launch.grid == (2,) and launch.args["bs"] * launch.args["n_chunks"] == 3 * 4  # 448 / 128
    cfg["persistent"] = 0
    launch = lg.plan_bf16(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out, config=cfg)
    assert launch.grid == (3, 4)


def test_check_runs_in_interpreter_at_dim_128():
    errs = ix.check("cpu", bs=2, seq_lens=[70, 5], heads=8, dim=128, max_len=256, fp32_operands=True)
    assert errs["bf16"] < 1e-6 and errs["fp8"] < 1e-6, errs


@pytest.mark.parametrize("is_fp8", [False, True])
def test_every_element_written_and_nothing_else(is_fp8):
    # seq_len 0, exactly one page, beyond max_len; out is a strided slice of a wider buffer
    seq_lens, max_len = (0, 64, 10_000, 65), 192
    x = inputs(bs=4, seq_lens=seq_lens, max_len=max_len)
    big = torch.full((4, max_len + 64), 7.0)
    big[:, :max_len] = float("nan")
    out = big[:, :max_len]
    cfg = dict(CONFIGS[1])  # 128-entry tiles straddle max_len = 192
    if is_fp8:
        ix.indexer_logits_fp8_(
            x["q"].to(torch.float8_e4m3fn),
            x["w"],
            ix.quantize_fp8_pages(x["k"]),
            x["page_table"],
            x["seq_lens"],
            out,
            config=cfg,
        )
    else:
        ix.indexer_logits_bf16_(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out, config=cfg)
    assert not torch.isnan(out).any()
    t = torch.arange(max_len)
    dead = t[None, :] >= torch.tensor(seq_lens)[:, None]
    assert torch.isneginf(out[dead]).all()
    assert torch.isfinite(out[~dead]).all()
    assert (big[:, max_len:] == 7.0).all(), "kernel wrote past max_len"


# ---------------------------------------------------------------- fp8 layout


def test_fp8_page_layout_exact_bytes():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(3, PAGE, ix.DIM, generator=g) * torch.rand(3, PAGE, 1, generator=g) * 10
    pages = ix.quantize_fp8_pages(k)
    assert pages.dtype == torch.uint8 and pages.shape == (3, ix.FP8_PAGE_BYTES) == (3, 8448)
    scale = k.abs().amax(-1) / 448.0
    vals = (k / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    raw = pages.numpy()
    for p, i in [(0, 0), (1, 17), (2, 63)]:
        assert bytes(raw[p, i * 128 : i * 128 + 128]) == bytes(vals[p, i].numpy())
        got = np.frombuffer(bytes(raw[p, 8192 + 4 * i : 8192 + 4 * i + 4]), "<f4")[0]
        assert got == np.float32(scale[p, i])
    # the largest |entry| of each row lands on +-448 exactly
    assert (ix.fp8_values(pages).float().abs().amax(-1) == 448).all()
    assert torch.equal(ix.fp8_scales(pages), scale)


def test_fp8_roundtrip_error_bound():
    g = torch.Generator().manual_seed(2)
    k = torch.randn(4, PAGE, 64, generator=g) * torch.logspace(-3, 3, PAGE)[None, :, None]
    k[0, 5] = 0.0  # an all-zero entry: scale clamps to 1e-12, values stay 0
    deq = ix.dequantize_fp8_pages(ix.quantize_fp8_pages(k))
    scale = (k.abs().amax(-1, keepdim=True) / 448).clamp_min(1e-12)
    # e4m3: 3 mantissa bits -> half-ulp 2^-4 relative; subnormal step 2^-9 (times scale)
    bound = k.abs() * 2.0**-4 + scale * 2.0**-10 + 1e-30
    assert ((deq - k).abs() <= bound).all()
    assert (deq[0, 5] == 0).all()
    assert float((deq - k).norm() / k.norm()) < 0.05


def test_write_entries_fp8_lands_at_slots_only():
    g = torch.Generator().manual_seed(3)
    pages = ix.quantize_fp8_pages(torch.randn(4, PAGE, 32, generator=g))
    before = pages.clone()
    slots = torch.tensor([0, 63, 64 * 2 + 5, 64 * 3 + 63], dtype=torch.int32)
    new = torch.randn(4, 32, generator=g) * 3
    ix.write_entries_fp8_(pages, slots, new)
    # expected bytes per written entry, derived from a one-page quantization
    pad = torch.zeros(1, PAGE, 32)
    pad[0, :4] = new
    want = ix.quantize_fp8_pages(pad)
    changed = torch.zeros(4 * PAGE, dtype=torch.bool)
    changed[slots.long()] = True
    for j, s in enumerate(slots.tolist()):
        p, o = divmod(s, PAGE)
        assert torch.equal(
            ix.fp8_values(pages)[p, o].view(torch.uint8), ix.fp8_values(want)[0, j].view(torch.uint8)
        )
        assert ix.fp8_scales(pages)[p, o] == ix.fp8_scales(want)[0, j]
    keep = ~changed.view(4, PAGE)
    assert torch.equal(
        ix.fp8_values(pages).view(torch.uint8)[keep], ix.fp8_values(before).view(torch.uint8)[keep]
    )
    assert torch.equal(ix.fp8_scales(pages)[keep], ix.fp8_scales(before)[keep])
    assert not torch.equal(pages, before)


def test_write_entries_bf16_lands_at_slots_only():
    kcache = torch.randn(3, PAGE, 32).bfloat16()
    before = kcache.clone()
    slots = torch.tensor([1, 64 + 40, 191])
    new = torch.randn(3, 32)
    ix.write_entries_bf16_(kcache, slots, new)
    flat, flat_before = kcache.view(-1, 32), before.view(-1, 32)
    assert torch.equal(flat[slots], new.bfloat16())
    keep = torch.ones(3 * PAGE, dtype=torch.bool)
    keep[slots] = False
    assert torch.equal(flat[keep], flat_before[keep])


# ---------------------------------------------------------------- custom ops


def _cpu_op_inputs():
    x = inputs(bs=3, seq_lens=(130, 7, 64), heads=4, dim=32)
    x["q"], x["k"] = x["q"].bfloat16(), x["k"].bfloat16()
    return x


def test_cpu_custom_op_bf16_equals_reference():
    x = _cpu_op_inputs()
    out = poisoned(3, x["max_len"])
    ix.indexer_logits_bf16(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out)
    ref = ix.ref_logits_bf16(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], x["max_len"])
    assert torch.equal(out, ref)
    ref64 = ix.ref_logits_bf16(
        x["q"].double(), x["w"].double(), x["k"].double(), x["page_table"], x["seq_lens"], x["max_len"]
    )
    assert_logits(out, ref64, 1e-2)


def test_cpu_custom_op_fp8_equals_reference():
    x = _cpu_op_inputs()
    q8, pages = x["q"].to(torch.float8_e4m3fn), ix.quantize_fp8_pages(x["k"])
    out = poisoned(3, x["max_len"])
    torch.ops.csi.indexer_logits_fp8(q8, x["w"], pages, x["page_table"], x["seq_lens"], out)
    ref = ix.ref_logits_fp8(q8, x["w"], pages, x["page_table"], x["seq_lens"], x["max_len"])
    assert torch.equal(out, ref)


def test_custom_op_opcheck():
    x = _cpu_op_inputs()
    # garbage page ids would be fine for the op but opcheck compares runs; keep them valid
    x["page_table"].clamp_(0, x["k"].shape[0] - 1)
    out = torch.zeros(3, x["max_len"])
    torch.library.opcheck(
        torch.ops.csi.indexer_logits_bf16.default,
        (x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out),
    )


def test_every_custom_op_has_roles_that_agree_with_its_schema():
    """kernels.ops.OP_ROLES, which the simulator reads: one record per custom op the module
    defines, its writes the schema's mutated arguments, its roles on arguments of the right names."""
    import re
    from pathlib import Path

    from kernels import ops

    # the ops the module defines, from its decorators (no public API lists a namespace's ops)
    defined = set(re.findall(r'@torch\.library\.custom_op\("([^"]+)"', Path(ops.__file__).read_text()))
    assert (
        {r.name for r in ops.OP_ROLES}
        == defined
        == {
            "csi::indexer_logits_bf16",
            "csi::indexer_logits_fp8",
            "csi::topk_indices",
        }
    )
    for r in ops.OP_ROLES:
        args = r.overload()._schema.arguments
        written = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
        assert r.writes == written, r.name
        assert not set(r.reads) & set(r.writes) and max(r.reads + r.writes) < len(args)
        if r.cache is not None:
            assert args[r.cache].name in ("kcache", "pages") and args[r.lengths].name == "seq_lens"
            assert args[r.programs].name == "per_request" and r.cache in r.reads
    bf16, fp8 = ops.OP_ROLES[:2]
    assert bf16.entry_bytes(torch.empty(3, 64, 128, dtype=torch.bfloat16)) == 256
    assert fp8.entry_bytes(ix.quantize_fp8_pages(torch.randn(3, 64, 128))) == 132


def test_import_and_cpu_op_without_interpreter():
    code = (
        "import torch, kernels.indexer as ix\n"
        "x = ix.make_inputs(2, [70, 5], 4, 32, 128, 'cpu')\n"
        "out = torch.full((2, 128), float('nan'))\n"
        "q, k = x['q'].bfloat16(), x['k'].bfloat16()\n"
        "ix.indexer_logits_bf16(q, x['w'], k, x['page_table'], x['seq_lens'], out)\n"
        "assert not out.isnan().any() and out.isneginf().sum() == 58 + 123\n"
    )
    r = run_without_interpreter(["-c", code], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# ---------------------------------------------------------------- topk


def test_topk_indices_semantics():
    logits = torch.tensor(
        [
            [0.5, NEG_INF, 3.0, 1.0, NEG_INF, 2.0],
            [NEG_INF, NEG_INF, 4.0, NEG_INF, NEG_INF, NEG_INF],
        ]
    )
    idx = ix.topk_indices(logits, 4)
    assert idx.dtype == torch.int32 and idx.shape == (2, 4)
    assert idx.tolist() == [[0, 2, 3, 5], [2, -1, -1, -1]]
    assert ix.topk_indices(logits, 6).tolist() == [[0, 2, 3, 5, -1, -1], [2, -1, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="k=7 is larger than the row"):
        ix.topk_indices(logits, 7)


# ---------------------------------------------------------------- validation


def test_launcher_validation_errors():
    x = inputs(bs=3, seq_lens=(130, 7, 64), heads=4, dim=32)
    q, w, k, pt, sl, ml = x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], x["max_len"]
    out = torch.empty(3, ml)
    pages = ix.quantize_fp8_pages(k)
    q8 = q.to(torch.float8_e4m3fn)
    sl_strided = torch.zeros(6, dtype=torch.int32)[::2]
    cfg = dict(block_t=128, tiles_per_prog=1, num_warps=4, num_stages=2)
    prefetch_ptr_k, scales_unknown = dict(cfg, scale_load="prefetch"), dict(cfg, scale_load="x")
    tma128 = dict(cfg, k_load="tma")
    bad = [
        (lambda: ix.indexer_logits_bf16_(q, w.double(), k, pt, sl, out), "w must be torch.float32"),
        (lambda: ix.indexer_logits_bf16_(q, w[:2], k, pt, sl, out), r"w must have shape \(3, 4\)"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, torch.empty(3, ml - 1)), "multiple of 64"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt[:, :1], sl, out), "max_pages"),
        (lambda: ix.indexer_logits_bf16_(q, w, k.half(), pt, sl, out), "kcache must be torch.float32"),
        (lambda: ix.indexer_logits_bf16_(q.double(), w, k, pt, sl, out), "q must be torch.bfloat16"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt.long(), sl, out), "page_table must be torch.int32"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl[:2], out), "seq_lens must have shape"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl_strided, out), "seq_lens must be contiguous"),
        (lambda: ix.indexer_logits_bf16_(q[..., :16], w, k[..., :16], pt, sl, out), "head dim D=16"),
        (lambda: ix.indexer_logits_bf16_(q[:, :, None], w, k, pt, sl, out), "q must have 3 dims"),
        (lambda: ix.indexer_logits_bf16_(q.transpose(1, 2), w, k, pt, sl, out), "contiguous in its last"),
        (lambda: ix.indexer_logits_bf16_(q, w, k.transpose(1, 2), pt, sl, out), "kcache must have shape"),
        (lambda: ix.indexer_logits_bf16_(q, w, k[:, ::2], pt, sl, out), "kcache must have shape"),
        (lambda: ix.indexer_logits_bf16_(q, w.to("meta"), k, pt, sl, out), "must be on one device"),
        (lambda: ix.indexer_logits_fp8_(q, w, pages, pt, sl, out), "q must be torch.float8_e4m3fn"),
        (lambda: ix.indexer_logits_fp8_(q8, w, pages[:, :-4], pt, sl, out), "pages must have shape"),
        (
            lambda: ix.indexer_logits_fp8_(q8, w, pages.view(torch.int8), pt, sl, out),
            "pages must be torch.uint8",
        ),
        (lambda: ix.indexer_logits_fp8(q8, w, pages, pt, sl, out.double()), "out must be torch.float32"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, out, config=dict(block_t=64)), "tiles_per_prog"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, out, config=dict(cfg, k_load="tmaa")), "k_load"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, out, config=dict(cfg, block_t=96)), "block_t=96"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, out, config=tma128), "64 with k_load"),
        (lambda: ix.indexer_logits_bf16_(q, w, k, pt, sl, out, config=dict(cfg, k_load="gather")), "sm_100"),
        (lambda: ix.indexer_logits_fp8_(q8, w, pages, pt, sl, out, config=prefetch_ptr_k), "scale_load"),
        (lambda: ix.indexer_logits_fp8_(q8, w, pages, pt, sl, out, config=scales_unknown), "scale_load"),
    ]
    for fn, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_launcher_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setattr(lg, "_indexer_logits_kernel", COMPILED_KERNEL)
    x = inputs(bs=1, seq_lens=(5,), heads=4, dim=32)
    out = torch.empty(1, x["max_len"])
    with pytest.raises(ValueError, match="needs CUDA tensors, got cpu"):
        ix.indexer_logits_bf16_(x["q"], x["w"], x["k"], x["page_table"], x["seq_lens"], out)


def test_write_entries_validation_errors():
    kcache = torch.zeros(3, PAGE, 32, dtype=torch.bfloat16)
    pages = ix.quantize_fp8_pages(torch.randn(3, PAGE, 32))
    slots, k = torch.tensor([1, 2]), torch.randn(2, 32)
    bad = [
        (lambda: ix.write_entries_bf16_(kcache.float(), slots, k), "kcache must be torch.bfloat16"),
        (
            lambda: ix.write_entries_bf16_(kcache, slots.float(), k),
            "slots must be torch.int32 or torch.int64",
        ),
        (lambda: ix.write_entries_bf16_(kcache, slots, k[:1]), "k has 1 rows but slots has 2"),
        (lambda: ix.write_entries_bf16_(kcache, slots, k[:, :16]), "kcache must have shape"),
        (lambda: ix.write_entries_bf16_(kcache, slots[:, None], k), "slots must have 1 dims"),
        (lambda: ix.write_entries_fp8_(pages, slots, k[:, :16]), "head dim D=16"),
        (lambda: ix.write_entries_fp8_(pages[:, :-1], slots, k), "pages must have shape"),
        (lambda: ix.write_entries_fp8_(pages, slots, k.int()), "k must be floating point"),
    ]
    for fn, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn()


# ---------------------------------------------------------------- GPU


@pytest.mark.parametrize("dtype", [torch.float32, "fp8"])
def test_programs_per_request_never_change_a_logit(dtype):
    """The differential recomputes with the GPU-filling launch (per_request 0) what the model
    computed with one program per request: the outputs must be equal bit for bit."""
    x = inputs(bs=3, seq_lens=(300, 7, 64), heads=5, dim=32)
    outs = []
    for per_request in (1, 2, 0):
        out = poisoned(3, x["max_len"])
        cfg = dict(block_t=64, tiles_per_prog=2, num_warps=4, num_stages=2, min_programs=0)
        if dtype == "fp8":
            pages = ix.quantize_fp8_pages(x["k"])
            q8 = x["q"].to(torch.float8_e4m3fn)
            lg.indexer_logits_fp8_(
                q8, x["w"], pages, x["page_table"], x["seq_lens"], out, config=cfg, per_request=per_request
            )
        else:
            ix.indexer_logits_bf16_(
                x["q"],
                x["w"],
                x["k"],
                x["page_table"],
                x["seq_lens"],
                out,
                config=cfg,
                per_request=per_request,
            )
        outs.append(out)
    assert not torch.isnan(outs[0]).any()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.gpu
def test_gpu_programs_per_request_never_change_a_logit():
    """On the H200's compiled kernels, at the profile's shape: one program per request (the
    model's launch) and the GPU-filling launch (the differential's recompute) agree bit for bit."""
    code = """
import torch
from kernels import indexer as ix, logits as lg
x = ix.make_inputs(8, [33000, 17000, 1025, 64] * 2, 64, 128, 65536, "cuda", 0)
q, k = x["q"].bfloat16(), x["k"].bfloat16()
pages, q8 = ix.quantize_fp8_pages(x["k"]), x["q"].to(torch.float8_e4m3fn)
args = (x["page_table"], x["seq_lens"])
for name, fn in (
    ("bf16", lambda out, p: ix.indexer_logits_bf16_(q, x["w"], k, *args, out, per_request=p)),
    ("fp8", lambda out, p: lg.indexer_logits_fp8_(q8, x["w"], pages, *args, out, per_request=p)),
):
    outs = []
    for p in (1, 0):
        out = torch.full((8, 65536), float("nan"), device="cuda")
        fn(out, p)
        outs.append(out)
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1]), name
print("ok")
"""
    r = run_without_interpreter(["-c", code], timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_gpu_check_both_dtypes():
    # a fresh process: the real compiled kernels, not this process's interpreted twins
    code = (
        "import kernels.indexer as ix\n"
        "for c in [dict(bs=5), dict(bs=3, seq_lens=[1, 64, 65]), dict(bs=7, heads=32, dim=64),"
        " dict(bs=2, seq_lens=[200, 17], heads=8, max_len=1024)]:\n"
        "    print(c, ix.check('cuda', **c))\n"
    )
    r = run_without_interpreter(["-c", code], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
