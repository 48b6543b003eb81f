#!/usr/bin/env bash
# Runs a test script with the test environment's Python (.venv at the repository root, made by
# tools/setup.sh from tools/requirements-test.txt): venv_python.sh REPO_ROOT SCRIPT ARGS...
set -euo pipefail
root=${1:?usage: venv_python.sh REPO_ROOT SCRIPT ARGS...}
shift
py="$root/.venv/bin/python"
if [[ ! -x "$py" ]]; then
  echo "no test environment at $root/.venv: run tools/setup.sh (it installs tools/requirements-test.txt)" >&2
  exit 1
fi
exec "$py" "$@"
