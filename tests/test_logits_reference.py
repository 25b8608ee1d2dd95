"""The torch references of the logits kernel (kernels.logits.ref_logits_*) are what the CPU simulator
computes for the indexer, in every replay and every eager reference step, so a faster formulation
must return the same bits as the plain one. The plain formulation (tests/plain_refs.py) is written
from the cache's layout alone (no helper of kernels.logits): each live entry gathered from its page
and slot, the scores as q @ k^T, then the weighted head sum over a contiguous copy (the simulator's
bf16 GEMM sums in fp32 in an order its operands' layout decides, so the plain form multiplies in the
reference's order). The references are compared with it bit for bit on inputs
shaped like the sim profile (4 heads of 128, bf16 cache, page tables with live prefixes and garbage
past them, lengths of every kind) at every bucket size from 1 to 40."""

import functools

import pytest
import torch
from plain_refs import plain_ref_bf16, plain_ref_fp8

from kernels import e4m3
from kernels import logits as lg
from kernels.paged import PAGE, quantize_fp8_pages

NUM_PAGES, HEADS, DIM = 3000, 4, 128  # params/sim.yaml's cache and indexer


@functools.cache
def sim_cache(scale):
    """A bf16 cache of NUM_PAGES pages (drawn once a module: 24M values)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(NUM_PAGES, PAGE, DIM, generator=g) * scale).to(torch.bfloat16)


def sim_inputs(bs, seed, heads=HEADS, scale=1.0, max_pages=64):
    """The cache, live page ids drawn without repeats inside a request and garbage (out of range)
    past its length, lengths from 0 to past a page boundary."""
    g = torch.Generator().manual_seed(seed)
    kcache = sim_cache(scale)
    q = torch.randn(bs, heads, DIM, generator=g).to(torch.bfloat16)
    w = torch.randn(bs, heads, generator=g) * scale
    seq_lens = torch.randint(0, PAGE * (max_pages - 2), (bs,), generator=g, dtype=torch.int32)
    seq_lens[0] = [1, PAGE, PAGE + 1, 600, 0][seed % 5]  # page edges and an empty request
    page_table = torch.stack([torch.randperm(NUM_PAGES, generator=g)[:max_pages] for _ in range(bs)]).int()
    dead = torch.arange(max_pages)[None, :] * PAGE >= seq_lens[:, None]
    page_table[dead] = NUM_PAGES + 12345  # a stray read of a dead page would fail
    return q, w, kcache, page_table, seq_lens


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("bs", range(1, 41))
def test_bf16_reference_is_bit_identical_to_the_plain_one(bs):
    for seed, max_len in ((bs, PAGE * 64), (bs + 100, 131072)):  # 131072: the sim profile's max_ctx
        args = sim_inputs(bs, seed)
        new = lg.ref_logits_bf16(*args, max_len)
        assert same_bits(new, plain_ref_bf16(*args, max_len))
        assert torch.isneginf(new[0, int(args[-1][0]) :]).all()


@pytest.mark.parametrize("heads", [1, 8, 16])
@pytest.mark.parametrize("bs", [1, 2, 40])
def test_bf16_reference_identity_holds_at_other_heads_and_magnitudes(bs, heads):
    for seed, scale in enumerate((1.0, 100.0, 1e-3)):
        args = sim_inputs(bs, seed, heads=heads, scale=scale)
        assert same_bits(lg.ref_logits_bf16(*args, PAGE * 64), plain_ref_bf16(*args, PAGE * 64))


@pytest.mark.parametrize("bs", [1, 3, 8, 24, 40])
def test_fp8_reference_is_bit_identical_to_the_plain_one(bs):
    q, w, kcache, page_table, seq_lens = sim_inputs(bs, seed=7 * bs)
    pages = quantize_fp8_pages(kcache.float())
    q8 = q.to(torch.float8_e4m3fn)
    new = lg.ref_logits_fp8(q8, w, pages, page_table, seq_lens, PAGE * 64)
    assert same_bits(new, plain_ref_fp8(q8, w, pages, page_table, seq_lens, PAGE * 64))


def test_the_comparison_sees_one_flipped_bit():
    """same_bits is no weaker than the claim: the last bit of one logit makes it fail."""
    args = sim_inputs(8, seed=3)
    ref = lg.ref_logits_bf16(*args, PAGE * 64)
    flipped = ref.clone()
    flipped.view(torch.int32)[0, 0] ^= 1
    assert not same_bits(flipped, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_the_e4m3_table_gives_the_bits_of_torchs_conversion_for_every_byte(dtype):
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    pages = every.repeat(3, 2)[:, 1:-3]  # a strided slice, as of the gathered pages' value bytes
    want = pages.view(torch.float8_e4m3fn).to(dtype)
    got = e4m3.e4m3_to(pages, dtype)
    assert got.dtype == dtype and got.shape == pages.shape
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_e4m3_pair_table_gives_torchs_bits_for_every_pair_of_bytes_and_odd_counts(dtype):
    i = torch.arange(65536)
    pairs = torch.stack([i & 0xFF, i >> 8], dim=1).to(torch.uint8)  # every (first, second) byte pair
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
    for raw in (pairs, pairs.view(-1)[1:-2], pairs.view(-1)[1:-1]):  # pairs, an odd count, an odd offset
        want = raw.view(torch.float8_e4m3fn).to(dtype)
        got = e4m3.e4m3_to(raw, dtype)
        assert got.shape == raw.shape and torch.equal(got.view(bits), want.view(bits))
