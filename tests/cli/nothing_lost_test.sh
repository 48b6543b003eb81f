#!/usr/bin/env bash
# Regression cases of the fault campaign: nothing a command did not make is removed, bad input is
# a typed error with the documented exit code (never 70 or a hang), and the trace's hash chain is
# checked wherever a trace is read.
set -u
RETRACE=${1:?usage: nothing_lost_test.sh path/to/retrace}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../testing/expect.sh"
run=(--steps 20 --set checkpoint.every_steps=10 --set train.eval_each_epoch=false --set "model.hidden=[32]" --plain)
"$RETRACE" record "${run[@]}" --out "$tmp/a" >/dev/null || { echo "record failed"; exit 1; }
ok() { echo "ok   $1"; passes=$((passes+1)); }
bad() { echo "FAIL $1"; fails=$((fails+1)); }

# `replay --out DIR` used to wipe DIR, unrelated files included.
mkdir -p "$tmp/mine" && echo "keep me" > "$tmp/mine/notes.txt"
expect replay-out-refuses-foreign-dir 2 "is not a scratch directory that retrace made.*--force" -- \
  "$RETRACE" replay "$tmp/a" --quiet --out "$tmp/mine"
[[ "$(cat "$tmp/mine/notes.txt" 2>/dev/null)" == "keep me" ]] && ok replay-out-kept-the-file || bad replay-out-kept-the-file
expect replay-out-force 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet --out "$tmp/mine" --force
expect replay-default-twice 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet
expect replay-default-again 0 "REPLAY VERIFIED" -- "$RETRACE" replay "$tmp/a" --quiet
mkdir -p "$tmp/v/uninterrupted" && echo "mine" > "$tmp/v/uninterrupted/x"
expect verify-resume-refuses-foreign-dir 2 "is not a scratch directory" -- \
  "$RETRACE" record --total-steps 6 --interrupt-at 3 --verify-resume --out "$tmp/v" --plain
[[ -f "$tmp/v/uninterrupted/x" ]] && ok verify-resume-kept-the-file || bad verify-resume-kept-the-file

# The same exit code for a missing checkpoint directory in both modes (3: unreadable input).
expect verify-missing-text 3 "checkpoint directory missing" -- "$RETRACE" verify "$tmp/nope"
expect verify-missing-json 3 "checkpoint directory missing" -- "$RETRACE" verify "$tmp/nope" --json

# One flipped byte in a manifest, made invalid UTF-8: exit 3 with --json too (was 70).
cp -r "$tmp/a" "$tmp/b"
m="$tmp/b/checkpoints/step-00000010/manifest.json"
printf '\xfb' | dd of="$m" bs=1 seek=98 conv=notrunc 2>/dev/null
expect manifest-invalid-utf8-json 3 '"ok": false' -- "$RETRACE" verify "$tmp/b/checkpoints/step-00000010" --json

# A FIFO in place of the manifest used to hang verify.
cp -r "$tmp/a" "$tmp/c"
rm "$tmp/c/checkpoints/step-00000010/manifest.json" && mkfifo "$tmp/c/checkpoints/step-00000010/manifest.json"
expect fifo-manifest 3 "not a regular file" -- timeout 20 "$RETRACE" verify "$tmp/c/checkpoints/step-00000010"

# A path that is not UTF-8 (was 70 with --json).
bad_path=$(printf '%s/\xff\xfe' "$tmp")
mkdir -p "$bad_path"
expect non-utf8-path-json 3 '"ok": false' -- "$RETRACE" verify "$bad_path" --json

# The trace deleted before resume (was 70).
cp -r "$tmp/a" "$tmp/d" && rm "$tmp/d/trace.rtrace"
expect trace-deleted-before-resume 3 "its trace .* is missing; the checkpoints are kept" -- "$RETRACE" resume "$tmp/d"
[[ -d "$tmp/d/checkpoints/step-00000020" ]] && ok trace-deleted-checkpoints-kept || bad trace-deleted-checkpoints-kept

# Every command that reads a trace checks its hash chain: two step frames swapped.
python3 - "$tmp/a/trace.rtrace" "$tmp/swapped.rtrace" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
pos, frames = 16, []
while pos + 32 <= len(data):
    clen = struct.unpack_from("<I", data, pos + 16)[0]
    frames.append((pos, 32 + clen, data[pos + 4]))
    pos += 32 + clen
steps = [(o, n) for o, n, k in frames if k == 2]
(a, na), (b, nb) = steps[5], steps[6]
open(sys.argv[2], "wb").write(data[:a] + data[b:b + nb] + data[a:a + na] + data[b + nb:])
EOF
expect chain-inspect 3 "trace chain broken at step 7" -- "$RETRACE" inspect "$tmp/swapped.rtrace"
expect chain-diff 3 "trace chain broken at step 7" -- "$RETRACE" diff "$tmp/a/trace.rtrace" "$tmp/swapped.rtrace"

# Garbage after the last complete frame (what a power loss leaves) is a warning, not fatal.
cp "$tmp/a/trace.rtrace" "$tmp/tail.rtrace" && head -c 3000 /dev/zero >> "$tmp/tail.rtrace"
expect garbage-tail-inspect 0 "bytes that are not a frame" -- "$RETRACE" inspect "$tmp/tail.rtrace"

# A run directory comes with its config in one rename; a trailing slash names the same directory.
expect out-with-slash 0 "recorded 20 steps" -- "$RETRACE" record "${run[@]}" --out "$tmp/slash/"
[[ -f "$tmp/slash/config.toml" && -z "$(ls -d "$tmp"/slash.tmp-* 2>/dev/null)" ]] && ok run-dir-made-whole || bad run-dir-made-whole

# An error line starts the output (no blank line before it).
out=$("$RETRACE" verify "$tmp/nope" 2>&1)
[[ "${out:0:8}" == "retrace:" ]] && ok error-line-first || bad "error-line-first: '${out:0:20}'"

echo "nothing_lost: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
