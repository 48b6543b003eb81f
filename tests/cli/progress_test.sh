#!/usr/bin/env bash
# Progress of long commands: on a terminal (util-linux `script` gives them one) a live line with
# step/total, rate and ETA redrawn in place; piped, plain lines and no terminal control codes.
# Covers resume, replay, bisect, golden check and memory.
set -u
RETRACE=$(realpath "${1:?usage: progress_test.sh path/to/retrace REPO_ROOT}")
ROOT=$(realpath "${2:?}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$ROOT/tests/testing/expect.sh"
cd "$tmp"
# Runs a command on a pseudo-terminal; its output, with control characters made visible (^M, ^[).
on_tty() { script -qec "$(printf '%q ' "$@")" /dev/null | cat -v; return "${PIPESTATUS[0]}"; }
live='\^M\^\[\[K.*[0-9]+/[0-9]+ .*/s +ETA [0-9]+s'
# Runs a command piped; its output, and exit 99 when the output holds a carriage return or an escape.
no_codes() {
  local out rc
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out"
  if grep -q $'[\r\033]' <<<"$out"; then echo "terminal control codes in piped output"; return 99; fi
  return $rc
}

"$RETRACE" record --plain --steps 40 --interrupt-at 20 --set checkpoint.every_steps=10 --out r >/dev/null 2>&1
cp -r r r2
expect resume-tty 0 "step [0-9]+/40 .*steps/s +ETA" -- on_tty "$RETRACE" resume r
expect resume-piped 0 "^STEP +step +40 " -- no_codes "$RETRACE" resume r2
expect replay-tty 0 "step [0-9]+/40 .*steps/s +ETA" -- on_tty "$RETRACE" replay r --out rp --force
expect replay-piped 0 "^STEP +step +40 " -- no_codes "$RETRACE" replay r --out rp --force

"$RETRACE" record --plain --steps 30 --set checkpoint.every_steps=10 --out a >/dev/null 2>&1
"$RETRACE" record --plain --steps 30 --set checkpoint.every_steps=10 --out b --inject perturb-param@17:layers.0.weight \
  >/dev/null 2>&1
expect bisect-tty 1 "run B: re-executing steps 11..17 +7/7 steps" -- on_tty "$RETRACE" bisect a b
expect bisect-tty-live 1 "$live" -- on_tty "$RETRACE" bisect a b
expect bisect-piped 1 "^run B: re-executing steps 11..17: 7/7 steps \(100%\)" -- no_codes "$RETRACE" bisect a b
expect golden-tty 0 "golden fashion-mlp-fast +[0-9]+/100 steps" -- on_tty "$RETRACE" golden check --dir "$ROOT/golden" fashion-mlp-fast
expect golden-piped 0 "^golden fashion-mlp-fast: 100/100 steps \(100%\)" -- \
  no_codes "$RETRACE" golden check --dir "$ROOT/golden" fashion-mlp-fast
mem=(memory --config "$ROOT/configs/char-gpt.toml" --set model.n_layers=1 --set data.batch_size=2 --rounds 1 --steps 1)
expect memory-tty 0 "memory: 1 rounds of 4 policies.* [0-9]/4 measurements" -- on_tty "$RETRACE" "${mem[@]}"
expect memory-piped 0 "^memory: 1 rounds of 4 policies, fresh process each: 4/4 measurements \(100%\)" -- \
  no_codes "$RETRACE" "${mem[@]}"

echo "progress: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
