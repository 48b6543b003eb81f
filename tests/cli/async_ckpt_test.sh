#!/usr/bin/env bash
# Background saves (checkpoint.async, issue 52) end to end: an async run and a synchronous one end
# on one hash chain with the same checkpoint contents; a bit flipped in the staging copy is caught
# and names the tensor; kills during a background save (injected before its commit, and from
# outside during its write on a slow disk) and a full or read-only disk during one lose nothing, and
# every resume ends on the chain of a run that never failed; an interrupt waits for the save in
# flight; two ranks save in the background, stop together when one rank's disk fails, and lose
# nothing when killed during a save; ZeRO says it saves synchronously; a resume takes the sha256
# the launcher computed ahead, and only for the bytes it read. The disk is the LD_PRELOAD shim
# tests/testing/failing_io.c (its slow mode keeps a save in flight for a few steps).
set -u
RETRACE=${1:?usage: async_ckpt_test.sh path/to/retrace path/to/libretrace_failing_io.so}
SHIM=${2:?shim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
run=(--total-steps 40 --set checkpoint.every_steps=10 --set train.eval_each_epoch=false --set "model.hidden=[32]" --plain)
# Each piece's tensor, place and xxh3, and the config hash: what a checkpoint holds, without the
# trace position (frames hold timings, so two runs' traces differ in size).
content() { python3 - "$1" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print(m["config_hash"])
for t in m["tensors"]:
    for p in t["pieces"]:
        print(t["name"], p["begin"], p["xxh3"])
EOF
}
check_true() {  # name, then a command that must succeed
  local name=$1; shift
  if "$@"; then echo "ok   $name"; passes=$((passes+1)); else echo "FAIL $name"; fails=$((fails+1)); fi
}
step() { printf '%s/checkpoints/step-%08d' "$1" "$2"; }
committed() { [[ -f "$(step "$1" "$2")/manifest.json" ]]; }
not_committed() { [[ ! -f "$(step "$1" "$2")/manifest.json" ]]; }

# 1. The default saves in the background, and ends where a synchronous run ends: one chain, the
#    same tensors in every checkpoint, the same config hash (checkpoint.async is outside it).
expect async-run 0 "in the background; the loop was blocked" -- "$RETRACE" record "${run[@]}" --out "$tmp/async"
expect sync-run 0 "checkpoint .*MB/s\)" -- "$RETRACE" record "${run[@]}" --set checkpoint.async=false --out "$tmp/sync"
check_eq async-chain-is-sync-chain "$(last_chain "$tmp/async")" "$(last_chain "$tmp/sync")"
for s in 10 20 30 40; do
  check_eq "step-$s-same-content" "$(content "$(step "$tmp/async" $s)/manifest.json")" \
    "$(content "$(step "$tmp/sync" $s)/manifest.json")"
done
expect async-verifies 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/async" 30)"
check_true config-keeps-async grep -q "^async = true" "$tmp/async/config.toml"
check_true sync-config-says-so grep -q "^async = false" "$tmp/sync/config.toml"
# The loop's time on checkpoints is in the next step's record (timings.checkpoint_ms, the CSV's
# last column): 0 at step 1; a synchronous save of step 10 takes longer than the poll before step 5.
ckpt_ms() { "$RETRACE" inspect "$1/trace.rtrace" --csv | awk -F, -v s="$2" '$1 == s { print $NF }'; }
check_eq checkpoint-ms-column "$("$RETRACE" inspect "$tmp/sync/trace.rtrace" --csv | head -1 | awk -F, '{ print $NF }')" \
  checkpoint_ms
check_eq checkpoint-ms-step-1 "$(ckpt_ms "$tmp/sync" 1)" 0
check_true checkpoint-ms-sync-save awk -v a="$(ckpt_ms "$tmp/sync" 11)" -v b="$(ckpt_ms "$tmp/sync" 5)" \
  'BEGIN { exit !(a > b && a > 0) }'
check_true checkpoint-ms-async-staging awk -v a="$(ckpt_ms "$tmp/async" 21)" 'BEGIN { exit !(a > 0) }'
expect bad-on-error 2 "checkpoint.on_error.*stop.*continue" -- \
  "$RETRACE" record "${run[@]}" --set checkpoint.on_error=maybe --out "$tmp/bad"

# 2. A bit flipped in the staging copy of step 20: refused before the commit, the tensor named
#    (exit 3); step 20 has no manifest, LATEST still names step 10; the resume does not inject it
#    again and ends on the chain of the same config saved synchronously (where the fault does nothing).
flip=(--inject corrupt-staging@20:model/layers.0.weight)
expect corrupt-staging 3 "staged copy of model/layers.0.weight differs" -- \
  "$RETRACE" record "${run[@]}" "${flip[@]}" --out "$tmp/flip"
check_true corrupt-staging-not-committed not_committed "$tmp/flip" 20
check_eq corrupt-staging-latest "$(cat "$tmp/flip/checkpoints/LATEST")" "step-00000010"
expect flip-sync-ref 0 "not injected: the save of step 20 is synchronous" -- \
  "$RETRACE" record "${run[@]}" "${flip[@]}" --set checkpoint.async=false --out "$tmp/flip-ref"
expect corrupt-staging-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/flip" --plain
check_eq corrupt-staging-resume-bitwise "$(last_chain "$tmp/flip")" "$(last_chain "$tmp/flip-ref")"

# 3. Killed during step 20's background save, its shard durable, before its manifest: step 10
#    loads, the resume ends on the chain of the same config saved synchronously.
kill20=(--inject crash-in-save@20)
expect crash-in-save 137 "" -- "$RETRACE" record "${run[@]}" "${kill20[@]}" --out "$tmp/kill"
check_true crash-in-save-shard-there test -f "$(step "$tmp/kill" 20)/shard-rank00000.safetensors"
check_true crash-in-save-not-committed not_committed "$tmp/kill" 20
expect crash-in-save-keeps-10 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/kill" 10)"
expect kill-sync-ref 0 "" -- "$RETRACE" record "${run[@]}" "${kill20[@]}" --set checkpoint.async=false --out "$tmp/kill-ref"
expect crash-in-save-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/kill" --plain
check_eq crash-in-save-resume-bitwise "$(last_chain "$tmp/kill")" "$(last_chain "$tmp/kill-ref")"
check_true crash-in-save-resume-commits-20 committed "$tmp/kill" 20

ref=$(last_chain "$tmp/sync")
# 4. The disk fills up during step 30's background save. on_error = continue: a warning and an
#    event, no step 30, step 40 committed (the end's save), exit 0; the trace is the reference's.
expect enospc-continue 0 "background save of step 30 failed and was not committed: .*No space left on device" -- \
  env LD_PRELOAD="$SHIM" RETRACE_FAIL_PATH="step-00000030/shard-rank" RETRACE_FAIL_ERRNO=ENOSPC \
  RETRACE_FAIL_AFTER=1000 "$RETRACE" record "${run[@]}" --set checkpoint.on_error=continue --out "$tmp/full"
check_true enospc-continue-no-30 not_committed "$tmp/full" 30
expect enospc-continue-40 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/full" 40)"
check_eq enospc-continue-chain "$(last_chain "$tmp/full")" "$ref"
check_true enospc-continue-event grep -q "background save of step 30 failed" \
  <("$RETRACE" inspect "$tmp/full/trace.rtrace" --json 2>&1)

# 5. A read-only directory for step 30's shard, on_error = stop (the default): exit 4 at a later
#    step naming the save and the newest committed checkpoint; 10 and 20 verify; resume is bitwise.
expect erofs-stop 4 "background save of step 30 failed: .*Read-only file system.*newest checkpoint committed is .*step-00000020" -- \
  env LD_PRELOAD="$SHIM" RETRACE_FAIL_PATH="step-00000030/shard-rank" RETRACE_FAIL_ERRNO=EROFS \
  "$RETRACE" record "${run[@]}" --out "$tmp/ro"
check_true erofs-no-30 not_committed "$tmp/ro" 30
expect erofs-keeps-20 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/ro" 20)"
cp -r "$tmp/ro" "$tmp/ro-again"
expect erofs-again-after-resume 4 "background save of step 30 failed: .*newest checkpoint committed is .*step-00000020" -- \
  env LD_PRELOAD="$SHIM" RETRACE_FAIL_PATH="step-00000030/shard-rank" RETRACE_FAIL_ERRNO=EROFS \
  "$RETRACE" resume "$tmp/ro-again" --plain
expect erofs-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/ro" --plain
check_eq erofs-resume-bitwise "$(last_chain "$tmp/ro")" "$ref"

# 6. A slow disk keeps step 20's save in flight: the interrupt at 25 waits for it, then saves 25;
#    both commit, and the resume is bitwise. Saves every 2 steps on it wait for each other, and say so.
slow=(env LD_PRELOAD="$SHIM" RETRACE_SLOW_PATH="step-00000020/shard-rank" RETRACE_SLOW_US=1500000)
expect interrupt-waits 0 "" -- "${slow[@]}" "$RETRACE" record "${run[@]}" --interrupt-at 25 --out "$tmp/int"
check_true interrupt-commits-20 committed "$tmp/int" 20
check_true interrupt-commits-25 committed "$tmp/int" 25
expect interrupt-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/int" --plain
check_eq interrupt-resume-bitwise "$(last_chain "$tmp/int")" "$ref"
expect waits-are-said 0 "checkpoint: waited [0-9.]+ s for the previous background save before step 22" -- \
  "${slow[@]}" "$RETRACE" record "${run[@]}" --set checkpoint.every_steps=2 --out "$tmp/wait"

# 7. SIGKILL from outside while step 20's shard is being written (slow disk): the torn .tmp is
#    never loaded, LATEST names step 10, and the resume is bitwise.
env LD_PRELOAD="$SHIM" RETRACE_SLOW_PATH="step-00000020/shard-rank" RETRACE_SLOW_US=3000000 \
  "$RETRACE" record "${run[@]}" --out "$tmp/sigkill" >"$tmp/sigkill.log" 2>&1 &
pid=$!
seen=no
for _ in $(seq 1 600); do
  if compgen -G "$(step "$tmp/sigkill" 20)/*.tmp" >/dev/null; then seen=yes; break; fi
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check_eq sigkill-while-the-shard-is-written "$seen" yes
check_true sigkill-during-write-not-committed not_committed "$tmp/sigkill" 20
check_eq sigkill-latest "$(cat "$tmp/sigkill/checkpoints/LATEST")" "step-00000010"
expect sigkill-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/sigkill" --plain
check_eq sigkill-resume-bitwise "$(last_chain "$tmp/sigkill")" "$ref"

# 8. Two ranks save in the background too (their writer threads vote on a process group of their
#    own): the run ends on the chain of a synchronous two-rank run, with the same checkpoints.
two=("${run[@]}" --world-size 2)
expect two-ranks-async 0 "in the background; the loop was blocked" -- "$RETRACE" record "${two[@]}" --out "$tmp/two"
expect two-ranks-sync 0 "" -- "$RETRACE" record "${two[@]}" --set checkpoint.async=false --out "$tmp/two-sync"
ref2=$(last_chain "$tmp/two-sync")
check_eq two-ranks-chain "$(last_chain "$tmp/two")" "$ref2"
for s in 10 20 30 40; do
  check_eq "two-ranks-step-$s-same-content" "$(content "$(step "$tmp/two" $s)/manifest.json")" \
    "$(content "$(step "$tmp/two-sync" $s)/manifest.json")"
done
expect two-ranks-verify 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/two" 30)"

# 9. Rank 1's disk alone fills up during step 30's background save. The commit vote carries the
#    failure, so both ranks take it at one step: under stop both stop (exit 4, rank 1 named), and
#    the resume is bitwise; under continue both go on, with no step 30.
full1=(env LD_PRELOAD="$SHIM" RETRACE_FAIL_PATH="step-00000030/shard-rank00001" RETRACE_FAIL_ERRNO=ENOSPC
  RETRACE_FAIL_AFTER=1000)
expect two-enospc-stop 4 "background save of step 30 failed: .*failed on rank 1: .*No space left on device" -- \
  "${full1[@]}" "$RETRACE" record "${two[@]}" --out "$tmp/two-full"
check_true two-enospc-stop-no-30 not_committed "$tmp/two-full" 30
expect two-enospc-stop-keeps-20 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/two-full" 20)"
expect two-enospc-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/two-full" --world-size 2 --plain
check_eq two-enospc-resume-bitwise "$(last_chain "$tmp/two-full")" "$ref2"
expect two-enospc-continue 0 "background save of step 30 failed and was not committed: .*rank 1" -- \
  "${full1[@]}" "$RETRACE" record "${two[@]}" --set checkpoint.on_error=continue --out "$tmp/two-cont"
check_true two-enospc-continue-no-30 not_committed "$tmp/two-cont" 30
expect two-enospc-continue-40 0 "VERIFIED" -- "$RETRACE" verify "$(step "$tmp/two-cont" 40)"
check_eq two-enospc-continue-chain "$(last_chain "$tmp/two-cont")" "$ref2"

# 10. Both ranks killed in step 20's background save, their shards durable, before the commit:
#     step 10 loads, and the resume is bitwise.
expect two-crash-in-save 4 "" -- "$RETRACE" record "${two[@]}" --inject crash-in-save@20 --out "$tmp/two-kill"
check_true two-crash-in-save-not-committed not_committed "$tmp/two-kill" 20
check_eq two-crash-in-save-latest "$(cat "$tmp/two-kill/checkpoints/LATEST")" "step-00000010"
expect two-crash-in-save-resume 0 "resumed and recorded" -- "$RETRACE" resume "$tmp/two-kill" --world-size 2 --plain
check_eq two-crash-in-save-resume-bitwise "$(last_chain "$tmp/two-kill")" "$ref2"

# ZeRO-1 (here on one rank): its digests are sums over the ranks' slices, with no share per tensor
# kept, so its saves are synchronous and say so.
expect zero-says-sync 0 "saves are synchronous although checkpoint.async = true: under runtime.zero_stage = 1" -- \
  "$RETRACE" record "${run[@]:2}" --total-steps 12 --set runtime.zero_stage=1 --out "$tmp/zero"

# 11. A resume on one rank through the launcher: its child hashed the newest shard while the trainer
#     started, and the trainer takes that sha256 (every block it read has the child's xxh3) and says
#     so; retrace-core started alone, or with a forged hint in its environment, hashes the shard itself;
#     all end on the chain of a run that never stopped. A byte changed in the newest shard is refused
#     through the hint as without it: the resume skips that checkpoint for the one before, bitwise.
core="$(dirname "$RETRACE")/retrace-core"
"$RETRACE" record "${run[@]}" --interrupt-at 30 --out "$tmp/ahead" > /dev/null 2>&1
cp -r "$tmp/ahead" "$tmp/ahead-core"; cp -r "$tmp/ahead" "$tmp/ahead-forged"; cp -r "$tmp/ahead" "$tmp/ahead-flip"
expect ahead-taken 0 "loaded .*step-00000030 .*its sha256 computed ahead by the launcher" -- \
  "$RETRACE" resume "$tmp/ahead" --plain
check_eq ahead-bitwise "$(last_chain "$tmp/ahead")" "$ref"
out=$("$core" resume "$tmp/ahead-core" --plain 2>&1)
check_true core-alone-hashes-itself bash -c '! grep -q "computed ahead" <<<"$1" && grep -q "^loaded " <<<"$1"' _ "$out"
check_eq core-alone-bitwise "$(last_chain "$tmp/ahead-core")" "$ref"
out=$(RETRACE_HASH_AHEAD="0:1" "$core" resume "$tmp/ahead-forged" --plain 2>&1 < /dev/null)
check_true forged-hint-ignored bash -c '! grep -q "computed ahead" <<<"$1" && grep -q "^loaded " <<<"$1"' _ "$out"
check_eq forged-hint-bitwise "$(last_chain "$tmp/ahead-forged")" "$ref"
shard30="$(step "$tmp/ahead-flip" 30)/shard-rank00000.safetensors"
printf '\x5a' | dd of="$shard30" bs=1 seek=$(( $(stat -c %s "$shard30") - 7 )) conv=notrunc status=none
expect ahead-flip-skipped 0 "skipped checkpoint .*step-00000030: .*sha256" -- "$RETRACE" resume "$tmp/ahead-flip" --plain
check_eq ahead-flip-bitwise "$(last_chain "$tmp/ahead-flip")" "$ref"

# 12. The writer borrows one of the step's lanes while it works (checkpoint.lend_lane): the default
#     MLP at two lanes, whose GEMMs are cut into tiles by the lane count, with step 10's shard on a
#     slow disk so that the save spans several steps: the run says it ran on one lane meanwhile, and
#     ends on the chain of a run whose writer lent nothing.
lend=(--total-steps 30 --set checkpoint.every_steps=10 --set train.eval_each_epoch=false --set runtime.threads=2 --plain)
slow10=(env LD_PRELOAD="$SHIM" RETRACE_SLOW_PATH="step-00000010/shard-rank" RETRACE_SLOW_US=1000000)
expect lend-lane 0 "step-00000010 .*the step ran on 1 lane for [0-9.]+ s of it" -- \
  "${slow10[@]}" "$RETRACE" record "${lend[@]}" --out "$tmp/lend"
out=$("${slow10[@]}" "$RETRACE" record "${lend[@]}" --set checkpoint.lend_lane=false --out "$tmp/nolend" 2>&1)
check_true lend-none-says-nothing bash -c 'grep -q "step-00000010 .*in the background" <<<"$1" && ! grep -q "ran on 1 lane" <<<"$1"' _ "$out"
check_eq lend-lane-bitwise "$(last_chain "$tmp/lend")" "$(last_chain "$tmp/nolend")"
#     The lane goes back to the step while the writer waits on the disk: with the shard's fsync
#     taking 2 s, the save takes at least that long and the lane is lent for the rest only.
fsync10=(env LD_PRELOAD="$SHIM" RETRACE_SLOW_PATH="step-00000010/shard-rank" RETRACE_SLOW_US=0
  RETRACE_SLOW_FSYNC_US=2000000)
out=$("${fsync10[@]}" "$RETRACE" record "${lend[@]}" --out "$tmp/lend-fsync" 2>&1)
saved=$(sed -nE 's/.*step-00000010 \([0-9.]+ MB in ([0-9.]+) s.*/\1/p' <<<"$out")
lent=$(sed -nE 's/.*step-00000010 .*the step ran on 1 lane for ([0-9.]+) s of it.*/\1/p' <<<"$out")
check_true lend-not-while-fsync awk -v s="${saved:-0}" -v l="${lent:-99}" 'BEGIN { exit !(s >= 2 && s - l >= 1.5) }'
check_eq lend-fsync-bitwise "$(last_chain "$tmp/lend-fsync")" "$(last_chain "$tmp/nolend")"

echo "async_ckpt: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
