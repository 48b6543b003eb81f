#!/usr/bin/env bash
# Token shards end to end: a GPT on sharded llm.c token files (both formats), bounded evaluation
# with validation loss and perplexity everywhere a run is read, nothing lost when a run dies in
# its evaluation, shards changed between record and resume, and the bad input of the [eval] keys
# and of batches that cannot fit in memory.
set -u
RETRACE=${1:?usage: tokens_test.sh path/to/retrace ROOT}
ROOT=${2:?usage: tokens_test.sh path/to/retrace ROOT}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
ok() { echo "ok   $1"; passes=$((passes+1)); }
bad() { echo "FAIL $1"; fails=$((fails+1)); }

python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/tok" --shard-tokens 9000 \
  --name gpl > /dev/null
gpt=(--set model.kind=gpt --set data.kind=tokens --set data.dir="$tmp/tok" --set data.context=32
     --set model.d_model=32 --set model.n_layers=1 --set model.n_heads=2 --set data.batch_size=8
     --set eval.every_steps=4 --set eval.max_batches=3 --set checkpoint.every_steps=4 --plain)

# A run on four training shards: LM evaluations every 4 steps over the same 3 batches.
expect tokens-record 0 "EVAL +step +4 .*val loss [0-9.]+ +perplexity [0-9.]+ +\(768 tokens\)" -- \
  "$RETRACE" record "${gpt[@]}" --steps 12 --out "$tmp/a"
expect tokens-summary 0 "val loss [0-9.]+, perplexity [0-9.]+" -- "$RETRACE" record "${gpt[@]}" --steps 4 --out "$tmp/s"
out=$("$RETRACE" record "${gpt[@]}" --steps 4 --out "$tmp/s" --force 2>&1)
grep -q "accuracy" <<<"$out" && bad "tokens-no-accuracy: $out" || ok tokens-no-accuracy
expect inspect-perplexity 0 "step 12 epoch 0: loss [0-9.]+, perplexity [0-9.]+ over 768 tokens \(24 samples, 3 batches\)" -- \
  "$RETRACE" inspect "$tmp/a/trace.rtrace"
expect inspect-json-perplexity 0 '"perplexity": [0-9]' -- "$RETRACE" inspect "$tmp/a/trace.rtrace" --json
expect export-jsonl-perplexity 0 '"type":"eval".*|"perplexity":[0-9]' -- "$RETRACE" export "$tmp/a" --jsonl
expect header-shards 0 "gpl_train_000003.bin" -- "$RETRACE" inspect "$tmp/a/trace.rtrace" --json
expect header-order 0 "order = .feistel." -- bash -c "'$RETRACE' inspect '$tmp/a/trace.rtrace' --json | grep -o 'order = [^\\\\]*'"
expect replay-tokens 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet

# Killed during its evaluation: the step's checkpoint is already written; resume redoes the
# evaluation and the whole trace equals the uninterrupted run's.
expect crash-in-eval 137 "" -- "$RETRACE" record "${gpt[@]}" --steps 12 --out "$tmp/k" --inject crash-in-eval@8
[[ -f "$tmp/k/checkpoints/step-00000008/manifest.json" ]] && ok crash-in-eval-kept-step-8 || bad crash-in-eval-kept-step-8
expect crash-in-eval-resume 0 "resumed from .*step-00000008" -- "$RETRACE" resume "$tmp/k" --plain
k_evals=$("$RETRACE" inspect "$tmp/k/trace.rtrace" --json | python3 -c "import json,sys; print([e['step'] for e in json.load(sys.stdin)['evals']])")
[[ "$k_evals" == "[4, 8, 12]" ]] && ok crash-in-eval-evals-once || bad "crash-in-eval-evals-once: $k_evals"
expect crash-in-eval-same-trace-as-uninterrupted 0 "^same" -- python3 "$ROOT/tests/run/same_trace.py" "$RETRACE" \
  "$tmp/a/trace.rtrace" "$tmp/k/trace.rtrace"
expect crash-in-eval-replay 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/k" --quiet
expect interrupt-resume-verified 0 "RESUME VERIFIED" -- \
  "$RETRACE" record "${gpt[@]}" --total-steps 12 --interrupt-at 6 --verify-resume --out "$tmp/v"

# Shards changed between record and resume: each is an integrity error naming the shard (exit 3),
# and the run directory is left as it was.
"$RETRACE" record "${gpt[@]}" --total-steps 12 --interrupt-at 4 --out "$tmp/r" > /dev/null
tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum); }
before=$(tree_digest "$tmp/r")
cp -r "$tmp/tok" "$tmp/tok.keep"
printf 'A' | dd of="$tmp/tok/gpl_train_000001.bin" bs=1 seek=2000 conv=notrunc status=none
expect shard-edited 3 "gpl_train_000001.bin changed since the run was recorded" -- "$RETRACE" resume "$tmp/r" --plain
cp "$tmp/tok.keep/gpl_train_000001.bin" "$tmp/tok/"
printf 'AB' >> "$tmp/tok/gpl_train_000002.bin"
expect shard-appended 3 "gpl_train_000002.bin changed since the run was recorded" -- "$RETRACE" resume "$tmp/r" --plain
cp "$tmp/tok.keep/gpl_train_000002.bin" "$tmp/tok/"
cp "$tmp/tok/gpl_train_000000.bin" "$tmp/tok/gpl_train_000009.bin"
expect shard-added 3 "gpl_train_000009.bin was added to the data set since the run was recorded" -- \
  "$RETRACE" resume "$tmp/r" --plain
rm "$tmp/tok/gpl_train_000009.bin"
mv "$tmp/tok/gpl_train_000003.bin" "$tmp/gone.bin"
expect shard-removed 3 "gpl_train_000003.bin is missing" -- "$RETRACE" resume "$tmp/r" --plain
expect shard-removed-replay 3 "cannot replay .*gpl_train_000003.bin is missing" -- "$RETRACE" replay "$tmp/r" --quiet
mv "$tmp/gone.bin" "$tmp/tok/gpl_train_000003.bin"
[[ "$(tree_digest "$tmp/r")" == "$before" ]] && ok shard-changes-left-run-untouched || bad shard-changes-left-run-untouched
expect shards-restored 0 "resumed from" -- "$RETRACE" resume "$tmp/r" --plain

# Both formats; a mix is refused.
python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/l3" --format llama3 > /dev/null
expect llama3-record 0 "recorded 3 steps" -- "$RETRACE" record "${gpt[@]}" --set data.dir="$tmp/l3" --steps 3 --out "$tmp/l"
cp "$tmp/tok/gpl_train_000000.bin" "$tmp/l3/more_train.bin"
expect mixed-formats 2 "token shards of two formats" -- "$RETRACE" record "${gpt[@]}" --set data.dir="$tmp/l3" --steps 3 --out "$tmp/m"

# The [eval] keys and memory.
expect eval-max-negative 2 "eval.max_batches.*-1 is outside" -- "$RETRACE" record "${gpt[@]}" --set eval.max_batches=-1 --out "$tmp/e1"
expect eval-batch-absurd 2 "eval.batch_size.*is outside" -- "$RETRACE" record "${gpt[@]}" --set eval.batch_size=99999999 --out "$tmp/e2"
expect eval-old-and-new-key 2 "sets both data.eval_batch_size and eval.batch_size" -- bash -c \
  "printf '[data]\neval_batch_size = 8\n[eval]\nbatch_size = 8\n' > '$tmp/both.toml' && '$RETRACE' record --config '$tmp/both.toml' --out '$tmp/e3'"
big=(--set data.vocab_size=50257 --set data.context=1024 --set model.d_model=64 --set model.n_heads=2)
python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/t1k" --val-fraction 0.5 > /dev/null
expect step-too-big 2 "a training step of this GPT needs about [0-9.]+ GiB.*Lower data.batch_size" -- \
  "$RETRACE" record "${gpt[@]}" "${big[@]}" --set data.dir="$tmp/t1k" --set data.batch_size=8192 --steps 1 --out "$tmp/b1"
expect eval-too-big 2 "an evaluation batch of eval.batch_size 1000000 .*Lower eval.batch_size" -- \
  "$RETRACE" record "${gpt[@]}" "${big[@]}" --set data.dir="$tmp/t1k" --set data.batch_size=1 --set eval.batch_size=1000000 \
  --steps 1 --out "$tmp/b2"
[[ ! -e "$tmp/b1" && ! -e "$tmp/b2" ]] && ok too-big-left-no-run-directory || bad too-big-left-no-run-directory
expect memory-gpt2 0 "parameters 124439808" -- "$RETRACE" memory --config "$ROOT/configs/gpt2-124m.toml" --rounds 0
# The rollback anchor and the staging buffer are whole copies of the weights and AdamW state
# (124439808 x 12 bytes each), counted in the plan; without the spike guard and the background
# save there are none.
expect memory-state-copies 0 "copies of the state kept beside it: 2, 2986.6 MB" -- \
  "$RETRACE" memory --config "$ROOT/configs/gpt2-124m.toml" --rounds 0
expect memory-no-copies 0 "copies of the state kept beside it: 0, 0.0 MB" -- \
  "$RETRACE" memory --config "$ROOT/configs/gpt2-124m.toml" --rounds 0 --set checkpoint.async=false \
  --set guards.spike_factor=0
expect memory-zero-no-staging 0 "copies of the state kept beside it: 1, 1493.3 MB" -- \
  "$RETRACE" memory --config "$ROOT/configs/gpt2-124m.toml" --rounds 0 --set runtime.zero_stage=1

echo "tokens: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
