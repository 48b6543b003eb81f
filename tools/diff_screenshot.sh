#!/usr/bin/env bash
# Renders an HTML diff report to a PNG with headless Chromium, to look at the charts without a
# browser. Offline: networking, sync and component updates are off, and a fresh profile is used.
#   tools/diff_screenshot.sh report.html out.png [WIDTH,HEIGHT]
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 report.html out.png [WIDTH,HEIGHT]   (default size 1200,1400)" >&2
  exit 2
fi
report=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1200,1400}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$browser" ]]; then
  echo "no chromium found; on Debian: apt-get install -y chromium" >&2
  exit 4
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --screenshot="$out" --window-size="$size" "file://$report" 2>/dev/null
test -s "$out" || { echo "chromium wrote no screenshot to $out" >&2; exit 1; }
echo "$out"
