"""The private torch and Triton APIs this suite relies on, one test each: where one moves or changes
shape, its test fails naming the versions installed and the public API to move to (or that there is
none). What needs a GPU to check is marked gpu; on a CPU the names and their signatures are checked.

Where each is used (a comment at each use names the public API it stands in for):
  torch.utils._python_dispatch.TorchDispatchMode   nblib/backends/{opinfo,sim/capture}.py, trace/cuda.py
  torch.utils._pytree.tree_flatten / unflatten     nblib/backends/sim/capture.py, trace/cuda.py
  OpOverload._schema                               nblib/backends/{opinfo,sim/capture}.py, trace/cuda.py
  torch._C._len_torch_dispatch_stack               tests (test_audit, test_recorder, test_sim)
  torch.cuda._sanitizer                            nblib/instruments/csan.py
  torch.cuda.memory._record_memory_history         nblib/backends/device.py, scripts/alloc_trace.py
  torch.cuda.memory._snapshot                      nblib/backends/device.py, scripts/alloc_trace.py
  torch.cuda.graph.default_capture_stream          nblib/backends/device.py (undocumented attribute)
  JITFunction._pack_args, create_function_from_signature   kernels/launch.py (compile without a GPU)
  triton.runtime.interpreter._patch_lang_tensor    tests/interp.py (the numpy >= 2.4 shim)
  triton.runtime.interpreter.InterpretedFunction   tests/interp.py, kernels/args.py
  triton.knobs.runtime.launch_enter_hook, LazyDict nblib/instruments/audit/trace/cuda.py, tests/test_audit.py
"""

import inspect
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from nblib.core.paths import ROOT

VERSIONS = f"torch {torch.__version__}, triton {triton.__version__}"


def moved(what, public):
    """The failure message: what changed, under which versions, and where to move."""
    return f"{what} has moved or changed under {VERSIONS}; move to {public}"


def params(fn):
    return list(inspect.signature(fn).parameters)


def resolve(path, public):
    """The object at a dotted path (module, then attributes), or a failure naming where to move."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:i]), fromlist=["_"])
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            break
        return obj
    pytest.fail(moved(path, public))


# ------------------------------------------------------------------------------------------------
# torch: dispatch modes, op schemas, pytrees (the recorder and the simulator)
# ------------------------------------------------------------------------------------------------

NO_PUBLIC_DISPATCH = (
    "no public API exists: __torch_dispatch__ modes live only in torch.utils._python_dispatch"
)


def test_torch_dispatch_mode_sees_every_op_with_its_schema():
    """TorchDispatchMode: subclass it, push it with `with`, and __torch_dispatch__(func, types, args,
    kwargs) gets each aten op; func._schema gives its name, its arguments' names and which are
    written (alias_info.is_write, before_set), what nblib.backends.opinfo.op_info reads."""
    mode_cls = resolve("torch.utils._python_dispatch.TorchDispatchMode", NO_PUBLIC_DISPATCH)
    seen = []

    class Spy(mode_cls):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.zeros(4)
    stack = resolve("torch._C._len_torch_dispatch_stack", "no public API exists (the tests' own check)")
    assert stack() == 0, moved("torch._C._len_torch_dispatch_stack", "no public API exists")
    with Spy():
        assert stack() == 1, moved("torch._C._len_torch_dispatch_stack (the mode's push)", "none")
        x.add_(1.0)
    assert stack() == 0
    add = next((f for f in seen if "add_" in str(f)), None)
    assert add is not None, moved("TorchDispatchMode.__torch_dispatch__", NO_PUBLIC_DISPATCH)
    schema = getattr(add, "_schema", None)
    assert schema is not None, moved(
        "OpOverload._schema", "OpOverload.name() for the name; none for alias_info"
    )
    assert schema.name == "aten::add_", moved(
        "FunctionSchema.name", "OpOverload.name() (it adds the overload)"
    )
    first = schema.arguments[0]
    assert first.name == "self" and first.alias_info.is_write, moved("Argument.alias_info.is_write", "none")
    ret = schema.returns[0]
    assert ret.alias_info.before_set == first.alias_info.before_set, moved("AliasInfo.before_set", "none")


def test_pytree_flattens_the_ops_arguments():
    """tree_flatten / tree_unflatten over (args, kwargs), as the simulator's capture mode uses them."""
    flatten = resolve(
        "torch.utils._pytree.tree_flatten", "no public API exists in torch (optree is the outside one)"
    )
    unflatten = resolve("torch.utils._pytree.tree_unflatten", "no public API exists in torch")
    a, b = torch.zeros(1), torch.ones(2)
    flat, spec = flatten(((a, [b, 3]), {"out": a}))
    assert flat[0] is a and flat[1] is b and flat[2] == 3 and flat[3] is a, moved(
        "tree_flatten's order", "none"
    )
    assert unflatten(flat, spec) == ((a, [b, 3]), {"out": a}), moved("tree_unflatten", "none")


# ------------------------------------------------------------------------------------------------
# torch: the CUDA sanitizer, the allocator's history, the capture stream (CUDA only)
# ------------------------------------------------------------------------------------------------

CSAN_PUBLIC = "TORCH_CUDA_SANITIZER=1 in the child's environment (CSAN's documented switch)"


def test_cuda_sanitizer_names_and_signatures():
    enable = resolve("torch.cuda._sanitizer.enable_cuda_sanitizer", CSAN_PUBLIC)
    errors = resolve("torch.cuda._sanitizer.CUDASanitizerErrors", CSAN_PUBLIC)
    assert params(enable) == [], moved("enable_cuda_sanitizer()", CSAN_PUBLIC)
    assert issubclass(errors, Exception) and params(errors.__init__)[1:] == ["errors"], moved(
        "CUDASanitizerErrors(errors)", CSAN_PUBLIC
    )
    assert errors([]).errors == [], moved("CUDASanitizerErrors.errors", CSAN_PUBLIC)


@pytest.mark.gpu
def test_cuda_sanitizer_reports_its_own_control_race():
    """CSAN's documentation example, in a child (its hooks cannot be removed): it must report."""
    code = (
        "from torch.cuda._sanitizer import enable_cuda_sanitizer\n"
        "from nblib.instruments.csan import _control\n"
        "enable_cuda_sanitizer()\n"
        "print(_control())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert "'reported': True" in r.stdout, (
        moved("torch.cuda._sanitizer", CSAN_PUBLIC) + f": {r.stderr[-2000:]}"
    )


MEMORY_PUBLIC = (
    "no public API exists for the trace (torch.cuda.memory_snapshot() gives the segments without it; "
    "the memory docs name these underscored functions)"
)


def test_memory_history_names_and_signatures():
    record = resolve("torch.cuda.memory._record_memory_history", MEMORY_PUBLIC)
    snapshot = resolve("torch.cuda.memory._snapshot", MEMORY_PUBLIC)
    p = inspect.signature(record).parameters
    assert list(p)[0] == "enabled" and "stacks" in p, moved(
        "_record_memory_history(enabled, stacks=)", MEMORY_PUBLIC
    )
    assert all(q.default is not q.empty for q in inspect.signature(snapshot).parameters.values()), moved(
        "_snapshot()", MEMORY_PUBLIC
    )


@pytest.mark.gpu
def test_memory_history_records_alloc_and_free_with_stream_and_frames():
    """What scripts/alloc_trace.py and gpu_probe.py read from the trace: action, addr, size, stream,
    frames (filename, line, name)."""
    from nblib.backends.device import get

    dev = get("cuda")
    dev.memory_history(True)
    try:
        t = torch.empty(1 << 20, device="cuda")
        addr = t.data_ptr()
        del t
        snap = dev.memory_snapshot()
    finally:
        dev.memory_history(False)
    events = [e for dt in snap["device_traces"] for e in dt if e.get("addr") == addr]
    assert {"alloc", "free_requested"} <= {e["action"] for e in events}, moved(
        "_snapshot's trace", MEMORY_PUBLIC
    )
    e = next(e for e in events if e["action"] == "alloc")
    assert e["size"] >= 4 << 20 and "stream" in e, moved("a trace entry's size and stream", MEMORY_PUBLIC)
    assert any({"filename", "line", "name"} <= set(f) for f in e["frames"]), moved("frames", MEMORY_PUBLIC)


def test_the_graph_class_keeps_its_capture_stream():
    """nblib.backends.device.distinct_stream reads and seeds torch.cuda.graph.default_capture_stream,
    an undocumented class attribute (None until the first capture)."""
    assert hasattr(torch.cuda.graph, "default_capture_stream"), moved(
        "torch.cuda.graph.default_capture_stream",
        "no public API exists: pass stream= to torch.cuda.graph and keep that stream apart yourself",
    )


# ------------------------------------------------------------------------------------------------
# Triton: compiling for a GPU that is absent, the interpreter, the launch hook
# ------------------------------------------------------------------------------------------------

PACK_PUBLIC = (
    "no public API exists to compile a @triton.jit for a target without launching it; "
    "kernel.warmup(..., grid=) compiles for the GPU that is present"
)


@triton.jit
def _scale(src, dst, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n) * factor, mask=offs < n)


def test_binder_and_pack_args_give_what_triton_compile_takes():
    """kernels.launch.compile_for: the binder from create_function_from_signature, then
    JITFunction._pack_args -> (options, signature, constexprs, attrs) for ASTSource."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction

    make = resolve("triton.runtime.jit.create_function_from_signature", PACK_PUBLIC)
    assert params(make) == ["sig", "kparams", "backend"], moved("create_function_from_signature", PACK_PUBLIC)
    assert params(JITFunction._pack_args)[1:] == [
        "backend",
        "kwargs",
        "bound_args",
        "specialization",
        "options",
    ], moved("JITFunction._pack_args", PACK_PUBLIC)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    x = torch.zeros(64)
    # FP fusion explicit, as every launch of kernels.launch passes it (Triton 3.9 warns when left to
    # its default, which 3.10 turns off)
    kwargs = dict(
        src=x, dst=torch.empty_like(x), n=64, factor=2.0, BLOCK=64, num_warps=4, enable_fp_fusion=True
    )
    bound, specialization, options = make(_scale.signature, _scale.params, backend)(**kwargs)
    options, signature, constexprs, attrs = _scale._pack_args(backend, kwargs, bound, specialization, options)
    assert signature["src"] == "*fp32" and signature["factor"] == "fp32", moved(
        "_pack_args' signature", PACK_PUBLIC
    )
    assert options.num_warps == 4 and options.enable_fp_fusion is True and constexprs, moved(
        "_pack_args' options and constexprs", PACK_PUBLIC
    )
    ASTSource(_scale, signature, constexprs, attrs)  # what triton.compile takes


@triton.jit
def _count_to(n_ptr, out_ptr):
    n = tl.load(n_ptr)  # a tensor scalar: the loop bound is data, not a constant
    acc = 0
    for i in range(0, n):
        acc += i
    tl.store(out_ptr, acc)


def test_interpreter_takes_a_loaded_scalar_as_a_loop_bound(monkeypatch):
    """tests/interp.py patches triton.runtime.interpreter._patch_lang_tensor(tensor, scope) so that
    int(scalar) works on numpy >= 2.4; a data-dependent range() in the interpreter needs it."""
    import triton.runtime.interpreter as interp_mod
    from interp import interpret

    fix = (
        "no public API exists: run with numpy < 2.4, or drop the shim once Triton's interpreter uses .item()"
    )
    hook = getattr(interp_mod, "_patch_lang_tensor", None)
    assert hook is not None and params(hook) == ["tensor", "scope"], moved("_patch_lang_tensor", fix)
    assert hasattr(interp_mod._LangPatchScope, "set_attr"), moved("_LangPatchScope.set_attr", fix)
    # kernels/args.py and tests/interp.py make and recognise interpreted twins by this class
    assert params(interp_mod.InterpretedFunction)[:1] == ["fn"], moved("InterpretedFunction(fn)", fix)
    interpret(monkeypatch, sys.modules[__name__])
    out = torch.zeros(1, dtype=torch.int32)
    _count_to[(1,)](torch.tensor([5], dtype=torch.int32), out)
    assert out.item() == 0 + 1 + 2 + 3 + 4, moved("the interpreter's loop bounds", fix)


def test_launch_enter_hook_takes_and_gives_back_a_function():
    """nblib.instruments.audit.trace.cuda adds its hook to triton.knobs.runtime.launch_enter_hook and
    removes it; the hook reads Triton's LazyDict (.get(), .add())."""
    public = "triton.knobs.runtime.launch_enter_hook (Triton's documented hook) in its new form"
    chain = resolve("triton.knobs.runtime.launch_enter_hook", public)
    hook = lambda metadata: None  # noqa: E731
    before = list(chain.calls)
    chain.add(hook)
    try:
        assert hook in chain.calls, moved("launch_enter_hook.add", public)
    finally:
        chain.remove(hook)
    assert list(chain.calls) == before, moved("launch_enter_hook.remove", public)
    lazy = resolve("triton.compiler.compiler.LazyDict", "the metadata the hook is given, as a dict")
    md = lazy({"name": "k", "stream": 7})
    md.add(lambda grid, metadata, args: {"extra": 1}, (None, None, None))
    assert md.get() == {"name": "k", "stream": 7, "extra": 1}, moved("LazyDict.get/add", public)
