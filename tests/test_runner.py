"""nblib.engine.runner: a batch past the largest bucket fails in one line; serial graph references
give the eager step's bits (on the simulator, where the overlapped graphs still race, and on CUDA),
and a serial graph that differs from eager turns the runner back to eager references."""

import pytest
import torch
from sim_steps import batches, sim_model

from nblib.backends import device
from nblib.engine.runner import Runner, bucket_for


def test_a_batch_past_the_largest_bucket_fails_in_one_line():
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(9, [1, 2, 8])


def test_serial_graph_references_give_the_eager_steps_bits_and_still_see_the_race():
    from nblib.engine.runner import Runner, same_bits

    # the racing configuration: its references must not race
    m = sim_model(torch.Generator().manual_seed(0), overlap="on")
    serial = Runner(m, [1, 2, 4, 8], serial_references=True).capture()
    eager = Runner(m, [1, 2, 4, 8], serial_references=False)
    gen, bad = torch.Generator().manual_seed(0), 0
    for b in serial.buckets:
        for args in batches(15, b, gen):
            ref = [t.clone() for t in serial.reference(*args)]
            assert all(same_bits(a, e) for a, e in zip(ref, eager.reference(*args)))
            o, k, _ = serial.run(*args)
            bad += int(not (torch.equal(o, ref[0]) and torch.equal(k, ref[1])))
    assert serial.serial_checks == dict.fromkeys([1, 2, 4, 8], True) and set(serial._serial) == {1, 2, 4, 8}
    assert not eager._serial and bad > 0
    assert {a["first"] for a in serial.aliases()} == {"indexer.logits"}  # the serial captures' notes dropped


def test_a_serial_graph_that_differs_from_eager_turns_the_runner_back_to_eager(monkeypatch):
    import contextlib

    from nblib.engine.model import DecodeModel
    from nblib.engine.runner import Runner

    serial = DecodeModel.serial

    @contextlib.contextmanager
    def doubled_output(self):  # the capture reads other weights than the eager step
        w_o = self.w_o
        self.w_o = w_o * 2
        with serial(self):
            yield
        self.w_o = w_o

    monkeypatch.setattr(DecodeModel, "serial", doubled_output)
    m = sim_model(torch.Generator().manual_seed(0), overlap="off")
    r = Runner(m, [2], serial_references=True)
    args = next(batches(1, 2, torch.Generator().manual_seed(0)))
    with pytest.warns(UserWarning, match="eager references from here on"):
        out, topk = r.reference(*args)
    assert r.serial_checks == {2: False} and not r.serial_references and not r._serial
    expect = Runner(m, [2], serial_references=False).reference(*args)
    assert torch.equal(out, expect[0]) and torch.equal(topk, expect[1])


SERIAL_KNOBS = [{"index_dtype": "bf16"}, {"index_dtype": "fp8"}, {"topk_kernel": "triton"}]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", SERIAL_KNOBS, ids=["bf16", "fp8", "triton"])
def test_cuda_serial_graph_references_give_the_eager_steps_bits(knobs):
    from models import GRAPH

    from nblib.engine import build
    from nblib.engine.runner import same_bits

    dev = device.get("cuda")
    m = build.model(dev, dict(GRAPH, num_pages=256, **knobs))  # overlap on: the racing configuration
    m.prefill_entries(torch.arange(64, 256 * 64, device="cuda"), torch.Generator("cuda").manual_seed(0))
    serial = Runner(m, [1, 2, 4, 8]).capture()  # serial references by default on CUDA
    eager = Runner(m, [1, 2, 4, 8], serial_references=False)
    gen = torch.Generator().manual_seed(0)
    for b in serial.buckets:
        for _ in range(5):
            args = (
                torch.randint(0, 512, (b,), generator=gen),
                torch.randint(1, 256, (b, 16), generator=gen, dtype=torch.int32),
                torch.randint(1, 16 * 64, (b,), generator=gen, dtype=torch.int32),
                torch.full((b,), 63),
            )
            args = tuple(a.cuda() for a in args)
            ref = [t.clone() for t in serial.reference(*args)]
            assert all(same_bits(a, e) for a, e in zip(ref, eager.reference(*args))), (b, knobs)
    assert serial.serial_references and serial.serial_checks == {1: True, 2: True, 4: True, 8: True}
