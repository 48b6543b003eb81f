#!/usr/bin/env bash
# A full or failing disk during a save, a manifest commit and a trace append: a clear error with
# the documented exit code (4), the previous checkpoints intact, and `resume` afterwards ends on
# the same hash chain as a run that never failed. The disk is simulated by an LD_PRELOAD library
# (tests/testing/failing_io.c) that fails writes to the files whose path contains a given text.
set -u
RETRACE=${1:?usage: disk_faults_test.sh path/to/retrace path/to/libretrace_failing_io.so}
SHIM=${2:?shim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
run=(--total-steps 40 --set checkpoint.every_steps=10 --set train.eval_each_epoch=false --set "model.hidden=[32]" --plain)
"$RETRACE" record "${run[@]}" --out "$tmp/ref" >/dev/null || { echo "reference run failed"; exit 1; }
ref=$(last_chain "$tmp/ref")

case_() {  # name, path text, errno, bytes, fsync?, message pattern
  local name=$1 path=$2 err=$3 after=$4 fsync=$5 pattern=$6
  local out="$tmp/$name"
  expect "$name" 4 "$pattern" -- env LD_PRELOAD="$SHIM" RETRACE_FAIL_PATH="$path" RETRACE_FAIL_ERRNO="$err" \
    RETRACE_FAIL_AFTER="$after" RETRACE_FAIL_FSYNC="$fsync" "$RETRACE" record "${run[@]}" --out "$out"
  for s in 10 20; do
    if [[ -d "$out/checkpoints/step-000000$s" ]]; then
      expect "$name-keeps-step-$s" 0 "VERIFIED" -- "$RETRACE" verify "$out/checkpoints/step-000000$s"
    fi
  done
  expect "$name-resume" 0 "resumed and recorded" -- "$RETRACE" resume "$out" --plain
  check_eq "$name-resume-bitwise" "$(last_chain "$out")" "$ref"
}

# The disk fills up in the middle of step 30's shard: the save fails, 10 and 20 stay.
case_ enospc-shard "step-00000030/shard-rank" ENOSPC 100000 0 "No space left on device"
# The manifest commit of step 30 cannot be written.
case_ enospc-manifest "step-00000030/manifest.json" ENOSPC 10 0 "No space left on device"
# An I/O error when step 30's shard is made durable.
case_ eio-shard-fsync "step-00000030/shard-rank" EIO 1000000000 1 "Input/output error"
# The trace append fails after some frames: the steps since the last checkpoint are redone.
case_ eio-trace "trace.rtrace" EIO 9000 0 "Input/output error"
case_ enospc-trace "trace.rtrace" ENOSPC 9000 0 "No space left on device"

echo "disk_faults: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
