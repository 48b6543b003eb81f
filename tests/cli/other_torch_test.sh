#!/usr/bin/env bash
# A trace recorded by a retrace built against one LibTorch, resumed and replayed by one built
# against another: refused with exit 4 and a message naming both versions, unless
# --accept-other-torch, with which the resume continues and says so in the trace. Under portable
# numerics version 2 (kernels retrace owns) neither refuses, and the bits are the same.
# Usage: other_torch_test.sh RETRACE OTHER_RETRACE. Exit 77 (skipped) without the other build.
set -u
RETRACE=${1:?usage: other_torch_test.sh path/to/retrace path/to/other/retrace}
OTHER=${2:?other retrace}
if [[ ! -x "$OTHER" ]] || [[ "$("$OTHER" --version)" == "$("$RETRACE" --version)" ]]; then
  echo "SKIPPED: no retrace built against another LibTorch at $OTHER"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
echo "this: $("$RETRACE" --version); other: $("$OTHER" --version)"
theirs=$("$OTHER" --version | sed -n 's/.*LibTorch \([0-9.]*\).*/\1/p')
ours=$("$RETRACE" --version | sed -n 's/.*LibTorch \([0-9.]*\).*/\1/p')
# Portable version 1 (LibTorch's kernels and BLAS: the build's own bits), and every other step
# that keeps a LibTorch kernel.
"$OTHER" record --total-steps 12 --interrupt-at 6 --out "$tmp/r" --plain --set train.eval_each_epoch=false \
  --set runtime.numerics_version=1 > /dev/null
before=$(stat -c %s "$tmp/r/trace.rtrace")
expect resume-other-torch 4 "cannot resume .*: it was recorded with LibTorch $theirs and this retrace is built against LibTorch $ours.*--accept-other-torch" -- \
  "$RETRACE" resume "$tmp/r" --plain
[[ $(stat -c %s "$tmp/r/trace.rtrace") == "$before" ]] || { echo "FAIL the refused resume changed the trace"; fails=$((fails+1)); }
expect replay-other-torch 4 "cannot replay .*: it was recorded with LibTorch $theirs" -- "$RETRACE" replay "$tmp/r" --quiet
expect resume-other-torch-accepted 0 "resumed under other numerics than the trace header records \(.*libtorch_version $theirs -> $ours" -- \
  "$RETRACE" resume "$tmp/r" --plain --accept-other-torch

# Portable numerics version 2 (the default; every kernel of the step retrace's own): no refusal,
# and the bits are the same on both builds. Recorded by the other build, interrupted, resumed by this one without
# --accept-other-torch: the whole trace equals an uninterrupted run's by this build; replayed by this
# build: REPLAY VERIFIED. The MLP and the char GPT (2 layers).
v2=(--set runtime.numerics_version=2 --set train.eval_each_epoch=false --set checkpoint.every_steps=6 --plain)
gpt=(--config "$(dirname "$0")/../../configs/char-gpt.toml" --set model.n_layers=2 --set data.batch_size=8)
for model in mlp gpt; do
  args=("${v2[@]}"); [[ $model == gpt ]] && args+=("${gpt[@]}")
  "$OTHER" record --total-steps 12 --interrupt-at 6 --out "$tmp/v2-$model" "${args[@]}" > /dev/null
  "$RETRACE" record --steps 12 --out "$tmp/v2-$model-here" "${args[@]}" > /dev/null
  expect "v2-$model-resume-other-build" 0 "resumed from" -- "$RETRACE" resume "$tmp/v2-$model" --plain
  expect "v2-$model-same-trace-as-this-build" 0 "^same" -- python3 "$(dirname "$0")/../run/same_trace.py" "$RETRACE" \
    "$tmp/v2-$model-here/trace.rtrace" "$tmp/v2-$model/trace.rtrace"
  expect "v2-$model-replay-other-build" 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/v2-$model" --quiet
done
echo "other_torch: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
