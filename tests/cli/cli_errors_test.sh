#!/usr/bin/env bash
# Bad input through the CLI: each case must exit with the documented code, print a message that
# names the problem, and leave no half-written run directory.
set -u
RETRACE=${1:?usage: cli_errors_test.sh path/to/retrace}
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"

expect missing-dataset 4 "data set file missing: /nonexistent/.*train-images" -- \
  "$RETRACE" record --steps 2 --out "$tmp/r1" --set data.dir=/nonexistent
[[ -e "$tmp/r1" ]] && { echo "FAIL missing-dataset left $tmp/r1 behind"; fails=$((fails+1)); }

expect unknown-key 2 "unknown config key 'optim.learning_rate'.*optim.lr" -- \
  "$RETRACE" record --steps 2 --out "$tmp/r2" --set optim.learning_rate=0.1
expect bad-value 2 "bad value for optim.name.*\"adamw\", \"sgd\"" -- \
  "$RETRACE" record --steps 2 --out "$tmp/r3" --set optim.name=adam
expect bad-type 2 "bad value for data.batch_size.*expected integer" -- \
  "$RETRACE" record --steps 2 --out "$tmp/r3" --set data.batch_size=big
expect missing-config 2 "cannot read config file" -- \
  "$RETRACE" record --config "$tmp/none.toml" --out "$tmp/r4"
[[ -e "$tmp/r2" || -e "$tmp/r3" || -e "$tmp/r4" ]] && { echo "FAIL config errors left a run directory"; fails=$((fails+1)); }

# Regressions (exit 70 before issue 38): the data set's inputs do not suit the model; a run in a
# child process (the accumulation grid) fails for a reason of its own, which keeps its kind.
expect gpt-on-images 2 "model.kind = \"gpt\" reads int64 token ids .*2-d Float inputs" -- \
  "$RETRACE" record --steps 1 --out "$tmp/g1" --set model.kind=gpt --set data.kind=fashion-mnist
expect grid-child-error 4 "accumulation grid's run with train.accum_steps = 1: data set file missing" -- \
  "$RETRACE" record --steps 2 --out "$tmp/grid" --accum-grid 1,2 --set data.dir=/nonexistent

mkdir -p "$tmp/ro"; chmod 555 "$tmp/ro"
if [[ $(id -u) -eq 0 ]]; then
  # root ignores permission bits: use a path below a regular file instead.
  touch "$tmp/file"
  expect unwritable-out 4 "cannot create" -- "$RETRACE" record --steps 1 --out "$tmp/file/run"
else
  expect unwritable-out 4 "cannot create|not writable" -- "$RETRACE" record --steps 1 --out "$tmp/ro/run"
fi

expect first-run 0 "recorded 2 steps" -- "$RETRACE" record --steps 2 --out "$tmp/ok"
before=$(sha256sum "$tmp/ok/trace.rtrace")
expect existing-run 2 "already exists; pass --force" -- "$RETRACE" record --steps 2 --out "$tmp/ok"
after=$(sha256sum "$tmp/ok/trace.rtrace")
[[ "$before" == "$after" ]] || { echo "FAIL existing-run changed the old trace"; fails=$((fails+1)); }
expect force 0 "recorded 3 steps" -- "$RETRACE" record --steps 3 --out "$tmp/ok" --force

expect inspect 0 "STEP" -- "$RETRACE" inspect "$tmp/ok/trace.rtrace"
expect inspect-json 0 "\"steps\"" -- "$RETRACE" inspect "$tmp/ok/trace.rtrace" --json
expect inspect-run-dir 0 "STEP" -- "$RETRACE" inspect "$tmp/ok"
expect inspect-not-a-run-dir 4 "cannot open .*trace.rtrace" -- "$RETRACE" inspect "$tmp"
expect inspect-csv 0 "^step," -- "$RETRACE" inspect "$tmp/ok/trace.rtrace" --csv
# Step numbers are read strictly: "-1" is not the last step of 2^64, "2x" not step 2.
expect inspect-negative-step 2 "--steps expects A:B, A:, :B or N" -- "$RETRACE" inspect "$tmp/ok/trace.rtrace" --steps=-1
expect inspect-step-suffix 2 "--steps expects A:B, A:, :B or N" -- "$RETRACE" inspect "$tmp/ok/trace.rtrace" --steps 2x:3
head -c 100 "$tmp/ok/trace.rtrace" > "$tmp/cut.rtrace"
expect inspect-cut 3 "trace has no header frame|truncated|cut" -- "$RETRACE" inspect "$tmp/cut.rtrace"
expect inspect-missing 4 "cannot open|No such file" -- "$RETRACE" inspect "$tmp/none.rtrace"
expect bad-usage 2 "" -- "$RETRACE" record --no-such-flag
expect help 0 "Example" -- "$RETRACE" record --help

# The live TensorBoard view's bad input: refused before any run directory is made.
mkdir -p "$tmp/tbfull" && echo mine > "$tmp/tbfull/notes.txt" && echo x > "$tmp/tbfile"
expect tb-not-empty 2 "--tensorboard .*tbfull is not empty.*--force" -- \
  "$RETRACE" record --steps 2 --out "$tmp/tb1" --tensorboard "$tmp/tbfull"
expect tb-a-file 2 "--tensorboard .*tbfile exists and is not a directory" -- \
  "$RETRACE" record --steps 2 --out "$tmp/tb1" --tensorboard "$tmp/tbfile"
expect tb-with-grid 2 "--tensorboard views one run; --verify-resume and --accum-grid" -- \
  "$RETRACE" record --steps 2 --out "$tmp/tb1" --tensorboard "$tmp/tbnew" --accum-grid 1,2
[[ -e "$tmp/tb1" || -e "$tmp/tbnew" ]] && { echo "FAIL a refused --tensorboard left a directory"; fails=$((fails+1)); }
[[ $(cat "$tmp/tbfull/notes.txt") == mine ]] || { echo "FAIL a refused --tensorboard touched the directory"; fails=$((fails+1)); }
expect export-force-alone 2 "--force belongs with --tensorboard" -- "$RETRACE" export "$tmp/none" --jsonl --force

# Batch invariance: layouts that do not split into whole chunks, named by their keys.
expect invariance-chunk 2 "runtime.invariance_chunk = 24.*data.batch_size = 128.*not a multiple" -- \
  "$RETRACE" record --steps 2 --out "$tmp/inv1" --set runtime.invariance=batch --set runtime.invariance_chunk=24
expect invariance-keep 2 "runtime.invariance = \"batch\" needs data.last_batch = \"drop\"" -- \
  "$RETRACE" record --steps 2 --out "$tmp/inv1" --set runtime.invariance=batch --set data.last_batch=keep
expect invariance-grid 2 "--accum-grid: 32 micro-batches of 4 samples do not split into whole chunks of runtime.invariance_chunk = 8" -- \
  "$RETRACE" record --steps 2 --out "$tmp/inv1" --set runtime.invariance=batch --accum-grid 1,32
[[ -e "$tmp/inv1" ]] && { echo "FAIL a refused invariance config left a run directory"; fails=$((fails+1)); }
expect reshard-record 0 "recorded 4 steps" -- "$RETRACE" record --steps 4 --out "$tmp/rs" --plain \
  --set runtime.invariance=batch --set data.batch_size=24 --set train.eval_each_epoch=false
expect reshard-no-flag 3 "world_size mismatch: expected 2, found 1.*--world-size 2 --reshard" -- \
  "$RETRACE" resume "$tmp/rs" --world-size 2 --plain
expect reshard-bad-world 2 "global batch of 24 samples.*does not split into 5 ranks.*divides 24" -- \
  "$RETRACE" resume "$tmp/rs" --world-size 5 --reshard --plain
expect reshard-bad-chunk 2 "micro-batches of data.batch_size = 12 samples do not split into whole chunks of runtime.invariance_chunk = 8" -- \
  "$RETRACE" resume "$tmp/rs" --world-size 2 --reshard --plain
grep -q "batch_size = 24" "$tmp/rs/config.toml" || { echo "FAIL a refused reshard changed config.toml"; fails=$((fails+1)); }
expect reshard-none-warns 0 "warning: runtime.invariance is \"none\": the resharded run continues within float rounding" -- \
  bash -c "'$RETRACE' record --steps 4 --out '$tmp/rn' --plain --set train.eval_each_epoch=false --set data.batch_size=24 --set checkpoint.every_steps=2 --interrupt-at 2 >/dev/null && '$RETRACE' resume '$tmp/rn' --world-size 2 --reshard --plain"

# ---- CUDA, NCCL and ranks' network: what this binary cannot do, or a launch it cannot make -------
if "$RETRACE" --version | grep -q "(CPU only)"; then
  expect cuda-without-cuda-build 2 'runtime.device = "cuda" but this retrace is built against LibTorch .* without CUDA.*--set runtime.device=cpu' -- \
    "$RETRACE" record --steps 2 --out "$tmp/cu" --set runtime.device=cuda
  # Ranks on CUDA (NCCL) in a CPU build: the same answer, before any rank waits for another.
  expect nccl-without-cuda-build 2 'without CUDA' -- \
    env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$RETRACE" record --steps 2 --out "$tmp/cu" --set runtime.device=cuda
elif ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  expect cuda-without-device 4 'runtime.device = "cuda" but no CUDA device is visible to this process \(LibTorch .* with CUDA' -- \
    "$RETRACE" record --steps 2 --out "$tmp/cu" --set runtime.device=cuda
fi
[[ -e "$tmp/cu" ]] && { echo "FAIL a refused CUDA run left $tmp/cu behind"; fails=$((fails+1)); }
expect gloo-unknown-interface 2 'GLOO_SOCKET_IFNAME=nosuch0 names interface "nosuch0", which this host does not have.*it has: lo 127.0.0.1' -- \
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 GLOO_SOCKET_IFNAME=nosuch0 "$RETRACE" record --steps 2 --out "$tmp/g1"
expect master-addr-unresolvable 2 'MASTER_ADDR=no-such-host.invalid does not resolve' -- \
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=1 "$RETRACE" record --steps 2 --out "$tmp/g1"

echo "cli_errors: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
