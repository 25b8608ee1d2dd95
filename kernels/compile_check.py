"""Compile every Triton kernel in kernels/ for sm_90a and sm_100a, on any machine, with the configs
its launcher picks for that architecture, and report what the code generator made of it:

  tensor_core   wgmma.mma_async count (sm_90a) / tcgen05.mma count (sm_100a)
  tma           cp.async.bulk.tensor count (TMA loads, where a descriptor path is used)
  local         PTX .local declarations + ptxas LOCAL/STACK bytes (spills live there)
  shared        bytes of shared memory a CTA needs, against the target's limit
  cp_async      16-byte async copies global -> shared (the pointer path's pipelined loads)
  waits         the pipeliner's async_wait depths (all 0: no copy/compute overlap in a CTA)
  griddepcontrol  programmatic dependent launch's hand-over instructions (the top-k's two kernels)

    python -m kernels.compile_check [--arch 90 100]      # one JSON line per kernel and arch

Run it in a process without TRITON_INTERPRET (which, once set, breaks triton.compile);
tests/test_kernel_compile.py does, and asserts on the report.
"""

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import tempfile

import triton

from kernels.launch import compile_for

ARCHS = (90, 100)
TENSOR_CORE_OP = {90: "wgmma.mma_async", 100: "tcgen05.mma"}
# opt-in dynamic shared memory per block (CUDA programming guide, compute capabilities table)
SHARED_LIMIT = {90: 227 * 1024, 100: 227 * 1024}
TMA_OP = "cp.async.bulk.tensor"


def cases(arch):
    """Every kernel's launches for arch, from the launchers themselves (their compile_cases)."""
    from kernels import checksum, differential, logits, topk

    modules = (logits, topk, checksum, differential)
    return [case for m in modules for case in m.compile_cases(arch)]


def _resource_usage(cubin):
    """{'REG': n, 'STACK': n, 'SHARED': n, 'LOCAL': n} from cuobjdump -res-usage (shipped with Triton)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def inspect(case, arch):
    """Compile case for arch; the report as a dict (see the module docstring)."""
    with contextlib.redirect_stdout(io.StringIO()):  # Triton prints the whole PTX on a ptxas error
        k = compile_for(case.launch, arch)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    usage = _resource_usage(k.asm["cubin"])
    return dict(
        name=case.name,
        kernel=case.launch.kernel.__name__,
        arch=arch,
        options=case.launch.options,
        constexprs={p.name: case.launch.args[p.name] for p in case.launch.kernel.params if p.is_constexpr},
        expect_tensor_core=case.tensor_core,
        expect_tma=case.tma,
        tensor_core=ptx.count(TENSOR_CORE_OP[arch]),
        other_tensor_core=sum(ptx.count(op) for a, op in TENSOR_CORE_OP.items() if a != arch),
        tma=ptx.count(TMA_OP),
        cp_async=len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
        expect_pdl=case.pdl,
        griddepcontrol=len(re.findall(r"griddepcontrol\.(?:wait|launch_dependents)", ptx)),
        expect_overlap=case.overlap,
        ptx_local=len(re.findall(r"^\s*\.local\b", ptx, re.M)),
        local_bytes=usage.get("LOCAL", 0),
        stack_bytes=usage.get("STACK", 0),
        regs=usage.get("REG"),
        shared=k.metadata.shared,
        shared_limit=SHARED_LIMIT[arch],
        ctas_per_sm=ctas_per_sm(k.metadata.shared, usage.get("REG", 0), case.launch.options["num_warps"]),
        waits=[int(n) for n in re.findall(r"ttg\.async_wait[^{\n]*\{num = (\d+)", ttgir)],
    )


def ctas_per_sm(shared, regs, num_warps):
    """CTAs an SM can hold (about): 228 KB of shared memory, 1 KB of it reserved per CTA, and
    64K registers (both the same on sm_90 and sm_100)."""
    return min(228 * 1024 // (shared + 1024), 65536 // (max(regs, 1) * 32 * num_warps))


CANDIDATE_COLS = ["kind", "config", "tensor_core", "tma", "regs", "spill_bytes", "shared", "ctas_per_sm"]


def candidate_rows(arch):
    """Every config of the logits sweep's space for arch, compiled: what each would cost on that
    target (the evidence for the table's entries on an architecture we cannot run)."""
    from kernels import logits
    from kernels.logits_configs import candidates

    rows = []
    for kind in ("bf16", "fp8"):
        for cfg in candidates(kind, 64, 128, arch):
            case = next(c for c in logits.compile_cases(arch, cfg) if c.name == f"logits_{kind}")
            r = inspect(case, arch)
            rows.append(
                dict(
                    kind=kind,
                    config=" ".join(f"{k}={v}" for k, v in cfg._asdict().items() if k != "min_programs"),
                    tensor_core=r["tensor_core"],
                    tma=r["tma"],
                    regs=r["regs"],
                    spill_bytes=r["local_bytes"] + r["stack_bytes"] + r["ptx_local"],
                    shared=r["shared"],
                    ctas_per_sm=r["ctas_per_sm"],
                )
            )
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernels.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS)
    p.add_argument("--candidates", action="store_true", help="compile the logits sweep's configs instead")
    p.add_argument("--out", default=None, help="with --candidates: folder for compile_sm<arch>.{json,md}")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("TRITON_INTERPRET=1 is set: triton.compile fails under it; unset it and rerun")
    for arch in a.arch:
        if a.candidates:
            from kernels.harness import meta, write_table

            info = meta(target=f"sm_{arch}a", shape=dict(heads=64, dim=128), note="compiled, not run")
            print(write_table(a.out, f"compile_sm{arch}", info, candidate_rows(arch), CANDIDATE_COLS))
            continue
        for case in cases(arch):
            print(json.dumps(inspect(case, arch)), flush=True)


if __name__ == "__main__":
    main()
