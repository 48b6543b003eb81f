#!/usr/bin/env bash
# The example project end to end against an installed retrace (ctest `example_project`):
# install, build the project with find_package(retrace), then record / resume / replay / bisect its
# own model and data under retrace's CLI, and record its own loop with the Recorder.
#   run_example.sh BUILD_DIR SOURCE_DIR RETRACE_BIN
set -euo pipefail
build="$1" src="$2" retrace_bin="$3"
work="$(mktemp -d "${TMPDIR:-/tmp}/retrace-example.XXXXXX")"
trap 'rm -rf "$work"' EXIT
expect() { if ! grep -q -- "$1" "$2"; then echo "FAIL: expected '$1' in $2:"; cat "$2"; exit 1; fi; }

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$src/examples/spirals" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
t="$work/build/spirals_trainer" own="$work/build/spirals_own_loop" cfg="$src/examples/spirals/spirals.toml"
cd "$work"

echo "== record, interrupted at step 20, resumed: RESUME VERIFIED"
"$t" record --config "$cfg" --out check --interrupt-at 20 --verify-resume --plain > verify.log
expect "RESUME VERIFIED" verify.log
expect "bitwise: yes" verify.log

echo "== record, kill-style interrupt, resume, replay: REPLAY VERIFIED"
"$t" record --config "$cfg" --out a --interrupt-at 20 --plain > a.log
"$t" resume a --plain > a-resume.log
expect "resumed from" a-resume.log
"$t" replay a --plain > a-replay.log
expect "REPLAY VERIFIED" a-replay.log
"$retrace_bin" inspect a/trace.rtrace --steps 1:2 > inspect.log
expect "resmlp" inspect.log
"$retrace_bin" export a --jsonl --out a/metrics.jsonl
[[ $(grep -c '"type":"step"' a/metrics.jsonl) -eq 40 ]] || { echo "FAIL: 40 step rows expected"; exit 1; }

echo "== bisect against a run with one flipped bit at step 23"
"$t" record --config "$cfg" --out b --inject perturb-param@23:blocks.0.1.weight --plain > b.log
set +e
"$t" bisect a b > bisect.log
rc=$?
set -e
[[ $rc -eq 1 ]] || { echo "FAIL: bisect exit $rc"; cat bisect.log; exit 1; }
expect "step 23" bisect.log

echo "== bad input: an unregistered model kind, a [user] value of the wrong type"
set +e
"$t" record --config "$cfg" --out bad1 --set model.kind=nosuch > bad1.log 2>&1; rc1=$?
"$t" record --config "$cfg" --out bad2 --set user.width=wide > bad2.log 2>&1; rc2=$?
set -e
[[ $rc1 -eq 2 && ! -e bad1 ]] || { echo "FAIL: unregistered kind: exit $rc1"; cat bad1.log; exit 1; }
expect "registered: gpt, mlp, resmlp, torchscript" bad1.log
[[ $rc2 -eq 2 && ! -e bad2 ]] || { echo "FAIL: bad user value: exit $rc2"; cat bad2.log; exit 1; }
expect "bad value for user.width: expected an integer" bad2.log

echo "== own loop with the Recorder: two runs identical, a killed run resumed continues the chain"
"$own" own1 --steps 30 > own1.log
"$own" own2 --steps 30 > own2.log
"$retrace_bin" diff own1/trace.rtrace own2/trace.rtrace > own-diff.log
set +e
"$own" own3 --steps 30 --crash-after 25 > own3.log 2>&1; rc=$?
set -e
[[ $rc -ne 0 ]] || { echo "FAIL: the crash did not happen"; exit 1; }
"$own" own3 --steps 30 --resume > own3-resume.log
# The resumed trace has every step bitwise equal; its one extra record is the resume event, a
# process event, which diff lists but does not count: IDENTICAL, exit 0.
"$retrace_bin" diff own1/trace.rtrace own3/trace.rtrace > own-diff3.log
expect "IDENTICAL (bitwise)" own-diff3.log
expect "30 compared" own-diff3.log
expect "resumed by retrace::Recorder" own-diff3.log
[[ -s own3/trace.set-aside.rtrace ]] || { echo "FAIL: the frames after the checkpoint were not set aside"; exit 1; }
"$retrace_bin" verify own3/checkpoints/step-00000030 > own-verify.log
expect "VERIFIED" own-verify.log
echo "example project: all passed"
