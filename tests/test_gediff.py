"""The graph-vs-eager differential (nblib.instruments.gediff) on the simulator: a planted logits
mismatch is caught; clean is clean; each design's stash is what it says (where it lives, who
allocated it, copies or references); an unknown design fails in one line."""

import pytest
import torch
from models import CANARY, CANARY_WORKLOAD, DIFFERENTIAL

from nblib.backends import device
from nblib.backends.device import get
from nblib.engine import build
from nblib.engine.build import full_batch
from nblib.engine.runner import Runner
from nblib.instruments import gediff
from nblib.instruments.gediff import GEDiff


def _captured(bucket=2):
    dev = device.get("sim")
    m = build.model(dev, CANARY, overlap="off")
    gd = GEDiff(m)
    runner = Runner(m, [bucket]).capture()
    args = full_batch(m, bucket)
    runner.run(*args)
    return m, gd, runner, args


def test_clean_replay_agrees_then_a_planted_mismatch_is_caught():
    m, gd, runner, args = _captured()
    rec = gd.compare(2, rows=2)
    assert not rec["diverged"] and rec["max_abs"] == 0
    logits = gd.stash[2]["logits"]
    top = set(gd.recompute(2)[0].topk(m.cfg.topk).indices.tolist())
    j = next(t for t in range(int(args[2][0])) if t not in top)
    logits[0, j] = 1e30  # the plant: one entry of row 0 jumps to the top
    rec = gd.compare(2, rows=2)
    assert rec["diverged"] and rec["max_abs"] > 1e29
    assert (rec["argmax_rows"], rec["topk_rows"]) == (1, 1)
    assert len(gd.lines) == 2 and "argmax differs 1/2" in gd.lines[-1]
    assert gd.table()[0]["diverged"] == 1


def test_replay_refreshes_the_stash():
    m, gd, runner, args = _captured()
    gd.stash[2]["logits"].fill_(7.0)  # stale stash...
    runner.run(*args)  # ...overwritten by the captured clone
    assert not gd.compare(2, rows=2)["diverged"]


def test_unknown_bucket_names_the_captured_ones():
    m, gd, runner, args = _captured()
    with pytest.raises(KeyError, match=r"bucket 4.*\[2\]"):
        gd.lookup(4)
    with pytest.raises(ValueError, match="already"):
        GEDiff(m)


def test_metrics_nan_and_inf():
    g = torch.tensor([[float("-inf"), 1.0, float("nan")]])
    e = torch.tensor([[float("-inf"), 1.0, 2.0]])
    m = gediff.metrics(g, e, 2)
    assert m["max_abs"] == float("inf") and m["diverged"]
    assert gediff.metrics(e, e.clone(), 2) == dict(max_abs=0.0, argmax_rows=0, topk_rows=0, diverged=False)


def test_clean_workload_no_divergence():
    dev = device.get("sim")
    m = build.model(dev, CANARY, overlap="off")
    gd = GEDiff(m)
    r, _ = build.bucket_run(Runner(m, [1, 2]).capture(), CANARY_WORKLOAD, 2, [gd], seed=1)
    s = gd.summary()
    assert r["corrupted_sessions"] == 0 and s["comparisons"] == r["steps"] and s["diverged"] == 0


def _full_width_metrics(g, e, k):
    """The figures over every column of every row: what metrics must equal, whatever it skips."""
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    diff = (g - e).abs()
    diff = torch.where(same, torch.zeros_like(g), torch.where(torch.isnan(diff), float("inf"), diff))
    row_max = diff.amax(1) if diff.numel() else diff.new_zeros(g.shape[0])
    argmax = g.argmax(1) != e.argmax(1)
    kg, ke = (gediff.kx.topk_indices(x.contiguous(), k).sort(1).values for x in (g, e))
    topk = (kg != ke).any(1)
    max_abs = float(row_max.max()) if row_max.numel() else 0.0
    figures = dict(max_abs=max_abs, argmax_rows=int(argmax.sum()), topk_rows=int(topk.sum()))
    return dict(**figures, diverged=bool(max_abs > 0 or argmax.any() or topk.any()))


def _lost_races(gen, bs, width=8192):
    """Eager rows of random lengths, -inf past them; graph rows clean, or with a lost race's garbage
    across the whole row, a NaN or a finite value past the live entries, a changed logit."""
    e = torch.full((bs, width), float("-inf"))
    lens = torch.randint(0, width, (bs,), generator=gen)
    for r in range(bs):
        e[r, : lens[r]] = torch.randn(int(lens[r]), generator=gen)
    g = e.clone()
    for r, kind in enumerate(torch.randint(0, 6, (bs,), generator=gen).tolist()):
        at = int(torch.randint(0, width, (), generator=gen))
        if kind == 1:
            g[r] = torch.randn(width, generator=gen)
        elif kind in (2, 3):
            g[r, at] = float("nan") if kind == 2 else 5.0
        elif kind == 4 and lens[r] > 0:
            g[r, 0] += 1e-3
        elif kind == 5:
            e[r, at] = float("nan")
    return g, e


def test_metrics_over_each_rows_live_prefix_equal_the_full_width_figures():
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(80):
        g, e = _lost_races(gen, int(torch.randint(0, 9, (), generator=gen)))
        want = _full_width_metrics(g, e, 16)
        assert gediff.metrics(g, e, 16) == want
        seen.add(want["diverged"])
    assert seen == {True, False}  # both kinds of case were compared


BUCKET = 4


INPUTS = ("q", "head_w", "page_table", "seq_lens")


def _captured_design(design, **knobs):
    dev = get("sim")
    m = build.model(dev, DIFFERENTIAL, **{"index_dtype": "bf16", "overlap": "on", **knobs})
    gd = GEDiff(m, design=design)
    m.prepare(BUCKET)  # what Runner.capture does first; prealloc makes its stash here
    before = {k: dict(v) for k, v in gd.stash.items()}
    runner = Runner(m, [BUCKET]).capture()
    return dev, m, gd, runner, before


def _block(dev, t):
    b = dev.block_of(t)
    assert b is not None, "the stash tensor should sit on an allocated block"
    return b


def test_campaign_allocates_copies_in_the_graph_pool_on_the_side_stream():
    dev, m, gd, runner, before = _captured_design("campaign")
    assert not before
    s = gd.stash[BUCKET]
    assert s["page_table"].data_ptr() != runner.static[BUCKET].page_table.data_ptr()  # a copy
    for name in (*INPUTS, "logits"):
        b = _block(dev, s[name])
        assert b.pool.pool_id == runner.pool and b.stream is m.side, name


def test_prealloc_stash_is_made_before_capture_outside_the_graph_pool():
    dev, m, gd, runner, before = _captured_design("prealloc")
    s = gd.stash[BUCKET]
    assert set(before) == {BUCKET}
    for name in (*INPUTS, "logits"):
        assert s[name] is before[BUCKET][name], name  # the same buffers, filled by captured copies
        # made outside capture: not a block of the capture's allocator (the simulator's arena)
        assert not dev.arena.owns(s[name]) and dev.block_of(s[name]) is None, name
    # the copies are captured: a replay fills the buffer with that replay's page table
    batch = build.full_batch(m, BUCKET, ctx=256)
    runner.run(*batch)
    assert torch.equal(s["page_table"], runner.static[BUCKET].page_table)


def test_main_stash_clones_the_inputs_on_the_main_stream_and_the_logits_on_the_side():
    dev, m, gd, runner, _ = _captured_design("main_stash")
    s = gd.stash[BUCKET]
    for name in INPUTS:
        b = _block(dev, s[name])
        assert b.pool.pool_id == runner.pool and b.stream is not m.side, name
    b = _block(dev, s["logits"])
    assert b.pool.pool_id == runner.pool and b.stream is m.side


def test_refs_keeps_the_graphs_own_tensors_and_so_the_logits_block():
    dev, m, gd, runner, _ = _captured_design("refs")
    s = gd.stash[BUCKET]
    assert s["page_table"] is runner.static[BUCKET].page_table
    assert s["seq_lens"] is runner.static[BUCKET].seq_lens
    noted = [n for n in m.captures if n["tensor"] == "indexer.logits" and n["bucket"] == BUCKET]
    assert [n["addr"] for n in noted] == [s["logits"].data_ptr()]  # the engine's own transient
    assert _block(dev, s["logits"]).allocated  # kept: the allocator cannot hand it on
    assert not runner.aliases()
    # without the differential the same capture hands the freed logits block to the main stream
    off = build.model(get("sim"), DIFFERENTIAL, index_dtype="bf16", overlap="on")
    assert any(a["first"] == "indexer.logits" for a in Runner(off, [BUCKET]).capture().aliases())


def test_an_unknown_design_fails_in_one_line():
    m = build.model(device.get("sim"), DIFFERENTIAL)
    with pytest.raises(ValueError, match="unknown differential design 'clone'.*campaign"):
        GEDiff(m, design="clone")
