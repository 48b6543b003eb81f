#!/usr/bin/env bash
# The run is a pure function of (config, data, code, numerics) at every step, faults included: an
# interrupted-and-resumed run's whole trace (every step record in order, evaluations, training
# events) equals the uninterrupted run's, for interrupts before, at and after every kind of event
# (spike rollback, spike without an anchor yet, skipped step, checkpoint, epoch end, last step),
# at world size 1 and 2, with and without accumulation. Negative controls show the comparison
# catches a wrong rollback target and a rank whose RNG is not restored; bad input on resume
# (changed data, a changed TorchScript file, a changed world size) exits 3 and leaves the run
# directory as it was.
#   edges_test.sh path/to/retrace REPO_ROOT [quick]
set -u
RETRACE=${1:?usage: edges_test.sh path/to/retrace REPO_ROOT [quick]}
ROOT=${2:?}
QUICK=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$ROOT/tests/testing/expect.sh"
SAME="$ROOT/tests/run/same_trace.py"

# 58 batches of 1024 samples per epoch: the epoch ends at step 58; anchors at multiples of 10;
# keep_last 2, so a rollback cannot count on older checkpoint files.
base=(--plain --set model.hidden=[64] --set train.steps=70 --set checkpoint.every_steps=10
      --set checkpoint.keep_last=2 --set schedule.warmup_steps=5 --set guards.spike_window=3)
# spike@5: before the first anchor (skipped, the run goes on); spike@27: rollback to 20;
# nan-loss@33: a skip; spike@58: at the epoch end (rollback to 50); spike@70: on the last step.
faults=--inject=spike@5,spike@27,nan-loss@33,spike@58,spike@70

# check NAME WORLD "INTERRUPTS" ARGS...: one uninterrupted run, then for each interrupt step an
# interrupted run, its resume, and whole-trace equality with the uninterrupted run.
check() {
  local name=$1 world=$2 points=$3; shift 3
  local ref="$tmp/$name-ref"
  if ! "$RETRACE" record "${base[@]}" "$@" --world-size "$world" --out "$ref" >"$tmp/log" 2>&1; then
    echo "FAIL $name: the uninterrupted run failed"; tail -5 "$tmp/log"; fails=$((fails+1)); return
  fi
  for k in $points; do
    local run="$tmp/$name-$k"
    if ! "$RETRACE" record "${base[@]}" "$@" --world-size "$world" --interrupt-at "$k" --out "$run" >"$tmp/log" 2>&1 ||
       ! "$RETRACE" resume "$run" --plain --world-size "$world" >>"$tmp/log" 2>&1; then
      echo "FAIL $name interrupt at $k: a run failed"; tail -5 "$tmp/log"; fails=$((fails+1)); continue
    fi
    expect "$name-interrupt-$k" 0 "^same" -- python3 "$SAME" "$RETRACE" "$ref/trace.rtrace" "$run/trace.rtrace"
    rm -rf "$run"
  done
}

all="4 5 6 10 19 20 21 26 27 28 33 50 57 58 59 69 70"
some="5 20 27 33 58 70"
[[ -n $QUICK ]] && all=$some
check w1 1 "$all" --set data.batch_size=1024 "$faults"
check w1-accum 1 "$some" --set data.batch_size=512 --set train.accum_steps=2 "$faults"
check w2 2 "$some" --set data.batch_size=512 "$faults"
check w2-accum 2 "$some" --set data.batch_size=256 --set train.accum_steps=2 "$faults"

# The uninterrupted runs themselves: every rollback went to its anchor, the spike on the last step
# still ends with the final evaluation and the end checkpoint, and each rank draws its own masks.
ev=$("$RETRACE" inspect "$tmp/w1-ref/trace.rtrace")
expect w1-rollback-to-anchor 0 "rolled back to step 20" -- echo "$ev"
expect w1-epoch-end-rollback 0 "loss spike at step 58 .*rolled back to step 50" -- echo "$ev"
expect w1-last-step-rollback 0 "loss spike at step 70 .*rolled back to step 60" -- echo "$ev"
expect w1-no-anchor-yet 0 "loss spike at step 5 .*no rollback anchor yet" -- echo "$ev"
expect w1-final-checkpoint 0 "step-00000070" -- ls "$tmp/w1-ref/checkpoints"
expect w1-final-eval 0 '"step": 70' -- "$RETRACE" inspect "$tmp/w1-ref/trace.rtrace" --json
expect w2-rank-rng-distinct 0 "^distinct" -- python3 -c '
import json, subprocess, sys
j = json.loads(subprocess.run([sys.argv[1], "inspect", sys.argv[2], "--json"], capture_output=True, text=True).stdout)
ok = all(len(s["rank_rng_digests"]) == 2 and len(set(s["rank_rng_digests"])) == 2 for s in j["steps"])
print("distinct" if ok else "the ranks share RNG digests")' "$RETRACE" "$tmp/w2-ref/trace.rtrace"

# A recorded config reproduces its run, legacy-valued keys included (here LibTorch's dropout and the
# unfused AdamW, the values runs recorded before those keys existed read as).
legacy=(--set model.dropout_impl=torch --set optim.fused=false --set data.batch_size=1024 --set train.steps=30)
"$RETRACE" record "${base[@]}" "${legacy[@]}" --out "$tmp/legacy" >/dev/null 2>&1
"$RETRACE" record --plain --config "$tmp/legacy/config.toml" --out "$tmp/legacy-again" >/dev/null 2>&1
expect recorded-config-reproduces 0 "^same" -- python3 "$SAME" "$RETRACE" "$tmp/legacy/trace.rtrace" \
  "$tmp/legacy-again/trace.rtrace"
expect recorded-config-has-legacy-keys 0 "dropout_impl = 'torch'" -- cat "$tmp/legacy/config.toml"

# Negative controls: each sabotage must make the comparison fail.
neg() {
  local name=$1 world=$2 k=$3 sabotage=$4; shift 4
  local run="$tmp/neg-$name"
  RETRACE_TEST_SABOTAGE=$sabotage "$RETRACE" record "${base[@]}" "$@" --world-size "$world" --interrupt-at "$k" \
    --out "$run" >"$tmp/log" 2>&1
  RETRACE_TEST_SABOTAGE=$sabotage "$RETRACE" resume "$run" --plain --world-size "$world" >>"$tmp/log" 2>&1
  expect "negative-$name" 1 "^differ" -- python3 "$SAME" "$RETRACE" "$tmp/$name-ref/trace.rtrace" "$run/trace.rtrace"
}
# Interrupted at 25, the newest checkpoint on disk is 25's, not the anchor (20).
neg w1 1 25 rollback-newest-checkpoint --set data.batch_size=1024 "$faults"
neg w2 2 20 rank1-rng-restore --set data.batch_size=512 "$faults"

# Bisecting a rollback: the chains part at the first re-run step (21), the applied histories at
# the step whose batch was set aside (27).
"$RETRACE" record "${base[@]}" --set data.batch_size=1024 --set train.steps=40 --out "$tmp/plain" >/dev/null 2>&1
"$RETRACE" record "${base[@]}" --set data.batch_size=1024 --set train.steps=40 --inject spike@27 --out "$tmp/spiked" \
  >/dev/null 2>&1
expect bisect-rollback 1 "first divergence: step 27" -- "$RETRACE" bisect "$tmp/plain" "$tmp/spiked"

# Bisection at world size 2 re-executes on 2 ranks from the nearest checkpoint (10 for step 15),
# and names the rank whose RNG was not restored (the negative control's run, resumed at 20).
dp=("${base[@]}" --set data.batch_size=512 --set train.steps=30 --set checkpoint.keep_last=5 --world-size 2)
"$RETRACE" record "${dp[@]}" --out "$tmp/dpa" >/dev/null 2>&1
"$RETRACE" record "${dp[@]}" --out "$tmp/dpb" --inject perturb-param@15:layers.0.weight >/dev/null 2>&1
out=$("$RETRACE" bisect "$tmp/dpa" "$tmp/dpb" 2>&1)
expect bisect-dp-module 1 "first divergence: step 15, rank 0, module layers.0 \(Linear\), phase state: weight" -- \
  bash -c 'echo "$1"; exit 1' _ "$out"
expect bisect-dp-from-checkpoint 0 "re-executed from step 10 \(run A\) and 10 \(run B\)" -- echo "$out"
expect bisect-dp-on-2-ranks 0 "re-executed on 2 ranks" -- echo "$out"
RETRACE_TEST_SABOTAGE=rank1-rng-restore "$RETRACE" record "${dp[@]}" --interrupt-at 20 --out "$tmp/dpc" >/dev/null 2>&1
RETRACE_TEST_SABOTAGE=rank1-rng-restore "$RETRACE" resume "$tmp/dpc" --plain --world-size 2 >/dev/null 2>&1
expect bisect-dp-rank 1 "first divergence: step 21, rank 1" -- "$RETRACE" bisect "$tmp/dpa" "$tmp/dpc"

# Bad input on resume: exit 3, the run directory byte for byte as it was.
# Every file but the run's lock file: with ranks, the launcher stops rank 0 (SIGTERM) when another
# rank is refused first, and rank 0 may hold the lock then; the file stays, unlocked, and means
# nothing (src/run/run_lock.h). The likely cause of this check's one CI failure (2026-12-07: a
# resume refused on 2 ranks left the directory changed); not reproduced here in six tries.
tree_digest() { (cd "$1" && find . -type f ! -name .retrace-lock -print0 | sort -z | xargs -0 sha256sum | sha256sum); }
bad_resume() {
  local name=$1 run=$2 pattern=$3; shift 3
  local before; before=$(tree_digest "$run")
  expect "bad-$name" 3 "$pattern" -- "$RETRACE" resume "$run" --plain "$@"
  expect "bad-$name-untouched" 0 "^untouched" -- bash -c '[[ "$1" == "$2" ]] && echo untouched' _ \
    "$before" "$(tree_digest "$run")"
}
mkdir -p "$tmp/data"
cp /usr/share/datasets/fashion-mnist/* "$tmp/data/"
"$RETRACE" record "${base[@]}" --set data.batch_size=1024 --set data.dir="$tmp/data" --interrupt-at 20 \
  --out "$tmp/edited" >/dev/null 2>&1
printf '\x01' | dd of="$tmp/data/t10k-labels-idx1-ubyte.gz" bs=1 seek=20 conv=notrunc status=none
bad_resume changed-data "$tmp/edited" "cannot resume .*t10k-labels-idx1-ubyte.gz.*sha256.*--accept-changed-inputs"
cp "$ROOT/examples/torchscript/tiny_mlp.pt" "$tmp/model.pt"
"$RETRACE" record --plain --set model.kind=torchscript --set model.path="$tmp/model.pt" --set train.steps=24 \
  --set checkpoint.every_steps=8 --interrupt-at 10 --out "$tmp/ts" >/dev/null 2>&1
printf 'x' >>"$tmp/model.pt"
bad_resume changed-torchscript "$tmp/ts" "cannot resume .*model.pt.*--accept-changed-inputs"
"$RETRACE" record "${base[@]}" --set data.batch_size=1024 --interrupt-at 20 --out "$tmp/w1run" >/dev/null 2>&1
bad_resume changed-world-size "$tmp/w1run" "world_size mismatch: expected 2, found 1.*--world-size 1" --world-size 2

echo "edges: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
