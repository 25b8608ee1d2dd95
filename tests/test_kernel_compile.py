"""Every Triton kernel in kernels/ compiles for sm_80 (Ampere), sm_89 (Ada), sm_90a (Hopper, where
the suite runs), sm_100a (Blackwell) and sm_120 (RTX Blackwell) with the configs its launcher picks
for that target, and gets the code its performance depends on; where a kernel cannot compile for a
target (fp8 on Ampere) the launcher refuses it in one line. No GPU needed: Triton ships ptxas and
cuobjdump. The compile runs once per test session, in one subprocess without TRITON_INTERPRET (set,
it breaks triton.compile) that spreads the cases over the CPU's cores.

The launchers' choices themselves (configs by target, what is read from the device, the fp8 gate in
the notebooks' setup) are tested first, without compiling."""

import importlib
import json
import os
import pkgutil
from types import SimpleNamespace

import pytest
import torch
from interp import run_without_interpreter
from triton.runtime.jit import JITFunction

import kernels
from kernels import compile_check, launch
from kernels.logits_configs import config_for
from nblib.run import notebook
from nblib.schema import params as P

pytest.importorskip("triton.backends.nvidia", reason="this Triton has no NVIDIA backend to compile for")

ARCHS = compile_check.ARCHS
KB = 1024
# NVIDIA's opt-in shared memory per block (the per-compute-capability tables; CUTLASS agrees)
NVIDIA_SMEM = {80: 163 * KB, 86: 99 * KB, 89: 99 * KB, 90: 227 * KB, 100: 227 * KB, 120: 99 * KB}


# ---------------------------------------------------------------- the launchers' choices


def test_the_fallback_table_holds_nvidias_shared_memory_limits():
    assert {a: f.smem_per_block for a, f in launch.ARCH_FACTS.items()} == NVIDIA_SMEM
    assert {a: compile_check.shared_limit(a) for a in ARCHS} == {a: NVIDIA_SMEM[a] for a in ARCHS}


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(major, minor, name, sms, optin=None): what torch.cuda reports for device 0."""

    def fake(major, minor, name, sms, optin=None):
        props = SimpleNamespace(major=major, minor=minor, name=name, multi_processor_count=sms)
        if optin is not None:
            props.shared_memory_per_block_optin = optin
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        launch._device_target.cache_clear()
        return torch.device("cuda", 0)

    yield fake
    launch._device_target.cache_clear()


def test_sm_count_and_shared_memory_come_from_the_device(fake_gpu):
    dev = fake_gpu(8, 9, "NVIDIA L4", 58, optin=101376)
    assert launch.target_of(dev) == launch.Target(89, "NVIDIA L4", 58, 101376)
    assert launch.num_sms(dev) == 58  # not the H200's 132
    # a torch without the opt-in field: the table's value for the architecture
    dev = fake_gpu(12, 0, "NVIDIA GeForce RTX 5090", 170)
    assert launch.target_of(dev).smem_per_block == 99 * KB


@pytest.mark.parametrize(
    "arch, bf16, fp8",
    [
        (80, ("ptr", 5), None),  # 163 KB: the pointer entry as it is; no fp8
        (86, ("ptr", 3), None),  # 99 KB: two stages less, two CTAs per SM
        (89, ("ptr", 3), ("ptr", 5)),
        (90, ("tma", 5), ("tma", 3)),  # as measured on the H200
        (100, ("tma", 5), ("tma", 3)),
        (120, ("ptr", 3), ("ptr", 5)),
    ],
)
def test_configs_by_compute_capability(arch, bf16, fp8):
    for kind, want in (("bf16", bf16), ("fp8", fp8)):
        if want is None:
            assert not launch.supports(kind, arch)
            continue
        c = config_for(kind, arch, 64, 128)
        assert (c.k_load, c.num_stages) == want, (kind, arch, c)


def test_fp8_is_refused_in_one_line_where_the_gpu_has_none(fake_gpu):
    assert [launch.supports("fp8", a) for a in (80, 86, 89, 90, 120)] == [False, False, True, True, True]
    assert launch.supports("bf16", 80) and not launch.supports("bf16", 75)
    target = launch.target_of(fake_gpu(8, 0, "NVIDIA A100-SXM4-80GB", 108, optin=163 * KB))
    with pytest.raises(ValueError, match=r"^fp8 .*NVIDIA A100-SXM4-80GB \(sm_80\).*use index dtype bf16$"):
        launch.require("fp8", target)
    launch.require("bf16", target)
    with pytest.raises(ValueError, match="cache dtype 'fp16'"):
        launch.supports("fp16", 90)


def test_launches_by_target_without_compiling():
    """What kernels.compile_check gets from the logits launcher: on sm_80 the fp8 cases carry the
    refusal, no target below sm_90 gets a descriptor path, and a TMA config is refused there."""
    from kernels import logits_check

    cases = {a: {c.name: c for c in logits_check.compile_cases(a)} for a in (80, 89, 90, 120)}
    assert set(cases[80]) == {f"logits_{k}{t}" for k in ("bf16", "fp8") for t in ("", "_ptr", "_ptr3")}
    assert set(cases[80]) == set(cases[89]) < set(cases[90]) < set(cases[120])  # + TMA; + TMA gather
    assert [n for n, c in cases[80].items() if c.refused] == [n for n in cases[80] if "fp8" in n]
    assert not any(c.refused for a in (89, 90, 120) for c in cases[a].values())
    bf16 = cases[89]["logits_bf16"].launch  # the table's pointer entry, 3 stages in Ada's 99 KB
    assert (bf16.args["K_LOAD"], bf16.args["k_desc"], bf16.options["num_stages"]) == (0, None, 3)
    tma = dict(block_t=64, tiles_per_prog=1, num_warps=4, num_stages=2, k_load="tma")
    with pytest.raises(ValueError, match=r"^config k_load 'tma' needs sm_90 or later \(TMA\)$"):
        logits_check.compile_cases(89, tma)


class FakeCuda:
    """Just enough of nblib.backends.device's CUDA device for nblib.setup, on a CPU."""

    name = "cuda"
    torch_device = torch.device("cuda", 0)

    def __init__(self, gpu):
        self.gpu = gpu

    def device_name(self):
        return self.gpu

    def synchronize(self):
        pass

    def is_current_stream_capturing(self):
        return False

    def manual_seed(self, seed):
        pass


@pytest.mark.parametrize("gpu, capability", [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA H200", (9, 0))])
def test_setup_leaves_out_fp8_where_the_gpu_has_none(monkeypatch, tmp_path, fake_gpu, gpu, capability):
    fake_gpu(*capability, gpu, 108)
    monkeypatch.setattr(notebook.device, "get", lambda name: FakeCuda(gpu))
    ns = {k: P.default(k) for k in P.DECLARES["00_reproduce"]}
    ns.update(backend="cuda", output_dir=str(tmp_path), index_dtypes=["bf16", "fp8"])
    notebook.setup("00_reproduce", ns)
    saved = json.loads((tmp_path / "00_reproduce.results.json").read_text())
    if capability < (8, 9):
        assert ns["index_dtypes"] == saved["params"]["index_dtypes"] == ["bf16"]
        assert saved["dropped"]["index_dtypes"] == ["fp8"] and "A100" in saved["dropped"]["reason"]
        ns["index_dtypes"] = ["fp8"]
        with pytest.raises(ValueError, match="list bf16 in the profile"):
            notebook.setup("00_reproduce", ns)
    else:
        assert ns["index_dtypes"] == saved["params"]["index_dtypes"] == ["bf16", "fp8"]
        assert "dropped" not in saved


def test_setup_changes_nothing_on_the_simulator(tmp_path):
    ns = {k: P.default(k) for k in P.DECLARES["00_reproduce"]}
    ns.update(backend="sim", output_dir=str(tmp_path), index_dtypes=["bf16", "fp8"])
    _, res = notebook.setup("00_reproduce", ns)
    assert ns["index_dtypes"] == res["params"]["index_dtypes"] == ["bf16", "fp8"]
    assert "dropped" not in res.data


# ---------------------------------------------------------------- what each target compiles to


@pytest.fixture(scope="session")
def reports():
    """Every target's report, compiled once per session in one process over the CPU's cores (cold
    Triton cache: about 90 CPU-seconds; warm: about 5)."""
    jobs = str(os.cpu_count() or 1)
    r = run_without_interpreter(["-m", "kernels.compile_check", "--jobs", jobs], 1800)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {(x["name"], x["arch"]): x for x in rows}


def compiled(reports, arch=None):
    return {k: r for k, r in reports.items() if not r["refused"] and arch in (None, k[1])}


def _kernels_in_package():
    """Every @triton.jit kernel (a function named *_kernel) in every module of kernels/."""
    found = set()
    for info in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"kernels.{info.name}")
        found |= {n for n, f in vars(mod).items() if isinstance(f, JITFunction) and n.endswith("_kernel")}
    return found


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_is_compiled_for_every_target(reports, arch):
    compiled_here = {r["kernel"] for r in compiled(reports, arch).values()}
    missing = _kernels_in_package() - compiled_here
    assert not missing, f"sm_{arch}: kernels without compile cases (add them to a compile_cases): {missing}"
    assert {"_indexer_logits_kernel", "_topk_kernel", "row_maxima_kernel"} <= compiled_here
    # the launcher's own choice for this target, compiled: the table's config, fitted to its shared memory
    for kind in ("bf16", "fp8"):
        r = reports[f"logits_{kind}", arch]
        if not r["refused"]:
            cfg = config_for(kind, arch, 64, 128, launch.target_for(arch).smem_per_block)
            assert r["options"]["num_stages"] == cfg.num_stages and r["constexprs"]["BLOCK_T"] == cfg.block_t
            assert r["expect_tma"] == (cfg.k_load != "ptr")


def test_the_other_targets_compile_each_kernel_once_per_data_dtype():
    """sm_80, sm_89 and sm_120 compile one case per kernel and the dtype it reads: the logits
    kernel's bf16 and fp8 both (fp8's refusal below sm_89 is checked there), a top-k kernel once
    (with lengths only one branch more); sm_90a compiles both of the top-k's."""
    for arch in set(ARCHS) - set(compile_check.FULL):
        names = [c.name for c in compile_check.cases(arch)]
        kernels_ = [c.launch.kernel.__name__ for c in compile_check.cases(arch)]
        assert kernels_.count("_indexer_logits_kernel") == 2 and {"logits_bf16", "logits_fp8"} <= set(names)
        assert kernels_.count("_fused_kernel") == 1 and "topk_fused" in names, (arch, names)
        assert not [n for n in names if n.endswith("_lengths")], (arch, names)
        assert len(kernels_) == len(set(kernels_)) + 1, (arch, kernels_)  # only the logits kernel twice
    assert {"topk_fused", "topk_fused_lengths"} <= {c.name for c in compile_check.cases(90)}


FUSION_PROBE = """
import json
from kernels import compile_check, launch
case = next(c for c in compile_check.cases(90) if c.name == "logits_bf16")
k = launch.compile_for(case.launch, 90)
print(json.dumps(dict(fusion=k.metadata.enable_fp_fusion, fma=k.asm["ptx"].count("fma.rn.f32"))))
"""


def test_launches_choose_fp_fusion_whatever_the_default(monkeypatch):
    """Triton 3.10 turns FP fusion off by default (TRITON_DEFAULT_FP_FUSION): the logits kernel,
    compiled under that default, still contracts its multiply-adds into FMAs, as measured and as
    its tests compare it."""
    assert launch.FP_FUSION is True
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    r = run_without_interpreter(["-c", FUSION_PROBE], 600)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["fusion"] is True and got["fma"] > 0, got


def test_the_variants_are_compiled_on_sm90a_and_sm100a(reports):
    on = {a: {n for n, arch in reports if arch == a} for a in (90, 100)}
    assert on[90] <= on[100], "every sm_90a case is compiled for sm_100a too"
    assert on[100] - on[90] == {"logits_bf16_gather", "logits_fp8_gather"}  # TMA gather4: sm_100 only
    assert {"logits_bf16_tma", "logits_fp8_prefetch", "logits_bf16_ptr", "logits_fp8_ptr3"} <= on[90]


def test_the_launcher_refuses_exactly_what_cannot_compile(reports):
    """fp8 below sm_89: refused in one line naming the target and bf16, and the same launch built
    without the check does not compile there. Everything else compiled (a failure there stops
    kernels.compile_check, and the fixture)."""
    refused = {k: r for k, r in reports.items() if r["refused"]}
    assert {k for k in refused if k[0] == "logits_fp8"} == {("logits_fp8", a) for a in ARCHS if a < 89}
    for (name, arch), r in refused.items():
        assert name.startswith("logits_fp8") and arch < 89, (name, arch)
        assert f"sm_{arch} has no fp8" in r["refused"] and r["refused"].endswith("use index dtype bf16"), r
        assert "\n" not in r["refused"]
        assert not r["compiles"], f"{name} on sm_{arch} compiles, yet the launcher refuses it"


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_instruction_per_target(reports, arch):
    op = compile_check.TENSOR_CORE_OP[arch]
    assert op == {90: "wgmma.mma_async", 100: "tcgen05.mma"}.get(arch, "mma.sync")  # sm_80 / 89 / 120
    for (name, _), r in compiled(reports, arch).items():
        if r["expect_tensor_core"]:
            assert r["tensor_core"] > 0, f"{name} on sm_{arch}: tl.dot did not lower to {op}"
        else:
            assert r["tensor_core"] == 0, f"{name} on sm_{arch}: unexpected tensor-core op"
        assert r["other_tensor_core"] == 0, f"{name} on sm_{arch}: another target's tensor-core op"


def test_tma_exactly_where_a_descriptor_is_used(reports):
    for key, r in compiled(reports).items():
        if r["expect_tma"]:
            assert r["tma"] > 0, f"{key}: descriptor path without cp.async.bulk.tensor"
        else:
            assert r["tma"] == 0, f"{key}: TMA where no descriptor is used"
    # the launchers' choices: descriptors on sm_90a / sm_100a, pointers on Ampere, Ada, RTX Blackwell
    assert {a: reports["logits_bf16", a]["expect_tma"] for a in ARCHS} == {a: a in (90, 100) for a in ARCHS}


def test_programmatic_dependent_launch_exactly_where_asked(reports):
    """The top-k's two kernels hand over with griddepcontrol (launch_dependents in the maxima
    kernel, wait in the select one), on sm_90 and later only; no other kernel has it."""
    asked = {key for key, r in compiled(reports).items() if r["expect_pdl"]}
    assert {("topk_maxima", 90), ("topk_select", 100), ("topk_select", 120)} <= asked
    assert not {key for key in asked if key[1] < 90}, "griddepcontrol needs sm_90"
    for key, r in compiled(reports).items():
        assert (r["griddepcontrol"] > 0) == r["expect_pdl"], f"{key}: {r['griddepcontrol']} griddepcontrol"


@pytest.mark.parametrize("arch", ARCHS)
def test_no_spills_and_shared_memory_within_the_target(reports, arch):
    spills = {}
    for (name, _), r in compiled(reports, arch).items():
        spill = dict(ptx_local=r["ptx_local"], local_bytes=r["local_bytes"], stack_bytes=r["stack_bytes"])
        if any(spill.values()):
            spills[name] = dict(spill, regs=r["regs"], num_warps=r["options"]["num_warps"])
        assert r["shared_limit"] == NVIDIA_SMEM[arch]
        assert 0 < r["shared"] <= r["shared_limit"], f"{name} on sm_{arch}: {r['shared']} B of shared memory"
    assert not spills, f"sm_{arch}: spills (stack frame / local memory) in {spills}"


def test_pipelining_is_what_the_config_says(reports):
    """Pointer-path loads are 16-byte async copies; a config that asks for the copy/compute overlap
    (num_stages > 4) gets an async_wait that leaves tiles in flight, and one that does not (the
    3-stage pointer variant) gets only full waits: latency hidden across CTAs, not inside one."""
    checked = set()
    for key, r in compiled(reports).items():
        if r["expect_overlap"] is None:
            continue
        checked.add(key[1])
        if not r["expect_tma"]:
            assert r["cp_async"] > 0, f"{key}: K tile not loaded with async copies"
        assert r["waits"], f"{key}: no pipelined loads at all"
        if r["expect_overlap"]:
            assert max(r["waits"]) > 0, f"{key}: asked for overlap, got only full waits {r['waits']}"
        else:
            assert max(r["waits"]) == 0, f"{key}: waits {r['waits']}; update the config's comment"
    assert checked == set(ARCHS)


def test_sm100_entries_keep_the_occupancy_sm90_has(reports, tmp_path):
    """The rule in kernels.logits_configs: an sm_100 entry holds as many CTAs per SM on sm_100a as
    the sm_90 entry does on sm_90a, or, where sm_100a's registers cap every config of the sweep's
    space lower, as many as the best of them (registers and shared memory as compiled)."""
    jobs = str(os.cpu_count() or 1)
    args = ["--arch", "100", "--candidates", "--jobs", jobs, "--out", str(tmp_path)]
    r = run_without_interpreter(["-m", "kernels.compile_check", *args], 1800)
    assert r.returncode == 0, r.stderr[-4000:]
    space = json.loads((tmp_path / "compile_sm100.json").read_text())["rows"]
    for kind in ("bf16", "fp8"):
        hopper, blackwell = reports[f"logits_{kind}", 90], reports[f"logits_{kind}", 100]
        best = max(c["ctas_per_sm"] for c in space if c["kind"] == kind and c["spill_bytes"] == 0)
        want = min(hopper["ctas_per_sm"], best)
        assert blackwell["ctas_per_sm"] >= want >= 1, (kind, hopper, blackwell, best)
