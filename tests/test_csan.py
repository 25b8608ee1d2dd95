"""nblib.instruments.csan: torch's CUDA sanitizer, each run in a child process, gives the race and its
fixes the same verdict on CUDA; a child past its time limit, and a machine without a GPU, fail in one
line."""

import pytest
import torch
from models import TINY

# the gpu profile's model (small cache): its captures alias the logits with the MLP on the H200
GPU_MODEL = dict(
    heads=64, dim=128, topk=512, max_ctx=65536, d_model=4096, ffn=32768, num_pages=512, vocab=4096
)


@pytest.mark.gpu
def test_cuda_sanitizer_cannot_tell_the_race_from_the_fixes():
    """CSAN (each run in its own process) reports its control race; it flags the buggy capture and
    the record_stream fix alike at the logits' hand-off (torch.empty on main, the indexer's write
    on side), and flags the persistent buffer too, after a capture whose side-stream work it never
    sees joined. The audit (tests/test_audit.py::test_cuda_model_configurations) separates all three."""
    from nblib.instruments import csan

    # three children, each within 150 s: the whole comparison fits a 10-minute job
    runs = {r["logits_policy"]: r for r in csan.compare(GPU_MODEL, [2, 32, 64], timeout=150)}
    assert all(r["control"]["reported"] for r in runs.values()), runs
    for p in ("transient", "record_stream"):
        assert csan.kernels(runs[p]["errors"][0]) == ("csi::indexer_logits_bf16", "aten::empty.memory_format")
    assert runs["persistent"]["errors"], runs["persistent"]
    assert csan.describe(list(runs.values())).startswith("CSAN gives the bug and the fixes the same verdict")


def test_a_csan_child_past_its_time_limit_fails_in_one_line(monkeypatch):
    import subprocess

    from nblib.instruments import csan

    def too_slow(cmd, timeout, **_):
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(csan.device, "get", lambda name: None)
    monkeypatch.setattr(subprocess, "run", too_slow)
    with pytest.raises(RuntimeError, match=r"CSAN child process ran past 7 s \(transient, buckets \[2\]\)"):
        csan.compare(TINY, [2], timeout=7)


def test_csan_without_a_gpu_fails_in_one_line_before_starting_a_child(monkeypatch):
    import subprocess

    from nblib.instruments import csan

    if torch.cuda.is_available():
        pytest.skip("CSAN runs where there is CUDA")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("started a child process"))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        csan.sanitize(TINY, [2])
