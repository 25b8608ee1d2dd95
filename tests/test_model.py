"""nblib.engine.model: a bad choice fails in one line naming the valid ones; the eager step computes
what the model's definition says; models of the same shapes share one weight set, and a weight folder
hands a drawn set to the next process."""

from types import SimpleNamespace

import pytest
import torch
from plain_refs import plain_ref_bf16, topk_contract

from nblib.backends import device
from nblib.engine.model import ModelConfig


def test_bad_model_choices_fail_in_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match="bf16, fp8"):
        ModelConfig(index_dtype="fp16")
    with pytest.raises(ValueError, match="on, off"):
        ModelConfig(overlap="maybe")
    with pytest.raises(ValueError, match="transient, persistent"):
        ModelConfig(logits_policy="pooled")


def test_eager_step_matches_direct_reference(tiny_model):
    m = tiny_model
    bs, seq = 3, torch.tensor([700, 65, 1], dtype=torch.int32)
    table = torch.zeros(bs, m.cfg.max_ctx // 64, dtype=torch.int32)
    table[:, :11] = torch.arange(1, 1 + bs * 11, dtype=torch.int32).view(bs, 11)
    m.prefill_entries(torch.arange(64, 64 * (1 + bs * 11)), torch.Generator().manual_seed(3))
    tokens = torch.tensor([5, 6, 7])
    stores = torch.full((bs,), 63)
    out, topk = m.step(tokens, table, seq, stores)
    x = m.embed[tokens]
    q = (x @ m.w_q).view(bs, m.cfg.heads, m.cfg.dim)
    logits = plain_ref_bf16(q, (x @ m.w_head).float(), m.index_cache, table, seq, m.cfg.max_ctx)
    assert torch.equal(topk, topk_contract(logits, m.cfg.topk))
    assert (topk[2] >= 0).sum() == 1 and (topk[1] >= 0).sum() == 32  # only live entries selected
    assert out.shape == (bs, m.cfg.d_model) and torch.isfinite(out.float()).all()


def test_models_of_the_same_shapes_share_one_weight_set_and_its_digest():
    from nblib.engine import references
    from nblib.engine.model import DecodeModel

    dev = device.get("sim")
    shapes = dict(heads=2, dim=16, topk=4, max_ctx=256, d_model=32, ffn=64, num_pages=16, vocab=32)
    a = DecodeModel(ModelConfig(**shapes, overlap="on"), dev)
    b = DecodeModel(ModelConfig(**shapes, overlap="off", logits_policy="persistent", index_dtype="fp8"), dev)
    c = DecodeModel(ModelConfig(**shapes, seed=1), dev)
    assert a.w_up is b.w_up and a.weight_set is b.weight_set
    assert a.index_cache is not b.index_cache  # caches are each model's own
    assert not torch.equal(a.w_up, c.w_up)
    assert references.weights_digest(a) == references.weights_digest(b) != references.weights_digest(c)
    again = ModelConfig(**shapes)
    fresh = SimpleNamespace(weight_set=type(a.weight_set)(a.weight_set.tensors))
    assert references.weights_digest(fresh) == references.weights_digest(DecodeModel(again, dev))


def test_a_weight_folder_hands_a_drawn_set_to_the_next_process(tmp_path, monkeypatch):
    from nblib.engine import model as engine

    dev = device.get("sim")
    shapes = dict(heads=2, dim=16, topk=4, max_ctx=256, d_model=32, ffn=64, num_pages=16, vocab=32)
    monkeypatch.setattr(engine, "_WEIGHT_SETS", engine.OrderedDict())
    monkeypatch.setattr(engine, "WEIGHT_FOLDER", [None])
    engine.keep_weights_in(tmp_path)
    drawn = engine.DecodeModel(ModelConfig(**shapes), dev).weight_set.tensors
    assert len(list(tmp_path.glob("weights-*.pt"))) == 1
    engine._WEIGHT_SETS.clear()  # as in the next notebook's process
    monkeypatch.setattr(engine, "_draw_weights", lambda cfg, d: pytest.fail("drew a set the folder held"))
    read = engine.DecodeModel(ModelConfig(**shapes, overlap="off"), dev).weight_set.tensors
    assert read.keys() == drawn.keys()
    assert all(torch.equal(read[k], drawn[k]) for k in drawn if k != "w_trunk")
    assert all(torch.equal(a, b) for a, b in zip(read["w_trunk"], drawn["w_trunk"]))
    with pytest.raises(pytest.fail.Exception, match="drew"):  # another seed is another file
        engine.DecodeModel(ModelConfig(**shapes, seed=1), dev)
