"""Compile every Triton kernel in kernels/ for sm_80, sm_89, sm_90a, sm_100a and sm_120, on any
machine, with the configs its launcher picks for that target, and report what the code generator
made of it:

  tensor_core   mma.sync (sm_80 / sm_89 / sm_120), wgmma.mma_async (sm_90a), tcgen05.mma (sm_100a)
  tma           cp.async.bulk.tensor count (TMA loads, where a descriptor path is used)
  local         PTX .local declarations + cuobjdump's LOCAL / STACK bytes: register spills land in
                the stack frame, so no spill means both 0. (Triton keeps ptxas's own "spill stores"
                line only in its log, printed under TRITON_DUMP_PTXAS_LOG on a cache miss; the
                spill count it reports, n_spills, comes from the driver loading the binary on a GPU.)
  shared        bytes of shared memory a CTA needs (Triton's metadata), against the target's limit
  cp_async      16-byte async copies global -> shared (the pointer path's pipelined loads)
  waits         the pipeliner's async_wait depths (all 0: no copy/compute overlap in a CTA)
  griddepcontrol  programmatic dependent launch's hand-over instructions (sm_90 and later)
  refused       where the launcher refuses the target (fp8 below sm_89): its message, and whether
                the launch built without that check compiles (it must not)

sm_90a and sm_100a compile every case each launcher lists (its configs' variants too); the other
targets one case per kernel and data dtype, the first listed (the table's config): the logits
kernel's bf16 and fp8, a top-k kernel once (its variant with lengths is the same code and one
branch, compiled on sm_90a and sm_100a).

    python -m kernels.compile_check [--arch 80 89 90 100 120] [--jobs N]   # one JSON line per case

Run it in a process without TRITON_INTERPRET (which, once set, breaks triton.compile);
tests/test_kernel_compile.py does, and asserts on the report.
"""

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import cache

import torch
import triton

from kernels.launch import Case, compile_for, facts, supports

__all__ = [
    "ARCHS",
    "CANDIDATE_COLS",
    "FULL",
    "TENSOR_CORE_OP",
    "TMA_OP",
    "candidate_rows",
    "cases",
    "count_op",
    "ctas_per_sm",
    "inspect",
    "main",
    "shared_limit",
]

ARCHS = (80, 89, 90, 100, 120)
FULL = (90, 100)  # every case; the other targets one per kernel and data dtype
MMA, WGMMA, TCGEN05 = "mma.sync", "wgmma.mma_async", "tcgen05.mma"
TENSOR_CORE_OP = {80: MMA, 89: MMA, 90: WGMMA, 100: TCGEN05, 120: MMA}
TMA_OP = "cp.async.bulk.tensor"


def count_op(ptx: str, op: str) -> int:
    """Instructions op in ptx, as a whole mnemonic ("mma.sync" is not counted inside "wgmma...")."""
    return len(re.findall(r"(?<![\w.])" + re.escape(op) + r"\b", ptx))


def shared_limit(arch: int) -> int:
    """Opt-in shared memory per block on arch (kernels.launch.ARCH_FACTS)."""
    return facts(arch).smem_per_block


def _modules():
    from kernels import badrows, checksum, differential, logits_check, topk

    return (logits_check, topk, checksum, differential, badrows)  # topk lists topk_fused's cases too


def _signature(case):
    """A case's kernel and the dtype of the data it reads (its first tensor argument): the logits
    kernel's bf16 and fp8 cases differ there, a top-k kernel's cases with and without lengths (one
    branch more, an int32 in place of a placeholder) do not."""
    data = next(v for v in case.launch.args.values() if isinstance(v, torch.Tensor))
    return case.launch.kernel.__name__, str(data.dtype)


@cache
def cases(arch: int) -> list[Case]:
    """Every kernel's launches for arch, from the launchers themselves (their compile_cases)."""
    every = [case for m in _modules() for case in m.compile_cases(arch)]
    if arch in FULL:
        return every
    first: dict[tuple[str, str], Case] = {}
    for case in every:
        first.setdefault(_signature(case), case)
    return list(first.values())


def _resource_usage(cubin):
    """{'REG': n, 'STACK': n, 'SHARED': n, 'LOCAL': n} from cuobjdump -res-usage (shipped with Triton)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def _compile(case, arch):
    with contextlib.redirect_stdout(io.StringIO()):  # Triton prints the whole PTX on a ptxas error
        return compile_for(case.launch, arch)


def _refusal(case, arch):
    """A refused case's row: the launcher's message, and whether the unchecked launch compiles."""
    try:
        _compile(case, arch)
        error = ""
    except Exception as e:  # noqa: BLE001  (any compiler failure is the finding)
        error = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]  # Triton's cause is last
    return dict(name=case.name, kernel=case.launch.kernel.__name__, arch=arch, refused=case.refused,
                compiles=not error, compile_error=error)  # fmt: skip


def inspect(case: Case, arch: int) -> dict:
    """Compile case for arch; the report as a dict (see the module docstring)."""
    if case.refused:
        return _refusal(case, arch)
    k = _compile(case, arch)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    usage = _resource_usage(k.asm["cubin"])
    op, shared, regs = TENSOR_CORE_OP[arch], k.metadata.shared, usage.get("REG", 0)
    return dict(
        name=case.name,
        kernel=case.launch.kernel.__name__,
        arch=arch,
        refused="",
        options=case.launch.options,
        constexprs={p.name: case.launch.args[p.name] for p in case.launch.kernel.params if p.is_constexpr},
        expect_tensor_core=case.tensor_core,
        expect_tma=case.tma,
        tensor_core_op=op,
        tensor_core=count_op(ptx, op),
        other_tensor_core=sum(count_op(ptx, o) for o in {MMA, WGMMA, TCGEN05} - {op}),
        tma=count_op(ptx, TMA_OP),
        cp_async=len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
        expect_pdl=case.pdl,
        griddepcontrol=len(re.findall(r"griddepcontrol\.(?:wait|launch_dependents)", ptx)),
        expect_overlap=case.overlap,
        ptx_local=len(re.findall(r"^\s*\.local\b", ptx, re.M)),
        local_bytes=usage.get("LOCAL", 0),
        stack_bytes=usage.get("STACK", 0),
        regs=usage.get("REG"),
        shared=shared,
        shared_limit=shared_limit(arch),
        ctas_per_sm=ctas_per_sm(shared, regs, case.launch.options["num_warps"], arch),
        waits=[int(n) for n in re.findall(r"ttg\.async_wait[^{\n]*\{num = (\d+)", ttgir)],
    )


def ctas_per_sm(shared: int, regs: int, num_warps: int, arch: int = 90) -> int:
    """CTAs an SM of arch can hold (about): its shared memory (the per-block opt-in plus the 1 KB
    CUDA reserves per CTA), 64K registers, and its resident threads."""
    f = facts(arch)
    by_smem = (f.smem_per_block + 1024) // (shared + 1024)
    by_regs = 65536 // (max(regs, 1) * 32 * num_warps)
    return min(by_smem, by_regs, f.threads_per_sm // (32 * num_warps))


CANDIDATE_COLS = ["kind", "config", "tensor_core", "tma", "regs", "spill_bytes", "shared", "ctas_per_sm"]


@cache
def _candidates(arch):
    """(kind, config, case) for every config of the logits sweep's space on arch."""
    from kernels import logits_check
    from kernels.logits_configs import candidates

    return [
        (kind, cfg, next(c for c in logits_check.compile_cases(arch, cfg) if c.name == f"logits_{kind}"))
        for kind in ("bf16", "fp8")
        if supports(kind, arch)
        for cfg in candidates(kind, 64, 128, arch)
    ]


def _candidate_row(arch, i):
    kind, cfg, case = _candidates(arch)[i]
    r = inspect(case, arch)
    return dict(
        kind=kind,
        config=" ".join(f"{k}={v}" for k, v in cfg._asdict().items() if k != "min_programs"),
        tensor_core=r["tensor_core"],
        tma=r["tma"],
        regs=r["regs"],
        spill_bytes=r["local_bytes"] + r["stack_bytes"] + r["ptx_local"],
        shared=r["shared"],
        ctas_per_sm=r["ctas_per_sm"],
    )


def _case_row(arch, i):
    return inspect(cases(arch)[i], arch)


def _rows(job, pairs, jobs):
    """job(arch, i) for each pair, in order, over `jobs` processes (1: in this one). Spawned, so
    that no worker inherits this process's threads; each lists the cases once (cached)."""
    if jobs <= 1:
        return [job(*p) for p in pairs]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(job, *zip(*pairs)))


def candidate_rows(arch: int, jobs: int = 1) -> list[dict]:
    """Every config of the logits sweep's space for arch, compiled: what each would cost on that
    target (the evidence for the table's entries on an architecture we cannot run)."""
    return _rows(_candidate_row, [(arch, i) for i in range(len(_candidates(arch)))], jobs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    p.add_argument("--candidates", action="store_true", help="compile the logits sweep's configs instead")
    p.add_argument("--out", default=None, help="with --candidates: folder for compile_sm<arch>.{json,md}")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("TRITON_INTERPRET=1 is set: triton.compile fails under it; unset it and rerun")
    if a.candidates:
        from kernels.harness import meta, write_table

        for arch in a.arch:
            name = f"sm_{arch}" + ("a" if arch >= 90 else "")  # Triton's target: sm_90a, sm_120a
            info = meta(target=name, shape=dict(heads=64, dim=128), note="compiled, not run")
            print(write_table(a.out, f"compile_sm{arch}", info, candidate_rows(arch, a.jobs), CANDIDATE_COLS))
        return
    pairs = [(arch, i) for arch in a.arch for i in range(len(cases(arch)))]
    for row in _rows(_case_row, pairs, a.jobs):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
