#!/usr/bin/env bash
# The forced order and the method on one GPU, in one call: the GPU tests of `--confirm`, the confirm
# table (scripts/confirm_table.py), then notebooks 07 and 03 on params/gpu.yaml (02 is the timed
# suite's: scripts/gpu_suite.sh).
# On the GPU machine, from the repository root:
#   source scripts/device_setup.sh && scripts/gpu_method.sh OUTDIR [LIMIT_S]
# writes OUTDIR/pytest-confirm.log, OUTDIR/<notebook> files, OUTDIR/summary.txt and OUTDIR.tgz.
set -u
out=${1:?usage: scripts/gpu_method.sh OUTDIR [LIMIT_S]}
limit=${2:-240}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || { echo "no CUDA GPU here: run scripts/gpu_method.sh on the GPU machine" >&2; exit 2; }
mkdir -p "$out"
echo "commit ${NBLIB_COMMIT:-unknown}" > "$out/summary.txt"
t0=$(date +%s)
timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_audit_confirm.py \
  > "$out/pytest-confirm.log" 2>&1
echo "confirm tests: rc $?, $(( $(date +%s) - t0 )) s: $(tail -n 1 "$out/pytest-confirm.log")" | tee -a "$out/summary.txt"
t0=$(date +%s)
timeout "$limit" python3 scripts/confirm_table.py "$out/confirm-cuda" --backend cuda > "$out/confirm-cuda.log" 2>&1
echo "confirm table: rc $?, $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
for nb in 07 03; do
  t0=$(date +%s)
  timeout "$limit" python3 -m nblib run --params params/gpu.yaml --out "$out" --only "$nb" > "$out/run-$nb.log" 2>&1
  echo "$nb: rc $?, $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
done
# the executed notebooks carry their figures inline: the archive keeps logs, summaries and results.json
tar czf "$out.tgz" --exclude="*.html" --exclude="*.png" --exclude="*.ipynb" --exclude=".references" -C "$(dirname "$out")" "$(basename "$out")"
