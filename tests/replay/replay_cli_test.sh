#!/usr/bin/env bash
# Replay, diff, golden and bisect through the CLI, including the cases that must fail.
set -u
RETRACE=${1:?usage: replay_cli_test.sh path/to/retrace golden_dir}
GOLDEN=${2:?golden dir}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
common=(--set train.eval_each_epoch=false --set checkpoint.every_steps=25 --plain)

"$RETRACE" record --steps 70 --out "$tmp/a" "${common[@]}" >/dev/null || { echo "record failed"; exit 1; }
"$RETRACE" record --steps 70 --out "$tmp/b" "${common[@]}" --inject perturb-param@57:layers.0.weight >/dev/null
"$RETRACE" record --steps 70 --out "$tmp/c" "${common[@]}" >/dev/null
"$RETRACE" record --steps 70 --out "$tmp/f" "${common[@]}" --inject nan-loss@5,inf-grad@9,spike@40 --set amp.mode=bf16 --set amp.scaler=on >/dev/null

expect replay-verified 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet
expect replay-faults-and-rollback 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/f" --quiet
expect replay-from-checkpoint 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet --from-checkpoint 50 --steps 51:60
expect replay-missing-checkpoint 3 "no checkpoint for step 33" -- "$RETRACE" replay "$tmp/a" --quiet --from-checkpoint 33
# (A replay that diverges is tested in tests/replay/replay_test.cpp with a spliced trace.)

expect diff-identical 0 "verdict" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/c/trace.rtrace"
expect diff-differs 1 "57" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/b/trace.rtrace" --html "$tmp/r.html"
grep -q "<svg" "$tmp/r.html" && ! grep -qE "https?://" "$tmp/r.html" && { echo "ok   diff-html self-contained"; passes=$((passes+1)); } || { echo "FAIL diff-html"; fails=$((fails+1)); }

expect bisect-perturbed 1 "first divergence: step 57, rank 0, module layers.0 \(Linear\), phase state: weight" -- "$RETRACE" bisect "$tmp/a" "$tmp/b"
expect bisect-identical 0 "do not diverge" -- "$RETRACE" bisect "$tmp/a" "$tmp/c"

# Bad input.
head -c 60 "$tmp/a/trace.rtrace" > "$tmp/cut.rtrace"
expect truncated-trace 3 "no header frame|cut|truncated" -- "$RETRACE" replay "$tmp/cut.rtrace" --quiet
cp "$tmp/a/trace.rtrace" "$tmp/newer.rtrace"
printf '\x09' | dd of="$tmp/newer.rtrace" bs=1 seek=6 conv=notrunc status=none   # file format version
expect newer-format 3 "version" -- "$RETRACE" inspect "$tmp/newer.rtrace"
"$RETRACE" record --steps 5 --out "$tmp/other" --set model.hidden=[64] --plain >/dev/null
expect different-models 2 "different models" -- "$RETRACE" bisect "$tmp/a" "$tmp/other"
expect diff-different-models 1 "param" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/other/trace.rtrace"

# Golden: passes as recorded, and fails with the first divergent step when the run changes.
expect golden-check 0 "golden: 10 passed, 0 failed" -- "$RETRACE" golden check --dir "$GOLDEN" --scratch "$tmp/g"
# The portable version 2 goldens whose step is all retrace's kernels are bitwise on either
# LibTorch build (recorded on 1.13), at whatever thread count this machine gives.
for g in fashion-mlp-v2 char-gpt-v2 accum resumed char-gpt-tiny-fast; do
  expect "golden-$g-bitwise" 0 "golden $g +PASS  bitwise" -- "$RETRACE" golden check "$g" --dir "$GOLDEN" --scratch "$tmp/g"
done
# One flipped bit is below the rounding noise between kernels: only the bitwise check (equal
# numerics, the case unless this machine chose BLIS's configuration itself) can see it, on
# either build.
if [[ -z "${BLIS_ARCH_TYPE+set}" ]]; then
  expect golden-perturbed 1 "first divergent step 57, field param_digest" -- \
    "$RETRACE" golden check fashion-mlp-v2 --dir "$GOLDEN" --scratch "$tmp/g" --inject perturb-param@57:layers.0.weight
else
  echo "skip golden-perturbed: this machine sets BLIS_ARCH_TYPE=$BLIS_ARCH_TYPE, so the goldens may be checked across numerics"
fi
expect golden-lr 1 "first divergent step 1, field" -- \
  "$RETRACE" golden check fashion-mlp-100 --dir "$GOLDEN" --scratch "$tmp/g" --set optim.lr=0.002
expect golden-unknown 4 "no golden named nope" -- "$RETRACE" golden check nope --dir "$GOLDEN"

echo "replay_cli: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
