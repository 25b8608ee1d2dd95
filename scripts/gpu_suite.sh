#!/usr/bin/env bash
# Notebooks of the main job on one GPU, each in its own run with its own time limit, into one folder,
# then OUTDIR.tgz (one file to bring back). A notebook that runs out of time is marked failed; the
# ones before it keep their results. On the GPU machine:
#   source scripts/device_setup.sh && scripts/gpu_suite.sh OUTDIR PARAMS LIMIT_S NOTEBOOK...
# e.g. scripts/gpu_suite.sh outputs/gpu params/gpu.yaml 300 00 02
set -u
out=${1:?usage: scripts/gpu_suite.sh OUTDIR PARAMS LIMIT_S NOTEBOOK...}
params=${2:?params file}
limit=${3:?seconds per notebook}
shift 3
mkdir -p "$out"
for nb in "$@"; do
  t0=$(date +%s)
  timeout "$limit" python3 -m nblib run --params "$params" --out "$out" --only "$nb" > "$out/run-$nb.log" 2>&1
  echo "$nb: rc $?, $(( $(date +%s) - t0 )) s"
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
