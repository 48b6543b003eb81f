# Shared by the CLI test scripts: `expect NAME CODE PATTERN -- command...` runs the command and
# checks its exit code and that its output matches the extended regex PATTERN; counts into
# `passes` and `fails`, which the sourcing script reports.
fails=0; passes=0
expect() {
  local name=$1 code=$2 pattern=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -ne $code ]]; then
    echo "FAIL $name: exit $rc, expected $code"; echo "$out" | tail -8; fails=$((fails+1)); return
  fi
  if ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output lacks /$pattern/"; echo "$out" | tail -8; fails=$((fails+1)); return
  fi
  echo "ok   $name (exit $rc)"; passes=$((passes+1))
}
# `check_eq NAME GOT WANT`: counts a pass when the two texts are equal.
check_eq() {
  if [[ "$2" == "$3" ]]; then echo "ok   $1"; passes=$((passes+1)); else echo "FAIL $1: '$2' vs '$3'"; fails=$((fails+1)); fi
}
# `last_chain RUN`: the chain digest of the run's last frame (as `inspect --json` prints it), with
# the script's $RETRACE.
last_chain() { "$RETRACE" inspect "$1/trace.rtrace" --json | grep -o '"chain_digest": *"[0-9a-f]*"' | tail -1; }
