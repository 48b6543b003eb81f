#!/usr/bin/env bash
# A trace recorded by a retrace built against one LibTorch, resumed and replayed by one built
# against another: refused with exit 4 and a message naming both versions, unless
# --accept-other-torch, with which the resume continues and says so in the trace.
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
"$OTHER" record --total-steps 12 --interrupt-at 6 --out "$tmp/r" --plain --set train.eval_each_epoch=false > /dev/null
before=$(stat -c %s "$tmp/r/trace.rtrace")
expect resume-other-torch 4 "cannot resume .*: it was recorded with LibTorch $theirs and this retrace is built against LibTorch $ours.*--accept-other-torch" -- \
  "$RETRACE" resume "$tmp/r" --plain
[[ $(stat -c %s "$tmp/r/trace.rtrace") == "$before" ]] || { echo "FAIL the refused resume changed the trace"; fails=$((fails+1)); }
expect replay-other-torch 4 "cannot replay .*: it was recorded with LibTorch $theirs" -- "$RETRACE" replay "$tmp/r" --quiet
expect resume-other-torch-accepted 0 "resumed under other numerics than the trace header records \(.*libtorch_version $theirs -> $ours" -- \
  "$RETRACE" resume "$tmp/r" --plain --accept-other-torch
echo "other_torch: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
