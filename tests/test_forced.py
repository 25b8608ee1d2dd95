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
