"""Every Triton kernel in kernels/ compiles for sm_90a (Hopper, where the suite runs) and sm_100a
(Blackwell: compiled here, never run) with the configs its launcher picks for that architecture,
and gets the code its performance depends on. No GPU needed: Triton ships ptxas and cuobjdump.
The compile runs in a subprocess without TRITON_INTERPRET (set, it breaks triton.compile)."""

import importlib
import json
import pkgutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from interp import run_without_interpreter
from triton.runtime.jit import JITFunction

import kernels
from kernels import compile_check

pytest.importorskip("triton.backends.nvidia", reason="this Triton has no NVIDIA backend to compile for")


@pytest.fixture(scope="module")
def reports():
    """Both targets' reports, compiled in two processes side by side (about 40 s cold, one core)."""
    with ThreadPoolExecutor(len(compile_check.ARCHS)) as pool:
        runs = list(
            pool.map(
                lambda arch: run_without_interpreter(
                    ["-m", "kernels.compile_check", "--arch", str(arch)], 900
                ),
                compile_check.ARCHS,
            )
        )
    rows = []
    for r in runs:
        assert r.returncode == 0, r.stderr[-4000:]
        rows += [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {(x["name"], x["arch"]): x for x in rows}


def _kernels_in_package():
    """Every @triton.jit kernel (a function named *_kernel) in every module of kernels/."""
    found = set()
    for info in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"kernels.{info.name}")
        found |= {n for n, f in vars(mod).items() if isinstance(f, JITFunction) and n.endswith("_kernel")}
    return found


def test_every_kernel_is_compiled_for_both_targets(reports):
    on = {a: {n for n, arch in reports if arch == a} for a in compile_check.ARCHS}
    assert on[90] <= on[100], "every sm_90a case is compiled for sm_100a too"
    assert on[100] - on[90] == {"logits_bf16_gather", "logits_fp8_gather"}  # TMA gather4: sm_100 only
    compiled = {r["kernel"] for r in reports.values()}
    missing = _kernels_in_package() - compiled
    assert not missing, f"kernels without compile cases (add them to kernels.compile_check.cases): {missing}"
    assert {"_indexer_logits_kernel", "_topk_kernel", "_row_maxima_kernel"} <= compiled


@pytest.mark.parametrize("arch", compile_check.ARCHS)
def test_tensor_core_instruction_per_target(reports, arch):
    for (name, a), r in reports.items():
        if a != arch:
            continue
        if r["expect_tensor_core"]:
            op = compile_check.TENSOR_CORE_OP[arch]
            assert r["tensor_core"] > 0, f"{name} on sm_{arch}a: tl.dot did not lower to {op}"
        else:
            assert r["tensor_core"] == 0, f"{name} on sm_{arch}a: unexpected tensor-core op"
        assert r["other_tensor_core"] == 0, f"{name} on sm_{arch}a: another target's tensor-core op"


def test_tma_exactly_where_a_descriptor_is_used(reports):
    for key, r in reports.items():
        if r["expect_tma"]:
            assert r["tma"] > 0, f"{key}: descriptor path without cp.async.bulk.tensor"
        else:
            assert r["tma"] == 0, f"{key}: TMA where no descriptor is used"


def test_programmatic_dependent_launch_exactly_where_asked(reports):
    """The top-k's two kernels hand over with griddepcontrol (launch_dependents in the maxima
    kernel, wait in the select one); no other kernel has it."""
    asked = {key for key, r in reports.items() if r["expect_pdl"]}
    assert {("topk_maxima", 90), ("topk_select", 100)} <= asked
    for key, r in reports.items():
        assert (r["griddepcontrol"] > 0) == r["expect_pdl"], f"{key}: {r['griddepcontrol']} griddepcontrol"


def test_no_spills_and_shared_memory_within_the_target(reports):
    for key, r in reports.items():
        assert r["ptx_local"] == 0 and r["local_bytes"] == 0 and r["stack_bytes"] == 0, f"{key} spills: {r}"
        assert 0 < r["shared"] <= r["shared_limit"], f"{key}: {r['shared']} B of shared memory"


def test_pipelining_is_what_the_config_says(reports):
    """Pointer-path loads are 16-byte async copies; a config that asks for the copy/compute overlap
    (num_stages > 4) gets an async_wait that leaves tiles in flight, and one that does not (the
    3-stage pointer variant) gets only full waits: latency hidden across CTAs, not inside one."""
    checked = 0
    for key, r in reports.items():
        if r["expect_overlap"] is None:
            continue
        checked += 1
        if not r["expect_tma"]:
            assert r["cp_async"] > 0, f"{key}: K tile not loaded with async copies"
        assert r["waits"], f"{key}: no pipelined loads at all"
        if r["expect_overlap"]:
            assert max(r["waits"]) > 0, f"{key}: asked for overlap, got only full waits {r['waits']}"
        else:
            assert max(r["waits"]) == 0, f"{key}: waits {r['waits']}; update the config's comment"
    assert checked >= 4


def test_sm100_entries_keep_the_occupancy_sm90_has(reports, tmp_path):
    """The rule in kernels.logits_configs: an sm_100 entry holds as many CTAs per SM on sm_100a as
    the sm_90 entry does on sm_90a, or, where sm_100a's registers cap every config of the sweep's
    space lower, as many as the best of them (registers and shared memory as compiled)."""
    r = run_without_interpreter(
        ["-m", "kernels.compile_check", "--arch", "100", "--candidates", "--out", str(tmp_path)], 900
    )
    assert r.returncode == 0, r.stderr[-4000:]
    space = json.loads((tmp_path / "compile_sm100.json").read_text())["rows"]
    for kind in ("bf16", "fp8"):
        hopper, blackwell = reports[f"logits_{kind}", 90], reports[f"logits_{kind}", 100]
        best = max(c["ctas_per_sm"] for c in space if c["kind"] == kind and c["spill_bytes"] == 0)
        want = min(hopper["ctas_per_sm"], best)
        assert blackwell["ctas_per_sm"] >= want >= 1, (kind, hopper, blackwell, best)
