#!/usr/bin/env bash
# train_mlp.py killed and resumed, diffed against an uninterrupted run (identical), then a run with
# another learning rate diffed (it parts at step 1, in the optimizer's update of the first layer).
#   examples/python/run_example.sh [RETRACE] [PYTHON]     (defaults: build-torch2/retrace, .venv-torch/bin/python)
# The retrace package must be importable: `pip install --no-build-isolation .` or
# PYTHONPATH=build-torch2/python.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
retrace=${1:-$root/build-torch2/retrace}
py=${2:-$root/.venv-torch/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ex="$root/examples/python/train_mlp.py"

"$py" "$ex" "$out/whole"
set +e
"$py" "$ex" "$out/killed" --kill-after 37
rc=$?
set -e
[[ $rc -eq 137 ]] || { echo "example: expected the kill (137), got $rc"; exit 1; }
echo "== killed after step 37; resuming from the checkpoint of step 30"
"$py" "$ex" "$out/killed"
"$retrace" diff "$out/whole" "$out/killed"   # exit 0: IDENTICAL

"$py" "$ex" "$out/other-lr" --lr 0.06
set +e
"$retrace" diff "$out/whole" "$out/other-lr"
rc=$?
set -e
[[ $rc -eq 1 ]] || { echo "example: the runs with two learning rates did not diverge (exit $rc)"; exit 1; }
echo "example: ok"
