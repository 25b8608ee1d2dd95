#!/usr/bin/env bash
# Every GPU check in one run (about 5 minutes on an H200): the capture audit on CUDA, the
# GPU tests, the kernels' checks, config sweep and timing table, what the instruments cost per
# replay (the graphed canary included), and where the fp8 logits kernel's time goes. On the GPU
# machine:
#   source scripts/device_setup.sh && scripts/gpu_checks.sh OUTDIR
# writes OUTDIR/{audit-zoo,bench,cost}/ and one log per step, then OUTDIR.tgz (one file to bring back).
# Each step has its own time limit, so one that hangs cannot take the others' time.
set -u
out=${1:?usage: scripts/gpu_checks.sh OUTDIR}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || { echo "no CUDA GPU here: run scripts/gpu_checks.sh on the GPU machine" >&2; exit 2; }
mkdir -p "$out"
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s"
}
step audit-zoo 150 python3 scripts/gpu_audit_zoo.py "$out/audit-zoo"
step pytest-gpu 240 python3 -m pytest -q -m gpu -p no:cacheprovider
step kernels 150 python3 -m kernels --check --sweep --bench --out "$out/bench"
step instrument-cost 120 python3 scripts/gpu_instrument_cost.py "$out/cost"
step fp8-probe 100 python3 scripts/gpu_fp8_probe.py  # its table is the step's log
tail -n 2 "$out/pytest-gpu.log"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
