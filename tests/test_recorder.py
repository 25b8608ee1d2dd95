"""The trace recorders (nblib.instruments.audit.trace) install their patches and give them back,
patch nothing for longer than a recording, hold nothing of it afterwards, never make the audited
capture fail where a plain one would not, and refuse an unknown backend."""

import gc
import types
import weakref

import pytest
import torch
import triton

from nblib.backends.sim import SimDevice
from nblib.instruments import audit
from nblib.instruments.audit import trace

CUDA_NAMES = [
    (torch.cuda.CUDAGraph, "capture_begin"),
    (torch.cuda.CUDAGraph, "capture_end"),
    (torch.cuda.Event, "record"),
    (torch.cuda.Event, "wait"),
    (torch.cuda.Stream, "wait_event"),
    (torch.cuda.Stream, "wait_stream"),
    (torch.cuda.Stream, "record_event"),
]


def _cuda_originals():
    return [owner.__dict__[name] for owner, name in CUDA_NAMES]


class Boom(Exception):
    pass


def test_sim_recording_of_a_raising_function_removes_its_capture_hook():
    dev = SimDevice()
    with pytest.raises(Boom), audit.recording(dev) as rec:
        assert dev.capture_hooks == [rec]  # installed while recording
        with dev.graph(dev.CUDAGraph()):
            torch.ones(3) * 2
            raise Boom
    assert dev.capture_hooks == []
    assert rec.captures and not rec.captures[0].complete
    # torch._C._len_torch_dispatch_stack: private, no public API (tests/test_private_api.py)
    assert torch._C._len_torch_dispatch_stack() == 0 and not dev.is_capturing()


def test_audit_capture_of_a_raising_function_removes_its_capture_hook():
    dev = SimDevice()

    def bad():
        torch.ones(3) * 2
        raise Boom("no")

    with pytest.raises(audit.AuditCaptureError, match="Boom"):
        audit.audit_capture(bad, device=dev)
    assert dev.capture_hooks == []


def test_cuda_recording_restores_its_patches_when_the_block_raises():
    """Runs on any machine: the CUDA recorder's wrappers and Triton hook come off when the block raises."""
    before = _cuda_originals()
    hooks = list(triton.knobs.runtime.launch_enter_hook.calls)
    with pytest.raises(Boom), audit.recording(types.SimpleNamespace(name="cuda")):
        assert all(a is not b for a, b in zip(_cuda_originals(), before))
        raise Boom
    assert all(a is b for a, b in zip(_cuda_originals(), before))
    assert triton.knobs.runtime.launch_enter_hook.calls == hooks


def test_a_half_installed_recording_undoes_what_it_installed(monkeypatch):
    before = _cuda_originals()

    def fail_after_the_graph_hooks(self, *a):
        if len(self._undo) >= 2:
            raise Boom("install failed")
        return orig(self, *a)

    orig = trace.Recording._patch
    monkeypatch.setattr(trace.Recording, "_patch", fail_after_the_graph_hooks)
    with pytest.raises(Boom):
        audit.recording(types.SimpleNamespace(name="cuda")).__enter__()
    assert all(a is b for a, b in zip(_cuda_originals(), before))


@pytest.mark.parametrize("backend", ["sim", "cuda"])
def test_a_finished_recording_is_freed_by_refcount_alone(backend):
    """No reference cycle through the recorder: a cycle would leave it (and whatever CUDA objects
    it holds) to the cyclic collector, which may run inside a later capture."""
    dev = SimDevice() if backend == "sim" else types.SimpleNamespace(name="cuda")
    was = gc.isenabled()
    gc.disable()
    try:
        with audit.recording(dev) as rec:
            pass
        ref = weakref.ref(rec)
        del rec
        assert ref() is None, gc.get_referrers(ref())
    finally:
        if was:
            gc.enable()


@pytest.mark.gpu
def test_cuda_recording_of_a_raising_capture_restores_the_originals_and_captures_again():
    from nblib.backends.device import get

    dev = get("cuda")
    before = _cuda_originals()
    x = torch.ones(1024, device="cuda")

    def bad():
        y = x * 2
        raise Boom(y.shape)

    with pytest.raises(audit.AuditCaptureError, match="Boom"):
        audit.audit_capture(bad, device=dev)
    assert all(a is b for a, b in zip(_cuda_originals(), before))
    # torch._C._len_torch_dispatch_stack: private, no public API (tests/test_private_api.py)
    assert torch._C._len_torch_dispatch_stack() == 0 and gc.isenabled()
    rep = audit.audit_capture(lambda: x * 3, device=dev)  # the next capture works
    rep.graph.replay()
    torch.cuda.synchronize()
    assert rep.ok and torch.equal(rep.result, x * 3)


def test_a_patched_inherited_name_is_removed_again():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    rec = trace.Recording(types.SimpleNamespace(name="sim"))
    rec._patch(Child, "f", lambda self: "patched")
    assert Child().f() == "patched"
    rec._restore()
    assert "f" not in Child.__dict__ and Child().f() == "base"


def test_cuda_recorder_installs_and_restores_its_patches():
    """Runs on any machine: the patched names exist in this torch and triton, and come back."""
    import triton

    names = [
        (torch.cuda.CUDAGraph, "capture_begin"),
        (torch.cuda.CUDAGraph, "capture_end"),
        (torch.cuda.Event, "record"),
        (torch.cuda.Event, "wait"),
        (torch.cuda.Stream, "wait_event"),
        (torch.cuda.Stream, "wait_stream"),
        (torch.cuda.Stream, "record_event"),
    ]
    before = [getattr(c, n) for c, n in names]
    hooks = list(triton.knobs.runtime.launch_enter_hook.calls)
    with audit.recording(types.SimpleNamespace(name="cuda")) as rec:
        assert isinstance(rec, trace.CudaRecording)
        assert all(a != b for a, b in zip([getattr(c, n) for c, n in names], before))
        assert any(getattr(h, "__self__", None) is rec for h in triton.knobs.runtime.launch_enter_hook.calls)
        assert rec.captures == [] and rec.report().ok
    assert [getattr(c, n) for c, n in names] == before
    assert triton.knobs.runtime.launch_enter_hook.calls == hooks


def test_recording_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="no capture recorder"):
        audit.recording(types.SimpleNamespace(name="cpu"))
