#!/usr/bin/env bash
# Numerics profiles through the CLI: portable runs pin the kernels whatever the machine would pick,
# information fields never break a bitwise comparison, numerics fields are named when they differ,
# goldens recorded under one kernel are checked under another (both ways, native and portable),
# and bad input exits with the documented code.
#
# A variable this machine's environment sets on purpose (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) is
# never changed here: the cases that would set it are skipped when it is set, and say so.
set -u
RETRACE=${1:?usage: numerics_cli_test.sh path/to/retrace golden_dir}
GOLDEN=${2:?golden dir}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
# Version 1's pins (OpenBLAS kernel, thread counts); version 2 has numerics_v2_test.sh.
base=(--set train.eval_each_epoch=false --set checkpoint.every_steps=0 --set checkpoint.at_end=false --plain
  --set runtime.numerics_version=1)
short=(--steps 12 "${base[@]}")
fingerprint() { "$RETRACE" inspect "$1/trace.rtrace" | grep -E "^  $2=" | head -1 | cut -d= -f2-; }
check_eq() {  # name, got, want
  if [[ "$2" == "$3" ]]; then echo "ok   $1 ($2)"; passes=$((passes+1)); else echo "FAIL $1: '$2', expected '$3'"; fails=$((fails+1)); fi
}
machine_sets_coretype=${OPENBLAS_CORETYPE+set}
machine_sets_capability=${ATEN_CPU_CAPABILITY+set}
machine_sets_cbwr=${MKL_CBWR+set}
# The goldens in the repository were recorded with LibTorch 1.13 and OpenBLAS (Debian's build).
debian_build=""
"$RETRACE" --version | grep -q "LibTorch 1\..*BLAS OpenBLAS" && debian_build=1

# ---- bad input -------------------------------------------------------------------------------
expect unknown-profile 2 "bad value for runtime.numerics.*\"portable\", \"native\"" -- \
  "$RETRACE" record "${short[@]}" --out "$tmp/bad" --set runtime.numerics=fast
expect portable-without-avx2 4 "lacks avx2, fma.*--set runtime.numerics=native" -- \
  env RETRACE_CPU_FEATURES=sse2,sse4_2,popcnt "$RETRACE" record "${short[@]}" --out "$tmp/noavx"
[[ -e "$tmp/bad" || -e "$tmp/noavx" ]] && { echo "FAIL a refused run left its directory"; fails=$((fails+1)); }
expect native-without-avx2 0 "recorded 12 steps" -- \
  env RETRACE_CPU_FEATURES=sse2,sse4_2,popcnt "$RETRACE" record "${short[@]}" --out "$tmp/noavx-native" \
  --set runtime.numerics=native

# ---- portable pins the path ---------------------------------------------------------------------
expect portable-run 0 "numerics: portable" -- "$RETRACE" record "${short[@]}" --out "$tmp/a"
# The BLAS is the LibTorch's: OpenBLAS behind Debian's (libblas.so.3), MKL inside the PyPI wheels.
mkl=""
[[ "$(fingerprint "$tmp/a" blas_core)" == MKL_CBWR=* ]] && mkl=1
if [[ -n "$mkl" ]]; then
  echo "note: this LibTorch's BLAS is MKL ($(fingerprint "$tmp/a" blas)); its code path is pinned with MKL_CBWR"
  if [[ -z "$machine_sets_cbwr" ]]; then
    check_eq portable-mkl-path "$(fingerprint "$tmp/a" blas_core)" MKL_CBWR=AVX2,STRICT
    check_eq portable-set-by-retrace "$("$RETRACE" inspect "$tmp/a/trace.rtrace" | grep -c 'set_by_retrace=.*MKL_CBWR')" 1
  else
    check_eq portable-keeps-machine-path "$(fingerprint "$tmp/a" blas_core)" "MKL_CBWR=$MKL_CBWR"
  fi
elif [[ -z "$machine_sets_coretype" ]]; then
  check_eq portable-kernel "$(fingerprint "$tmp/a" blas_core)" Haswell
  check_eq portable-set-by-retrace "$("$RETRACE" inspect "$tmp/a/trace.rtrace" | grep -c 'set_by_retrace=.*OPENBLAS_CORETYPE')" 1
else
  check_eq portable-keeps-machine-kernel "$(fingerprint "$tmp/a" info.env.OPENBLAS_CORETYPE)" "$OPENBLAS_CORETYPE"
fi
aten=${ATEN_CPU_CAPABILITY:-avx2}
check_eq portable-aten "$(fingerprint "$tmp/a" aten_cpu_capability)" "${aten^^}"
# MKL runs on ATen's threads (runtime.blas_threads is OpenBLAS's pool).
check_eq portable-threads "$(fingerprint "$tmp/a" torch_threads)/$(fingerprint "$tmp/a" blas_threads)" "1/$([[ -n "$mkl" ]] && echo 1 || echo 2)"
check_eq portable-onednn "$(fingerprint "$tmp/a" onednn)" off

# The launcher (build/retrace) sets the pins before LibTorch loads and starts retrace-core beside
# it; with OpenBLAS it also sets OPENBLAS_THREAD_TIMEOUT=22 unless the user set it. retrace-core
# started directly sets the pins itself (one re-execution) and not the timeout; both give the
# same bits.
core="$(dirname "$RETRACE")/retrace-core"
"$core" record "${short[@]}" --out "$tmp/core" >/dev/null
expect core-direct-same-bits 0 "IDENTICAL \(bitwise\)" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/core/trace.rtrace"
check_eq core-direct-no-timeout "$(fingerprint "$tmp/core" info.env.OPENBLAS_THREAD_TIMEOUT)" ""
if [[ -z "$mkl" && -z "${OPENBLAS_THREAD_TIMEOUT+set}" ]]; then
  check_eq launcher-thread-timeout "$(fingerprint "$tmp/a" info.env.OPENBLAS_THREAD_TIMEOUT)" 22
  check_eq launcher-timeout-listed "$("$RETRACE" inspect "$tmp/a/trace.rtrace" | grep -c 'set_by_retrace=.*OPENBLAS_THREAD_TIMEOUT')" 1
  OPENBLAS_THREAD_TIMEOUT=9 "$RETRACE" record "${short[@]}" --out "$tmp/tt" >/dev/null
  check_eq launcher-keeps-users-timeout "$(fingerprint "$tmp/tt" info.env.OPENBLAS_THREAD_TIMEOUT)" 9
  check_eq users-timeout-not-listed "$("$RETRACE" inspect "$tmp/tt/trace.rtrace" | grep -c 'set_by_retrace=.*OPENBLAS_THREAD_TIMEOUT')" 0
  # Only where each local rank has two cores (room for a helper lane): two ranks here, by retrace's
  # own rank launcher and as torchrun would start them (LOCAL_WORLD_SIZE).
  want=""; (( $(nproc) >= 4 )) && want=22
  "$RETRACE" record "${short[@]}" --world-size 2 --out "$tmp/ws2" >/dev/null
  check_eq ranks-timeout-fits-cores "$(fingerprint "$tmp/ws2" info.env.OPENBLAS_THREAD_TIMEOUT)" "$want"
  want=""; (( $(nproc) >= 6 )) && want=22
  LOCAL_WORLD_SIZE=3 "$RETRACE" record "${short[@]}" --out "$tmp/lws" >/dev/null
  check_eq local-ranks-timeout-fits-cores "$(fingerprint "$tmp/lws" info.env.OPENBLAS_THREAD_TIMEOUT)" "$want"
elif [[ -n "$mkl" ]]; then
  check_eq launcher-no-timeout-under-mkl "$(fingerprint "$tmp/a" info.env.OPENBLAS_THREAD_TIMEOUT)" ""
fi
mkdir "$tmp/alone" && cp "$RETRACE" "$tmp/alone/retrace"
expect launcher-without-core 4 "cannot start the trainer .*alone/retrace-core" -- "$tmp/alone/retrace" --version

# An information field alone (a variable with no effect on the kernels: OMP_NUM_THREADS, which
# retrace overrides with explicit thread counts) keeps every comparison bitwise.
OMP_NUM_THREADS=3 "$RETRACE" record "${short[@]}" --out "$tmp/info" >/dev/null
check_eq info-field-recorded "$(fingerprint "$tmp/info" info.env.OMP_NUM_THREADS)" 3
expect info-only-diff-identical 0 "IDENTICAL \(bitwise\)" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/info/trace.rtrace"
expect info-only-replay-bitwise 0 "comparison: bitwise \(environment fingerprints equal\)" -- \
  env OMP_NUM_THREADS=5 "$RETRACE" replay "$tmp/info" --quiet

# A numerics field is named: the BLAS thread count (under MKL, which runs on the torch threads,
# the torch thread count) ...
if [[ -n "$mkl" ]]; then
  "$RETRACE" record "${short[@]}" --out "$tmp/t1" --set runtime.threads=2 >/dev/null
  expect numerics-threads-named 1 "environment +differs.*torch_threads" -- \
    "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/t1/trace.rtrace"
else
  "$RETRACE" record "${short[@]}" --out "$tmp/t1" --set runtime.blas_threads=1 >/dev/null
  expect numerics-threads-named 1 "environment +differs.*blas_threads" -- \
    "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/t1/trace.rtrace"
fi
# ... the profile ...
"$RETRACE" record "${short[@]}" --out "$tmp/n" --set runtime.numerics=native >/dev/null
expect numerics-profile-named 1 "environment +differs.*numerics" -- \
  "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/n/trace.rtrace"
# ... and the kernel, set in the environment and kept (portable only among machines that set it).
if [[ -n "$mkl" && -z "$machine_sets_cbwr" ]]; then
  expect respected-mkl-path 0 "MKL_CBWR=COMPATIBLE was set in the environment and is kept" -- \
    env MKL_CBWR=COMPATIBLE "$RETRACE" record "${short[@]}" --out "$tmp/p"
  check_eq respected-mkl-path-recorded "$(fingerprint "$tmp/p" blas_core)" MKL_CBWR=COMPATIBLE
  expect numerics-mkl-path-named 1 "environment +differs.*blas_core" -- \
    "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/p/trace.rtrace"
elif [[ -n "$mkl" ]]; then
  echo "skip MKL path cases: this machine sets MKL_CBWR=$MKL_CBWR, which tests never change"
elif [[ -z "$machine_sets_coretype" ]]; then
  expect respected-coretype 0 "OPENBLAS_CORETYPE=Prescott was set in the environment and is kept" -- \
    env OPENBLAS_CORETYPE=Prescott "$RETRACE" record "${short[@]}" --out "$tmp/p"
  check_eq respected-kernel "$(fingerprint "$tmp/p" blas_core)" Prescott
  expect numerics-kernel-named 1 "environment +differs.*blas_core" -- \
    "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/p/trace.rtrace"
  # A native run started by a portable one (the pins in its environment, marked as retrace's)
  # drops them and runs the machine's own kernel.
  env OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 RETRACE_NUMERICS_PINNED=ATEN_CPU_CAPABILITY,OPENBLAS_CORETYPE \
    "$RETRACE" record "${short[@]}" --out "$tmp/n2" --set runtime.numerics=native >/dev/null
  check_eq native-drops-pins "$(fingerprint "$tmp/n2" info.env.OPENBLAS_CORETYPE)|$(fingerprint "$tmp/n2" blas_core)" \
    "|$(fingerprint "$tmp/n" blas_core)"
  # A resume under other numerics than the trace header's is said, and recorded in the trace.
  "$RETRACE" record "${short[@]}" --out "$tmp/r" --interrupt-at 6 >/dev/null
  expect resume-other-numerics 0 "warning: resumed under other numerics than the trace header records \(blas_core Haswell -> Prescott\)" -- \
    env OPENBLAS_CORETYPE=Prescott "$RETRACE" resume "$tmp/r" --plain
  check_eq resume-warning-in-trace "$("$RETRACE" inspect "$tmp/r/trace.rtrace" | grep -c 'resumed under other numerics')" 1
  "$RETRACE" record "${short[@]}" --out "$tmp/r2" --interrupt-at 6 >/dev/null
  out=$("$RETRACE" resume "$tmp/r2" --plain 2>&1)
  if grep -q "other numerics" <<<"$out"; then echo "FAIL resume-same-numerics warned"; fails=$((fails+1)); else echo "ok   resume-same-numerics (no warning)"; passes=$((passes+1)); fi
else
  echo "skip kernel cases: this machine sets OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, which tests never change"
fi

# BF16 autocast: portable keeps every matmul off oneDNN (whose kernel the CPU features choose);
# native uses oneDNN where ATen routes BF16 to it (CPUs with AVX-512 BW, VL and DQ).
bf16=(--set amp.mode=bf16 --steps 2 "${base[@]}")
expect bf16-portable-no-onednn 0 "recorded 2 steps" -- env ONEDNN_VERBOSE=1 "$RETRACE" record "${bf16[@]}" --out "$tmp/bf"
n_exec=$(ONEDNN_VERBOSE=1 "$RETRACE" record "${bf16[@]}" --out "$tmp/bf" --force 2>&1 | grep -c "verbose,exec")
check_eq bf16-portable-onednn-primitives "$n_exec" 0
# (LibTorch 1.13 routes BF16 matmuls to oneDNN on such CPUs; 2.11 did not here, so there the case is skipped.)
if [[ -n "$debian_build" ]] && grep -q avx512bw /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo && grep -q avx512dq /proc/cpuinfo; then
  n_exec=$(ONEDNN_VERBOSE=1 "$RETRACE" record "${bf16[@]}" --out "$tmp/bfn" --set runtime.numerics=native 2>&1 | grep -c "verbose,exec")
  if (( n_exec > 0 )); then echo "ok   bf16-native-uses-onednn ($n_exec primitives)"; passes=$((passes+1)); else echo "FAIL bf16-native-uses-onednn: none"; fails=$((fails+1)); fi
fi

# ---- goldens across kernels -----------------------------------------------------------------------
# A golden recorded under one kernel and checked under another (and the reverse): bitwise within
# portable, the cross-numerics rule with the differing field named otherwise, never red for the
# machine alone. A golden changed for real still fails.
g="$tmp/golden"
new_golden() {  # name, then extra arguments for `golden update`
  local name=$1; shift
  "$RETRACE" golden update "$name" --dir "$g" --reason "numerics test" --set train.steps=30 \
    --set train.eval_each_epoch=false --set checkpoint.every_steps=0 "$@" >/dev/null || { echo "FAIL golden update $name"; fails=$((fails+1)); }
}
new_golden portable --set runtime.numerics_version=1
new_golden portable-v2
expect golden-portable-bitwise 0 "golden portable +PASS  bitwise" -- "$RETRACE" golden check portable --dir "$g" --scratch "$tmp/s"
expect golden-prints-numerics 0 "numerics fingerprint: .*numerics=portable.*aten_cpu_capability=AVX2" -- \
  "$RETRACE" golden check portable --dir "$g" --scratch "$tmp/s"
expect golden-lr-still-fails 1 "golden portable +FAIL" -- \
  "$RETRACE" golden check portable --dir "$g" --scratch "$tmp/s" --set optim.lr=0.002
if [[ -n "$mkl" ]]; then
  echo "skip golden cases across OpenBLAS kernels: this LibTorch's BLAS is MKL"
elif [[ -z "$machine_sets_coretype" ]]; then
  expect golden-portable-under-prescott 0 "PASS  tolerance.*numerics fields differ: blas_core\)" -- \
    env OPENBLAS_CORETYPE=Prescott "$RETRACE" golden check portable --dir "$g" --scratch "$tmp/s"
  # Version 2's MLP runs no OpenBLAS kernel: another one leaves its bits alone.
  expect golden-v2-ignores-openblas-kernel 0 "golden portable-v2 +PASS  bitwise" -- \
    env OPENBLAS_CORETYPE=Prescott "$RETRACE" golden check portable-v2 --dir "$g" --scratch "$tmp/s"
  # Native numerics across two kernels: the machine's own and another one. OpenBLAS 0.3.21 runs
  # Prescott on CPUs it does not know (Intel Emerald Rapids VMs), so there the other is Haswell.
  "$RETRACE" record "${short[@]}" --out "$tmp/native" --set runtime.numerics=native >/dev/null 2>&1
  own=$(fingerprint "$tmp/native" blas_core)
  other=Prescott
  [[ "$own" == Prescott ]] && other=Haswell
  echo "     (native kernels: this machine's $own, the other $other)"
  OPENBLAS_CORETYPE=$other new_golden native-other --set runtime.numerics=native
  expect golden-other-kernel-under-machine-default 0 "PASS  tolerance.*blas_core" -- \
    "$RETRACE" golden check native-other --dir "$g" --scratch "$tmp/s"
  new_golden native-default --set runtime.numerics=native
  expect golden-machine-default-under-other-kernel 0 "PASS  tolerance.*blas_core" -- \
    env OPENBLAS_CORETYPE=$other "$RETRACE" golden check native-default --dir "$g" --scratch "$tmp/s"
  expect golden-native-lr-still-fails 1 "first divergent step 1, field lr" -- \
    env OPENBLAS_CORETYPE=$other "$RETRACE" golden check native-default --dir "$g" --scratch "$tmp/s" --set optim.lr=0.002
  expect golden-mixed-profiles-refused 2 "one process runs one profile" -- \
    "$RETRACE" golden check --dir "$g" --scratch "$tmp/s"
fi
# The repository's goldens are portable: bitwise on any x86-64-v3 machine in portable mode.
if [[ -z "$debian_build" ]]; then
  echo "skip repo-goldens-bitwise: $("$RETRACE" --version) computes other bits than the goldens' LibTorch 1.13 with OpenBLAS (replay_cli checks them across numerics)"
elif [[ -z "$machine_sets_coretype" && -z "$machine_sets_capability" ]]; then
  expect repo-goldens-bitwise 0 "golden fashion-mlp-100 +PASS  bitwise" -- \
    "$RETRACE" golden check fashion-mlp-100 --dir "$GOLDEN" --scratch "$tmp/s"
fi

echo "numerics_cli: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
