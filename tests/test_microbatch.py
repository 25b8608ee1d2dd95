"""Two overlapped micro-batches on the persistent-buffer fix (nblib.studies.microbatch): sharing one
model-wide set of buffers races on the logits buffer between their side streams; a set each does not."""

import pytest
import torch

from nblib.backends.sim import SimDevice
from nblib.core.paths import ROOT
from nblib.schema import params as P
from nblib.studies import microbatch

CI_MODEL = P.load(ROOT / "params" / "ci.yaml")["model"]


@pytest.fixture(scope="module")
def runs():
    return microbatch.audits(SimDevice(seed=0), CI_MODEL, bucket=4)


def test_the_shared_buffer_is_written_by_both_side_streams_unordered(runs):
    rep = runs["shared"].report
    assert rep.status == "hazards"
    logits_bytes = 4 * CI_MODEL["max_ctx"] * torch.float32.itemsize
    for h in rep.hazards:
        assert h.nbytes == logits_bytes and h.first.tensor.persistent and h.second.tensor.persistent
        assert h.first.stream != h.second.stream
        assert h.addr in runs["shared"].buffers  # the bytes of the one persistent buffer
    assert {h.kind for h in rep.hazards} == {"write-after-write", "read-after-write", "write-after-read"}
    waw = [h for h in rep.hazards if h.kind == "write-after-write"]
    assert [(h.first.op, h.second.op) for h in waw] == [("csi::indexer_logits_bf16",) * 2]


def test_a_buffer_set_per_micro_batch_leaves_nothing_to_race(runs):
    assert runs["per micro-batch"].report.status == "clean"
    assert len(runs["per micro-batch"].buffers) == 2  # two buffers, at two addresses


def test_the_rows_and_the_verdict_say_it(runs):
    rows = {r["layout"]: r for r in microbatch.rows(runs)}
    assert rows["shared"]["hazards"] == 3 and rows["per micro-batch"]["hazards"] == 0
    assert "write-after-write" in rows["shared"]["kinds"]
    text = microbatch.verdict(runs)
    assert "a persistent buffer is a fix per stream of use" in text and "1 a write-after-write" in text


def test_an_unknown_layout_is_refused_in_one_line():
    with pytest.raises(
        ValueError, match="unknown buffer layout 'one': choose one of shared, per micro-batch"
    ):
        microbatch.step(SimDevice(seed=0), CI_MODEL, 4, "one")
