"""nblib.studies.forced: notebook 03's forced order over the miniature's captures, bucket by bucket."""

import pytest

from nblib.backends import device
from nblib.core.paths import ROOT
from nblib.schema import params as P
from nblib.studies import forced

RACY = dict(index_dtype="bf16", overlap="on", logits_policy="transient")


def _ci():
    prof = P.load(ROOT / "params" / "ci.yaml")
    return prof["model"], prof["buckets"], prof["workload"]


def _check(backend, **shapes):
    model, buckets, workload = _ci()
    model = {**model, **shapes}
    dev = device.get(backend)
    rows = forced.confirm_buckets(dev, model, buckets, RACY, ctx=forced.longest_ctx(workload), replays=3)
    assert rows, "the racy configuration's captures name no hazard"
    assert {r.bucket for r in rows} <= set(buckets)
    assert all(r.replays == 3 and 0 <= r.differing <= 3 and 0 <= r.natural <= 3 for r in rows)
    assert any(r.confirmed for r in rows), [r.model_dump() for r in rows]
    return rows


def test_the_racy_configuration_has_a_hazard_the_forced_order_confirms_on_the_simulator():
    _check("sim")


@pytest.mark.gpu
def test_on_cuda_every_bucket_replays_under_the_forced_order_from_live_static_inputs():
    # CUDA captures the step again for each forced schedule: that runner's static batch must outlive
    # its graph, or a replay reads page tables from bytes the allocator gave to another tensor.
    # The Triton top-k: on full batches of the longest contexts the ci profile's natural replays lose
    # the race while torch.topk reads its row, and torch.topk's radix select asserts on the device
    # when the row changes between its passes ("writeIndex < outputSliceSize"), which ends the CUDA
    # context: a lost race that aborts the process instead of corrupting a value
    _check("cuda", topk_kernel="triton")


def _design_runner(backend, design, **shapes):
    """A differential design's model and runner, captured under the recorder as notebook 02 does."""
    from nblib.engine import build
    from nblib.engine.runner import Runner
    from nblib.instruments import audit
    from nblib.instruments.gediff import GEDiff

    model, buckets, workload = _ci()
    dev = device.get(backend)
    m = build.model(dev, {**model, **shapes}, **RACY)
    GEDiff(m, design=design)
    with audit.recording(dev) as rec:
        runner = Runner(m, buckets).capture(record=rec)
    report = rec.report(names=m.captures)
    hazardous = sorted({h.bucket for h in report.hazards})
    assert hazardous, "the racy configuration's captures name no hazard"
    return dev, m, runner, report, hazardous, forced.longest_ctx(workload)


@pytest.mark.parametrize("design", ["campaign", "prealloc"])
def test_a_design_s_bucket_is_captured_again_through_a_runner_with_its_hazards(design):
    # CUDA forces an order by capturing the bucket again with a spin before the delayed op; a
    # differential's hooks need the runner's bucket while capturing, so the step cannot be captured
    # alone. The simulator's recorder calls no before_op (it delays a replay's node instead).
    dev, m, runner, report, hazardous, ctx = _design_runner("sim", design)
    b = hazardous[-1]
    first = forced.captured_bucket(dev, m, runner, report, b, ctx)
    again = first.recapture(lambda i: None)
    assert [(h.first.index, h.second.index, h.kind) for h in again.hazards] == [
        (h.first.index, h.second.index, h.kind) for h in first.hazards
    ]


@pytest.mark.gpu
def test_on_cuda_a_differential_design_replays_under_the_forced_order():
    dev, m, runner, report, hazardous, ctx = _design_runner("cuda", "campaign", topk_kernel="triton")
    arm = forced.arm_check(dev, m, runner, report, hazardous, ctx, replays=3)
    assert arm.schedules > 0 and arm.replays > 0, arm
