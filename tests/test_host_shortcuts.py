"""Host shortcuts return what the slower path returns, bit for bit: the simulator's replayed ops
(nblib.backends.sim.fastops) and the canary's checksums on the CPU (canary.host_page_checksums)."""

import pytest
import torch

from kernels import indexer as kx
from nblib.backends.sim import fastops
from nblib.core import live
from nblib.instruments import canary

NEG_INF = float("-inf")


def _logits(bs, width=16384, seed=0, short_rows=()):
    """Indexer-like logits: a few hundred live columns per row, -inf after; rows in short_rows hold
    one live entry (a graph's padding rows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((bs, width), NEG_INF)
    for b in range(bs):
        n = 1 if b in short_rows else int(torch.randint(100, 700, (1,), generator=g))
        x[b, :n] = torch.randn(n, generator=g)
    return x


def _same_topk(x, k):
    v1, i1 = torch.topk(x, k)
    v2, i2 = fastops.topk(x, k)
    assert torch.equal(v1.nan_to_num(), v2.nan_to_num()) and torch.equal(i1, i2)


@pytest.mark.parametrize("bs", [1, 8, 40])
def test_topk_matches_torch_on_live_prefix(bs):
    x = _logits(bs, short_rows={2, 5})
    assert live.live_columns(x, 16) == live.CHUNK  # every live entry is in the first chunk
    _same_topk(x, 16)


@pytest.mark.parametrize("where", [0, 5000, 16383])
def test_garbage_past_the_live_entries_is_searched(where):
    """A lost race writes anywhere: a NaN or a large value past the live entries must count."""
    for bad in (float("nan"), 1e30, -1e30):
        x = _logits(4)
        x[1, where] = bad
        assert live.live_columns(x, 16) == (where // live.CHUNK + 1) * live.CHUNK
        _same_topk(x, 16)


def test_whole_row_corruption_and_odd_shapes_fall_back():
    x = torch.randn(3, 16384)
    assert live.live_columns(x, 16) == 16384
    _same_topk(x, 16)
    odd = _logits(2, width=1000)
    assert live.live_columns(odd, 16) == 1000  # not a multiple of CHUNK: the whole row
    assert live.live_columns(_logits(2).bfloat16(), 16) == live.CHUNK
    assert live.live_columns(torch.full((2, 4096), NEG_INF), 2000) == 2048  # at least k columns


def test_the_contract_is_the_same_from_the_prefix():
    """The model's eager top-k takes the prefix; the contract (indices, -1 for -inf) is unchanged."""
    x = _logits(8, short_rows={0, 7})
    n = live.live_columns(x, 16)
    assert torch.equal(kx.topk_indices(x, 16), kx.topk_indices(x[:, :n], 16))


def test_replayed_topk_node_runs_the_shortcut():
    assert fastops.shortcut(torch.ops.aten.topk.default) is not torch.ops.aten.topk.default
    assert fastops.shortcut(torch.ops.aten.mm.default) is torch.ops.aten.mm.default


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_host_checksums_equal_the_torch_ones(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "bf16":
        cache = (torch.randn(300, 64, 128, generator=g) * 1e4).bfloat16()  # large words: products wrap
    else:
        cache = torch.randint(0, 256, (300, kx.fp8_page_bytes(128)), generator=g, dtype=torch.uint8)
    ids = torch.tensor([0, 5, 17, 299])
    assert torch.equal(canary.host_page_checksums(cache), canary.page_checksums(cache))
    assert torch.equal(canary.host_page_checksums(cache, ids), canary.page_checksums(cache, ids))
    before = canary.host_page_checksums(cache, ids)
    cache.view(torch.uint8).view(-1)[17 * cache[0].numel() * cache.element_size() + 3] ^= 1  # one bit
    assert (canary.host_page_checksums(cache, ids) != before).tolist() == [False, False, True, False]


def test_differential_figures_equal_the_whole_row_ones(monkeypatch):
    """gediff.metrics on the CPU reads the live prefix only: the same figures as over every column."""
    from nblib.instruments import gediff

    g = _logits(8, width=4 * live.CHUNK, short_rows={3})
    edits = [
        lambda e: None,
        lambda e: e[1, 50].add_(0.5),  # a value, not the set
        lambda e: e[2, 3000].fill_(7.0),  # garbage past the live entries
        lambda e: e[0, 5].fill_(float("nan")),
        lambda e: e[3].fill_(NEG_INF),  # a row emptied
    ]
    for edit in edits:
        e = g.clone()
        edit(e)
        got = gediff.metrics(g, e, 16)
        with monkeypatch.context() as mp:
            # every row measured across every column
            mp.setattr(gediff, "live_ends", lambda x, k: torch.full((len(x),), x.shape[1], dtype=torch.int64))
            assert got == gediff.metrics(g, e, 16)
