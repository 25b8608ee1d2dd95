#!/usr/bin/env bash
# The GPU tests, every time: `pytest -m gpu` three times, each in a fresh process, then once with the
# collected order reversed (tests/conftest.py --reverse), so a test that passes only after another
# (a warmed cache, a graph awaiting collection) shows. On the GPU machine:
#   source scripts/device_setup.sh && scripts/gpu_tests.sh OUTDIR [LIMIT_S] [RUNS]
# writes OUTDIR/pytest-gpu-{1,2,3,reversed}.log and OUTDIR/summary.txt. RUNS (default "1 2 3 reversed")
# picks the runs, e.g. "1 reversed" where the machine's time allows two.
set -u
out=${1:?usage: scripts/gpu_tests.sh OUTDIR [LIMIT_S]}
limit=${2:-240}
runs=${3:-1 2 3 reversed}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || { echo "no CUDA GPU here: run scripts/gpu_tests.sh on the GPU machine" >&2; exit 2; }
mkdir -p "$out"
{
  echo "commit ${NBLIB_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$out/summary.txt"
for run in $runs; do
  flags=()
  [ "$run" = reversed ] && flags=(--reverse)
  t0=$(date +%s)
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider -rs "${flags[@]}" > "$out/pytest-gpu-$run.log" 2>&1
  echo "run $run: rc $?, $(( $(date +%s) - t0 )) s: $(tail -n 1 "$out/pytest-gpu-$run.log")" | tee -a "$out/summary.txt"
done
