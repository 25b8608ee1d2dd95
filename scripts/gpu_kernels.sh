#!/usr/bin/env bash
# The top-k and differential kernels on a CUDA GPU, in one run (about 5 minutes on an H200):
#   1. check    every top-k kernel (kernels.topk.KERNELS: fused, the default, and bound) and the
#               differential against their references            -> OUTDIR/check.json
#   2. bench    the top-k kernels beside torch.topk, and the differential beside its torch path,
#               each after a clean and after a dirty L2 flush, as a fraction of the copy bandwidth
#               measured in the same run and as a speedup over torch -> OUTDIR/bench.{md,json}
#   3. sweep    the top-k kernels' launch configs, each checked then timed
#                                                  -> OUTDIR/sweep_topk.{md,json}, sweep_topk_fused.{md,json}
#   4. pytest   the GPU tests of both (CUDA-graph replays with and without programmatic launch)
#   5. compile  every kernel for sm_90a through triton.compile (no spills, griddepcontrol where
#               asked)                                             -> OUTDIR/compile_sm90.jsonl
# On the GPU machine:
#   source scripts/device_setup.sh && scripts/gpu_kernels.sh OUTDIR
# Each step has its own time limit and a log (OUTDIR/<step>.log); a step that fails or hangs does
# not stop the next. Ends with each step's exit status, the bench table, and OUTDIR.tgz.
set -u
out=${1:?usage: scripts/gpu_kernels.sh OUTDIR}
cd "$(dirname "$0")/.." || exit 2
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || { echo "no CUDA GPU here: run scripts/gpu_kernels.sh on the GPU machine" >&2; exit 2; }
mkdir -p "$out"
status=()
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  status+=("$name: rc $rc, $(( $(date +%s) - t0 )) s")
  echo "${status[-1]}"
}
only=topk,differential
step check 300 python3 -m kernels --check --only "$only" --out "$out"
step bench 420 python3 -m kernels --bench --only "$only" --out "$out"
step sweep 420 python3 -m kernels --sweep --only topk --out "$out"
step pytest-gpu 600 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_topk.py \
  tests/test_instrument_kernels.py
# the compile check refuses TRITON_INTERPRET (it breaks triton.compile)
step compile-sm90 600 env -u TRITON_INTERPRET python3 -m kernels.compile_check --arch 90
grep '^{' "$out/compile-sm90.log" > "$out/compile_sm90.jsonl"
python3 - "$out/compile_sm90.jsonl" > "$out/compile-sm90-verdict.log" 2>&1 <<'EOF'
import json, sys
bad = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["ptx_local"] or r["local_bytes"] or r["stack_bytes"]:
        bad.append(f"{r['name']}: spills {r['local_bytes']} B local, {r['stack_bytes']} B stack")
    if (r["griddepcontrol"] > 0) != r["expect_pdl"]:
        bad.append(f"{r['name']}: {r['griddepcontrol']} griddepcontrol, expected pdl {r['expect_pdl']}")
print("\n".join(bad) or "every sm_90a case compiled without spills, griddepcontrol where asked")
sys.exit(1 if bad else 0)
EOF
status+=("compile-sm90 verdict: rc $?")
echo
printf '%s\n' "${status[@]}" | tee "$out/status.txt"
tail -n 2 "$out/pytest-gpu.log"
cat "$out/compile-sm90-verdict.log"
[ -f "$out/bench.md" ] && cat "$out/bench.md"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "wrote $out.tgz"
