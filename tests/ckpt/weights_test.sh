#!/usr/bin/env bash
# `retrace weights`: a checkpoint's model as one safetensors file that Python's own `safetensors`
# library reads into the model's PyTorch twin (tools/bench/vs_pytorch.py's Gpt, load_state_dict
# strict), bitwise equal to the checkpoint's tensors; and its bad input, each with its exit code.
# Usage: weights_test.sh RETRACE SOURCE_DIR. Exit 77 (skipped) without .venv-torch's torch and
# safetensors (tools/setup.sh --torch2).
set -u
RETRACE=${1:?usage: weights_test.sh path/to/retrace SOURCE_DIR}
ROOT=${2:?usage: weights_test.sh path/to/retrace SOURCE_DIR}
py="$ROOT/.venv-torch/bin/python"
if ! "$py" -c "import torch, safetensors" 2> /dev/null; then
  echo "SKIPPED: no PyPI torch and safetensors in $ROOT/.venv-torch (tools/setup.sh --torch2 makes it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"

python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/tok" --shard-tokens 9000 \
  --name gpl > /dev/null
gpt=(--set model.kind=gpt --set data.kind=tokens --set data.dir="$tmp/tok" --set data.context=32
     --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set data.batch_size=8
     --set eval.max_batches=2 --set checkpoint.every_steps=3 --plain)
"$RETRACE" record "${gpt[@]}" --steps 6 --out "$tmp/run" > "$tmp/record.log" 2>&1 || { cat "$tmp/record.log"; exit 1; }

# The newest checkpoint of a run, and a named step directory.
# (Each command's output on one line, so that one pattern reads all of it.)
flat() { "$@" 2>&1 | tr '\n' ' '; return "${PIPESTATUS[0]}"; }
expect weights-run 0 "wrote .*: 30 tensors, .*from checkpoint .*step-00000006 \(step 6, world size 1, sha256 verified\)" -- \
  flat "$RETRACE" weights "$tmp/run" --out "$tmp/model.safetensors"
expect weights-step-dir 0 "step 3" -- "$RETRACE" weights "$tmp/run/checkpoints/step-00000003" --out "$tmp/step3.safetensors"
expect weights-twin 0 "^twin ok" -- "$py" "$(dirname "$0")/weights_twin.py" "$ROOT" "$tmp/model.safetensors" \
  "$tmp/run/checkpoints/step-00000006/shard-rank00000.safetensors" "$tmp/step3.safetensors"

# Bad input: an existing --out (exit 2, file untouched), no checkpoint (4), a damaged shard (3,
# naming it), a newest checkpoint damaged (skipped, named, the older one taken).
before=$(sha256sum < "$tmp/model.safetensors")
expect weights-exists 2 "exists; pass --force" -- "$RETRACE" weights "$tmp/run" --out "$tmp/model.safetensors"
[[ "$(sha256sum < "$tmp/model.safetensors")" == "$before" ]] && ok=1 || ok=0
((ok)) && { echo "ok   weights-exists-untouched"; passes=$((passes+1)); } || { echo "FAIL weights-exists-untouched"; fails=$((fails+1)); }
expect weights-force 0 "wrote" -- "$RETRACE" weights "$tmp/run" --out "$tmp/model.safetensors" --force
expect weights-missing 4 "is not a directory" -- "$RETRACE" weights "$tmp/nowhere" --out "$tmp/x.safetensors"
mkdir "$tmp/empty"
expect weights-no-checkpoint 4 "no checkpoint in" -- "$RETRACE" weights "$tmp/empty" --out "$tmp/x.safetensors"
shard6="$tmp/run/checkpoints/step-00000006/shard-rank00000.safetensors"
printf 'X' | dd of="$shard6" bs=1 seek=300 conv=notrunc status=none
expect weights-damaged-step 3 "sha256 mismatch on rank 0" -- \
  "$RETRACE" weights "$tmp/run/checkpoints/step-00000006" --out "$tmp/x.safetensors"
[[ -e "$tmp/x.safetensors" ]] && { echo "FAIL weights-damaged-wrote-nothing"; fails=$((fails+1)); } || { echo "ok   weights-damaged-wrote-nothing"; passes=$((passes+1)); }
expect weights-damaged-newest-skipped 0 "skipped .*step-00000006: sha256 mismatch on rank 0.*wrote .*\(step 3," -- \
  flat "$RETRACE" weights "$tmp/run" --out "$tmp/y.safetensors"
cmp -s "$tmp/y.safetensors" "$tmp/step3.safetensors" && { echo "ok   weights-older-same-bytes"; passes=$((passes+1)); } || { echo "FAIL weights-older-same-bytes"; fails=$((fails+1)); }

# Two ranks write one copy of the model, split between their shards (schema ckpt.v2): the file
# gathered from the pieces equals, tensor for tensor, the one of a 1-rank run of the same global
# batch in invariant mode.
inv=(--set runtime.invariance=batch --set runtime.invariance_chunk=4 --steps 3)
"$RETRACE" record "${gpt[@]}" "${inv[@]}" --set data.batch_size=8 --out "$tmp/i1" > /dev/null 2>&1
"$RETRACE" record "${gpt[@]}" "${inv[@]}" --set data.batch_size=4 --world-size 2 --out "$tmp/i2" > /dev/null 2>&1
expect weights-two-ranks 0 "world size 2, sha256 verified" -- \
  flat "$RETRACE" weights "$tmp/i2" --out "$tmp/i2.safetensors"
"$RETRACE" weights "$tmp/i1" --out "$tmp/i1.safetensors" > /dev/null
expect weights-two-ranks-equal-one 0 "^equal 30" -- "$py" -c "
import sys, torch
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert set(a) == set(b), sorted(set(a) ^ set(b))
bad = [k for k in a if not torch.equal(a[k], b[k])]
print('differ', bad) if bad else print('equal', len(a))" "$tmp/i1.safetensors" "$tmp/i2.safetensors"

echo "$passes passed, $fails failed"
((fails == 0))
