#!/usr/bin/env bash
# The tree follows .clang-format (clang-format 14, from tools/setup.sh): every tracked C++ file is
# checked, and a file that would change is named with its first differences. Fix with
#   clang-format-14 -i FILE...      (or: tools/audit/check_format.sh --fix)
# --plant checks the check: a misformatted file in a scratch copy of the style must be caught.
# Usage: check_format.sh SOURCE_DIR [--fix | --plant]. Exit 0 clean, 1 misformatted, 4 no clang-format.
set -euo pipefail
src=$1 mode=${2:-}
cf=$(command -v clang-format-14 || true)
if [[ -z "$cf" ]]; then
  echo "check_format: clang-format-14 is not installed (tools/setup.sh installs it)" >&2
  exit 4
fi
if [[ "$mode" == "--plant" ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$src/.clang-format" "$work/"
  printf 'int f( int x ){return x+1;}\n' > "$work/planted.cpp"
  if "$cf" --style=file --dry-run --Werror "$work/planted.cpp" 2> /dev/null; then
    echo "check_format --plant: a misformatted file passed the check"; exit 1
  fi
  echo "check_format --plant: the misformatted file was caught"
  exit 0
fi
cd "$src"
mapfile -t files < <(git ls-files -- '*.h' '*.hpp' '*.cpp' '*.cc' ':!:golden/*')
if [[ "$mode" == "--fix" ]]; then "$cf" --style=file -i "${files[@]}"; exit 0; fi
# One clang-format for every file; its warnings name each file and line that would change.
if ! out=$("$cf" --style=file --dry-run --Werror "${files[@]}" 2>&1); then
  mapfile -t bad < <(grep -oE '^[^:]+:[0-9]+:[0-9]+: (error|warning)' <<< "$out" | cut -d: -f1 | sort -u)
  echo "check_format: ${#bad[@]} of ${#files[@]} files do not follow .clang-format; run tools/audit/check_format.sh . --fix"
  for f in "${bad[@]:0:10}"; do echo "== $f"; "$cf" --style=file "$f" | diff "$f" - | head -8 || true; done
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format"
