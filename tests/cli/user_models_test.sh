#!/usr/bin/env bash
# Users' own models and data through the CLI: a TorchScript model records, resumes bitwise and
# replays VERIFIED; safetensors and llm.c token data sets train; bad input (a file that is not
# TorchScript, a model that does not fit the data or loss, mismatched sample counts, an
# unregistered kind) exits with the documented code and leaves no run directory.
#   user_models_test.sh path/to/retrace REPO_ROOT
set -u
RETRACE=${1:?usage: user_models_test.sh path/to/retrace REPO_ROOT}
ROOT=${2:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
TS="$ROOT/examples/torchscript/tiny_mlp.pt"
ts=(--set model.kind=torchscript --set model.path="$TS" --set train.steps=24 --set checkpoint.every_steps=8 --plain)

expect torchscript-resume 0 "RESUME VERIFIED" -- \
  "$RETRACE" record "${ts[@]}" --interrupt-at 12 --verify-resume --out "$tmp/tscheck"
expect torchscript-record 0 "recorded 24 steps" -- "$RETRACE" record "${ts[@]}" --out "$tmp/ts"
expect torchscript-replay 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/ts" --quiet
expect torchscript-header 0 "tiny_mlp.pt" -- "$RETRACE" inspect "$tmp/ts/trace.rtrace" --steps 1:1
expect torchscript-sha256 0 "\"sha256\": \"$(sha256sum "$TS" | cut -c1-64)\"" -- \
  "$RETRACE" inspect "$tmp/ts/trace.rtrace" --json --steps 1:1
expect torchscript-executor 0 "torchscript.optimize.*off" -- "$RETRACE" inspect "$tmp/ts/trace.rtrace" --json --steps 1:1

# Safetensors data: written here with the standard library only (the format: u64 header length,
# JSON header, data), 3 classes of 4 features.
python3 - "$tmp" <<'PY'
import json, struct, sys, random
def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in sorted(tensors.items(), key=lambda kv: (-(8 if kv[1][0] in ("I64",) else 4), kv[0])):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data); off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def split(n, rng, n_targets=None):
    xs, ys = [], []
    for i in range(n):
        c = i % 3
        xs += [c + rng.random() * 0.5 for _ in range(4)]
        ys.append(c)
    n_targets = n if n_targets is None else n_targets
    return {"inputs": ("F32", [n, 4], struct.pack("<%df" % (4 * n), *xs)),
            "targets": ("I64", [n_targets], struct.pack("<%dq" % n_targets, *ys[:n_targets]))}
import os
rng = random.Random(1)
for d, bad in (("tensors", False), ("mismatch", True)):
    os.makedirs(os.path.join(sys.argv[1], d))
    save(os.path.join(sys.argv[1], d, "train.safetensors"), split(240, rng, 200 if bad else None))
    save(os.path.join(sys.argv[1], d, "test.safetensors"), split(60, rng))
PY
tens=(--set data.kind=tensors --set data.dir="$tmp/tensors" --set data.batch_size=24 --set model.hidden=[16]
      --set train.steps=20 --plain)
expect tensors-record 0 "recorded 20 steps" -- "$RETRACE" record "${tens[@]}" --out "$tmp/tens"
expect tensors-header 0 "train.safetensors" -- "$RETRACE" inspect "$tmp/tens/trace.rtrace" --steps 1:1
expect tensors-replay 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/tens" --quiet

# Inputs are verified on resume and replay: a data file edited after the run was recorded is an
# integrity error naming it (exit 3), unless accepted, which the trace records.
cp -r "$tmp/tensors" "$tmp/tensors2"
tens2=(--set data.kind=tensors --set data.dir="$tmp/tensors2" --set data.batch_size=24 --set model.hidden=[16]
       --set train.steps=20 --set checkpoint.every_steps=5 --plain)
expect inputs-record 0 "interrupted after step 10" -- "$RETRACE" record "${tens2[@]}" --interrupt-at 10 --out "$tmp/edited"
cp -r "$tmp/edited" "$tmp/edited-accept"
cp "$tmp/tensors2/test.safetensors" "$tmp/test.keep"
# One value of the test inputs (the file's last byte) changes; the file stays well-formed.
python3 -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[-1] ^= 1; open(p, 'wb').write(bytes(b))" \
  "$tmp/tensors2/test.safetensors"
expect inputs-changed-resume 3 "input file .*tensors2/test.safetensors changed since the run was recorded.*--accept-changed-inputs" -- \
  "$RETRACE" resume "$tmp/edited" --plain
expect inputs-changed-replay 3 "cannot replay .*tensors2/test.safetensors changed" -- "$RETRACE" replay "$tmp/edited" --quiet
expect inputs-accepted-resume 0 "warning: resumed with changed inputs" -- \
  "$RETRACE" resume "$tmp/edited-accept" --accept-changed-inputs --plain
expect inputs-accepted-event 0 "resumed with changed inputs .*test.safetensors" -- \
  "$RETRACE" inspect "$tmp/edited-accept/trace.rtrace" --json --steps 1:1
# Accepted, the replay runs, and the evaluation on the edited test file shows the change (exit 1).
expect inputs-accepted-replay 1 "note: .*test.safetensors is not the file the run was recorded with" -- \
  "$RETRACE" replay "$tmp/edited" --accept-changed-inputs --quiet
expect inputs-accepted-replay-evals 1 "REPLAY DIVERGED outside the steps: evaluation after step 10" -- \
  "$RETRACE" replay "$tmp/edited" --accept-changed-inputs --quiet --force
cp "$tmp/test.keep" "$tmp/tensors2/test.safetensors"
expect inputs-restored 0 "resumed from" -- "$RETRACE" resume "$tmp/edited" --plain

# llm.c token files from a text, and the GPT on them.
python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/tokens" > /dev/null
expect tokens-record 0 "recorded 3 steps" -- "$RETRACE" record --config "$ROOT/configs/char-gpt.toml" \
  --set data.kind=tokens --set data.dir="$tmp/tokens" --set data.context=32 --set model.n_layers=1 \
  --set model.d_model=32 --set data.batch_size=4 --steps 3 --plain --out "$tmp/tok"

# Bad input: the documented code, a message naming the file or key, no run directory.
printf 'not a zip archive\n' > "$tmp/fake.pt"
expect not-torchscript 3 "fake.pt is not a TorchScript file" -- \
  "$RETRACE" record --set model.kind=torchscript --set model.path="$tmp/fake.pt" --steps 2 --out "$tmp/bad1"
expect torchscript-missing 4 "nosuch.pt" -- \
  "$RETRACE" record --set model.kind=torchscript --set model.path="$tmp/nosuch.pt" --steps 2 --out "$tmp/bad2"
expect torchscript-no-path 2 "model.path" -- \
  "$RETRACE" record --set model.kind=torchscript --steps 2 --out "$tmp/bad3"
expect model-does-not-fit 2 "does not fit.*inputs \[2, 4\]" -- \
  "$RETRACE" record --set model.kind=torchscript --set model.path="$TS" --set data.kind=tensors \
  --set data.dir="$tmp/tensors" --steps 2 --out "$tmp/bad4"
expect mismatched-samples 2 "mismatch/train.safetensors.*200|200.*mismatch/train.safetensors" -- \
  "$RETRACE" record --set data.kind=tensors --set data.dir="$tmp/mismatch" --steps 2 --out "$tmp/bad5"
expect unregistered-model 2 "bad value for model.kind: \"resnet\" is not registered; registered: gpt, mlp, torchscript" -- \
  "$RETRACE" record --set model.kind=resnet --steps 2 --out "$tmp/bad6"
expect unregistered-data 2 "bad value for data.kind: \"imagenet\" is not registered" -- \
  "$RETRACE" record --set data.kind=imagenet --steps 2 --out "$tmp/bad7"
expect unregistered-loss 2 "bad value for train.loss: \"mse\" is not registered" -- \
  "$RETRACE" record --set train.loss=mse --steps 2 --out "$tmp/bad8"
for d in bad1 bad2 bad3 bad4 bad5 bad6 bad7 bad8; do
  [[ -e "$tmp/$d" ]] && { echo "FAIL $d left a run directory behind"; fails=$((fails+1)); }
done

# export: every step as a JSON line, CSV with a header row.
expect export-jsonl 0 "" -- "$RETRACE" export "$tmp/ts" --jsonl --out "$tmp/ts/metrics.jsonl"
n=$(grep -c '"type":"step"' "$tmp/ts/metrics.jsonl")
if [[ $n -eq 24 ]] && head -1 "$tmp/ts/metrics.jsonl" | grep -q '"type":"header"' \
   && python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$tmp/ts/metrics.jsonl"; then
  echo "ok   export-jsonl-content"; passes=$((passes+1))
else
  echo "FAIL export-jsonl-content: $n step rows"; fails=$((fails+1))
fi
expect export-csv 0 "^step,epoch" -- "$RETRACE" export "$tmp/ts" --csv --steps 1:3
expect export-needs-format 2 "exactly one of --jsonl, --csv and --tensorboard DIR" -- "$RETRACE" export "$tmp/ts"

echo "user models: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
