"""Notebook 06's targets: transformers' own MoE decoders with the shared expert forked onto a side
stream (examples/audit/hf_moe.py), audited through nblib.instruments.audit.target on the simulator;
and the study behind the notebook (nblib.studies.engines)."""

import pytest
import torch

from nblib.backends.device import get
from nblib.instruments.audit import target as AT
from nblib.studies import engines

MODELS = ("qwen2_moe", "deepseek_v3")
FIXES = ("record_stream", "hold_until_join")


def _audit(target, backend="sim"):
    return AT.audit(f"{engines.HF}:{target}", device=get(backend))


@pytest.mark.parametrize("model", MODELS)
def test_the_buggy_form_has_exactly_the_shared_expert_race(model):
    rep = _audit(model)
    assert rep.status == "hazards" and rep.exit_code == 1 and rep.hazards
    for h in rep.hazards:
        first, second = h.first, h.second
        # the side stream's shared expert reads the normed states ...
        assert (h.kind, first.op, first.stream, first.access) == (
            "write-after-read",
            "aten::mm",
            "side",
            "reads",
        )
        assert first.at.function == "shared_expert" and first.at.file.endswith("hf_moe.py")
        assert first.called_from[0].code.startswith("shared = shared_expert(layer.mlp, hidden_states)")
        # ... which main allocated, and whose last name the routed experts' output took before the join
        t = first.tensor
        assert t.stream == "main" and t.freed
        assert t.allocated_at.code.startswith("hidden_states = layer.post_attention_layernorm(hidden_states)")
        assert t.freed_at.code.startswith("hidden_states = routed_experts(layer.mlp, hidden_states)")
        # main's residual add writes a new tensor in the same bytes
        assert (second.op, second.stream, second.access) == ("aten::add", "main", "writes")
        assert second.at.code.startswith("hidden_states = residual + hidden_states")
        assert h.reused and second.tensor.allocated_at.line == second.at.line
    assert len({(h.first.tensor.name, h.second.tensor.name) for h in rep.hazards}) == 1


@pytest.mark.parametrize("fix", FIXES)
@pytest.mark.parametrize("model", MODELS)
def test_each_fixed_form_is_clean(model, fix):
    rep = _audit(f"{model}_{fix}")
    assert (rep.status, rep.exit_code, rep.hazards) == ("clean", 0, []) and rep.ops > 100


@pytest.mark.parametrize("model", MODELS)
def test_the_wrapper_computes_what_the_library_computes(model):
    """The overlap changes where the shared expert runs, not what the layer returns."""
    hf_moe = AT.load(f"{engines.HF}:qwen2_moe").fn.__globals__
    step = hf_moe["DecodeStep"](get("sim"), model, "buggy")
    step()  # the cache's lazy allocation; then both runs write the same position over the same cache
    step.rewind()
    patched = step().clone()
    for layer in step.model.model.layers:
        del layer.forward  # the library's own forward again
    step.rewind()
    torch.testing.assert_close(step(), patched, rtol=1e-5, atol=1e-5)


def test_without_a_cache_the_simulator_meets_transformers_host_check():
    """transformers skips its packed-sequence check when torch.cuda says a capture is underway; the
    simulator cannot answer torch.cuda, so the check's .all() breaks the capture with rule sync."""
    (f,) = engines.sim_gap(["sim"])
    assert (f.status, f.rule) == ("failed", "sync")
    assert "masking_utils.py" in f.failure and "find_packed_sequence_indices" in f.failure


def test_the_study_audits_and_replays_every_form():
    findings, rows, reports = engines.audit_all(engines.TARGETS[:2], ["sim"], replays=3)
    assert [(f.form, f.status, f.agrees, f.replays) for f in findings] == [
        ("buggy", "hazards", True, 3),
        ("record_stream", "clean", True, 3),
    ]
    assert rows and all(r.first_at.startswith("hf_moe.py:") and r.reused_by != "-" for r in rows)
    assert "SharedExpertOverlap" in engines.source("SharedExpertOverlap")


def test_the_verdict_names_a_wrong_form():
    base = dict(model="m", backend="sim", target="t", hazards=0, tensor_pairs=0, ops=1, seconds=0.1)
    good = engines.Finding(form="buggy", expect="hazards", status="hazards", **{**base, "hazards": 2})
    bad = engines.Finding(form="record_stream", expect="clean", status="hazards", **base)
    assert "1 of 1 buggy forms" in engines.verdict([good, bad])
    assert "nothing in 0 of 1 fixed forms; wrong: m record_stream on sim (hazards)" in engines.verdict(
        [good, bad]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("model", MODELS)
def test_on_cuda_the_buggy_form_races_and_the_fixes_do_not(model):
    rep = _audit(model, "cuda")
    assert rep.status == "hazards"
    assert all(h.first.stream == "side" and h.first.tensor.freed_at is not None for h in rep.hazards)
    for fix in FIXES:
        assert _audit(f"{model}_{fix}", "cuda").status == "clean"


def test_a_buggy_replay_counts_only_beyond_the_fixed_forms_rounding():
    """Graph replays round differently from the eager step (1e-7 on CUDA for every form): only a
    difference beyond what the same model's fixed forms show on the same backend counts."""
    base = dict(model="m", backend="cuda", target="t", tensor_pairs=0, ops=1, seconds=0.1, replays=3)
    buggy = engines.Finding(
        form="buggy", expect="hazards", status="hazards", hazards=2, diffs=[1e-7, 0.5, 0], **base
    )
    fixed = engines.Finding(
        form="record_stream", expect="clean", status="clean", hazards=0, diffs=[1e-7] * 3, **base
    )
    other = engines.Finding(
        **{**base, "model": "n"}, form="buggy", expect="hazards", status="hazards", hazards=1, diffs=[1e-9]
    )
    assert engines.beyond_floor([buggy, fixed]) == (1, 1e-7)
    assert engines.beyond_floor([buggy, fixed, other]) == (2, 1e-7)  # n has no fixed form: any difference
    assert "1 of 3 of the buggy forms' replays differed" in engines.verdict([buggy, fixed])
