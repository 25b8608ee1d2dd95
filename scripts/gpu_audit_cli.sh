#!/usr/bin/env bash
# `python -m nblib audit` on CUDA (about 3 minutes on an H200): the exit code of every example
# target against the one the simulator gives, and the DeepSeek-V4 prepare-path transcription with
# the fused q/kv projection on and off, each as text and JSON. On the GPU machine, from the
# repository root:
#   source scripts/device_setup.sh && scripts/gpu_audit_cli.sh OUTDIR
# writes OUTDIR/<target>.{txt,json,err}, OUTDIR/exit_codes.txt (target, expected, CUDA's code) and
# OUTDIR.tgz. Exits 1 when a code differs from the expected one, so the difference is seen.
set -u
out=${1:?usage: scripts/gpu_audit_cli.sh OUTDIR}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || { echo "no CUDA GPU here: run scripts/gpu_audit_cli.sh on the GPU machine" >&2; exit 2; }
mkdir -p "$out"
: > "$out/exit_codes.txt"
differ=0
# expected: the simulator's codes (tests/test_audit_cli.py), 1 for the plain torch.cuda twin of racy
check() {
  local want=$1 name=$2 target=$3 rc
  timeout 300 python3 -m nblib audit "$target" --backend cuda --label "$name" > "$out/$name.txt" 2> "$out/$name.err"
  rc=$?
  timeout 300 python3 -m nblib audit "$target" --backend cuda --json > "$out/$name.json" 2>> "$out/$name.err"
  echo "$name $target expected $want cuda $rc (json run: $?)" | tee -a "$out/exit_codes.txt"
  [ "$rc" = "$want" ] || differ=1
}
check 1 racy examples/audit/decode_step.py:racy
check 0 join_before_free examples/audit/decode_step.py:join_before_free
check 0 record_stream examples/audit/decode_step.py:record_stream
check 0 persistent_buffer examples/audit/decode_step.py:persistent_buffer
check 2 host_sync examples/audit/decode_step.py:host_sync
check 1 plain_cuda examples/audit/decode_step.py:plain_cuda
check 2 bad_target examples/audit/decode_step.py:no_such_function
check 1 dsv4_fused examples/audit/dsv4_attention.py:fused
check 0 dsv4_unfused examples/audit/dsv4_attention.py:unfused
cat "$out/dsv4_fused.txt"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $differ
