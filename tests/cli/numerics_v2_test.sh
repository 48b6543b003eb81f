#!/usr/bin/env bash
# Portable numerics version 2 through the CLI (issue 51): the default; the same trace at any
# runtime.threads for the MLP, the char GPT and gpt2-124m's config (narrowed), the thread count
# recorded as information, a run resumed and replayed on another core count verified bitwise,
# version 1 unchanged, and each bad input with its exit code.
#
#   numerics_v2_test.sh path/to/retrace repository_root
set -u
RETRACE=${1:?usage: numerics_v2_test.sh path/to/retrace repository_root}
ROOT=${2:?repository root}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
ok() { echo "ok   $1"; passes=$((passes+1)); }
bad() { echo "FAIL $1"; fails=$((fails+1)); }
base=(--set train.eval_each_epoch=false --set checkpoint.every_steps=0 --set checkpoint.at_end=false --plain)
v2=(--set runtime.numerics_version=2)
gpt=(--config "$ROOT/configs/char-gpt.toml" --set model.n_layers=2 --set data.batch_size=8)
field() { "$RETRACE" inspect "$1/trace.rtrace" | grep -E "^  $2=" | head -1 | cut -d= -f2-; }
bitwise() {  # name, run a, run b: every common step equal (exit 1: the configs' runtime.threads differ)
  expect "$1" 1 "common steps equal \(bitwise\)" -- "$RETRACE" diff "$2" "$3"
  expect "$1-whole-trace" 0 "^same" -- python3 "$ROOT/tests/run/same_trace.py" "$RETRACE" "$2/trace.rtrace" \
    "$3/trace.rtrace"
}

# ---- bad input: nothing is written ------------------------------------------------------------
expect v2-native 2 "numerics_version = 2 is a version of the portable profile" -- \
  "$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --set runtime.numerics=native --out "$tmp/bad1"
expect v2-blas-threads 2 "runtime.blas_threads = 2 is set; remove it and set runtime.threads" -- \
  "$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --set runtime.blas_threads=2 --out "$tmp/bad2"
expect v2-negative-threads 2 "runtime.threads" -- \
  "$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --set runtime.threads=-1 --out "$tmp/bad3"
expect v2-version-3 2 "runtime.numerics_version" -- \
  "$RETRACE" record --steps 3 "${base[@]}" --set runtime.numerics_version=3 --out "$tmp/bad4"
expect v2-blis-missing 4 "BLIS 0.9 \(/nonexistent/libblis.so.4, Debian package libblis4-pthread.*cannot load it.*numerics_version=1" -- \
  env RETRACE_BLIS_LIBRARY=/nonexistent/libblis.so.4 "$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --out "$tmp/bad5"
not_blis=$(ldconfig -p | grep -oE '/[^ ]*/libz\.so\.1$' | head -1)
expect v2-not-blis 4 "found a library without BLIS's functions" -- \
  env RETRACE_BLIS_LIBRARY="$not_blis" "$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --out "$tmp/bad6"
for d in bad1 bad2 bad3 bad4 bad5 bad6; do [[ -e "$tmp/$d" ]] && bad "refused run $d left its directory"; done

# ---- version 2 is the default under portable; native resolves to 1 ------------------------------
"$RETRACE" record --steps 3 "${base[@]}" --out "$tmp/default" > /dev/null
[[ "$(field "$tmp/default" numerics_version)" == 2 ]] && grep -q "^numerics_version = 2$" "$tmp/default/config.toml" &&
  ok default-is-version-2 || bad "default-is-version-2: $(field "$tmp/default" numerics_version)"
"$RETRACE" record --steps 3 "${base[@]}" --set runtime.numerics=native --out "$tmp/native" > /dev/null
grep -q "^numerics_version = 1$" "$tmp/native/config.toml" && [[ -z "$(field "$tmp/native" numerics_version)" ]] &&
  ok native-resolves-version-1 || bad "native-resolves-version-1: $(grep numerics_version "$tmp/native/config.toml")"
# BLIS runs its haswell configuration whatever it would pick for this CPU (zen3 on an AMD EPYC):
# retrace sets BLIS_ARCH_TYPE, unless the user did.
if [[ -z "${BLIS_ARCH_TYPE+set}" ]]; then
  [[ "$(field "$tmp/default" gemm)" == "BLIS 0.9."*" haswell" ]] && ok blis-haswell-pinned ||
    bad "blis-haswell-pinned: $(field "$tmp/default" gemm)"
else
  echo "note: BLIS_ARCH_TYPE=$BLIS_ARCH_TYPE is set in this environment: kept, so blis-haswell-pinned is skipped"
fi

# ---- version 1 is what it was: no new fingerprint field, no new config key ---------------------
"$RETRACE" record --steps 3 "${base[@]}" --set runtime.numerics_version=1 --out "$tmp/v1" > /dev/null
[[ -z "$(field "$tmp/v1" numerics_version)" && -z "$(field "$tmp/v1" gemm)" ]] && ok v1-fingerprint-unchanged ||
  bad "v1-fingerprint-unchanged: $(field "$tmp/v1" numerics_version) $(field "$tmp/v1" gemm)"
grep -q "^numerics_version = 1$" "$tmp/v1/config.toml" && ok v1-config-text || bad "v1-config-text: no numerics_version = 1"

# ---- the MLP: threads 1 and 3 (oversubscribed on two cores: fine for bits) ----------------------
expect mlp-threads-1 0 "version 2: GEMMs BLIS 0\.9\.[0-9]+ [a-z0-9]+ and retrace's kernels on 1 thread" -- \
  "$RETRACE" record --steps 20 "${base[@]}" "${v2[@]}" --set runtime.threads=1 --out "$tmp/m1"
expect mlp-threads-3 0 "on 3 thread\(s\) \(runtime.threads = 3" -- \
  "$RETRACE" record --steps 20 "${base[@]}" "${v2[@]}" --set runtime.threads=3 --out "$tmp/m3"
bitwise mlp-threads-1-vs-3 "$tmp/m1" "$tmp/m3"
[[ "$(field "$tmp/m1" numerics_version)" == 2 && "$(field "$tmp/m1" gemm)" == "BLIS 0.9."* ]] && ok mlp-fingerprint ||
  bad "mlp-fingerprint: $(field "$tmp/m1" numerics_version) $(field "$tmp/m1" gemm)"
# Every kernel of the step retrace's: the LibTorch build and its BLAS are information.
[[ "$(field "$tmp/m1" model_kernels)" == owned && -n "$(field "$tmp/m1" info.libtorch_version)" &&
   -z "$(field "$tmp/m1" libtorch_version)" ]] && ok mlp-libtorch-is-information ||
  bad "mlp-libtorch-is-information: $(field "$tmp/m1" model_kernels) $(field "$tmp/m1" libtorch_version)"
# A step with a LibTorch kernel left (tanh) keeps the build as numerics.
"$RETRACE" record --steps 3 "${base[@]}" "${v2[@]}" --set model.activation=tanh --out "$tmp/tanh" > /dev/null
[[ -z "$(field "$tmp/tanh" model_kernels)" && -n "$(field "$tmp/tanh" libtorch_version)" ]] && ok tanh-keeps-libtorch ||
  bad "tanh-keeps-libtorch: $(field "$tmp/tanh" model_kernels) $(field "$tmp/tanh" libtorch_version)"
[[ "$(field "$tmp/m1" info.threads)" == 1 && "$(field "$tmp/m3" info.threads)" == 3 ]] && ok mlp-threads-information ||
  bad "mlp-threads-information: $(field "$tmp/m1" info.threads) $(field "$tmp/m3" info.threads)"
# Against version 1 the numerics differ, and the comparison says so.
expect v1-vs-v2-named 1 "environment +differs \(bitwise differences are expected\):.*gemm.*model_kernels.*numerics_version" -- "$RETRACE" diff "$tmp/v1" "$tmp/m1"

# ---- the char GPT: threads 1 and 3 ---------------------------------------------------------------
"$RETRACE" record "${gpt[@]}" --steps 3 "${base[@]}" "${v2[@]}" --set runtime.threads=1 --out "$tmp/g1" > /dev/null
"$RETRACE" record "${gpt[@]}" --steps 3 "${base[@]}" "${v2[@]}" --set runtime.threads=3 --out "$tmp/g3" > /dev/null
bitwise gpt-threads-1-vs-3 "$tmp/g1" "$tmp/g3"

# ---- gpt2-124m's config (token shards, tied head, no dropout), narrowed to run in seconds ---------
python3 "$ROOT/tools/data/write_tokens.py" /usr/share/common-licenses/GPL-3 "$tmp/tok" --shard-tokens 9000 \
  --name gpl > /dev/null
gpt2=(--config "$ROOT/configs/gpt2-124m.toml" --set data.dir="$tmp/tok" --set data.context=32 --set data.batch_size=2
      --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=4 --set eval.every_steps=0)
"$RETRACE" record "${gpt2[@]}" --steps 3 "${base[@]}" --set runtime.threads=1 --out "$tmp/t1" > /dev/null
"$RETRACE" record "${gpt2[@]}" --steps 3 "${base[@]}" --set runtime.threads=3 --out "$tmp/t3" > /dev/null
bitwise gpt2-threads-1-vs-3 "$tmp/t1" "$tmp/t3"
[[ "$(field "$tmp/t1" model_kernels)" == owned ]] && ok gpt2-owned || bad "gpt2-owned: $(field "$tmp/t1" model_kernels)"

# ---- recorded on two cores with threads = 0 (auto), resumed and replayed on one ------------------
if taskset -c 0 true 2>/dev/null && [[ $(nproc) -ge 2 ]]; then
  ckpt=(--set train.eval_each_epoch=false --set checkpoint.every_steps=10 --plain)
  taskset -c 0,1 "$RETRACE" record --steps 30 "${ckpt[@]}" "${v2[@]}" --out "$tmp/whole" > /dev/null
  taskset -c 0,1 "$RETRACE" record --total-steps 30 --interrupt-at 10 "${ckpt[@]}" "${v2[@]}" --out "$tmp/r" > /dev/null
  [[ "$(field "$tmp/r" info.threads)" == 2 ]] && ok auto-threads-two-cores || bad "auto-threads-two-cores: $(field "$tmp/r" info.threads)"
  expect resume-one-core 0 "resumed from" -- taskset -c 0 "$RETRACE" resume "$tmp/r" --plain
  expect resume-one-core-same-trace 0 "^same" -- python3 "$ROOT/tests/run/same_trace.py" "$RETRACE" \
    "$tmp/whole/trace.rtrace" "$tmp/r/trace.rtrace"
  expect replay-one-core 0 "REPLAY VERIFIED" -- taskset -c 0 "$RETRACE" replay "$tmp/whole" --quiet
else
  echo "skip resume on another core count: taskset or a second core is missing"
fi

echo "numerics_v2: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
