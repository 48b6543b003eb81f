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

echo "cli_errors: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
