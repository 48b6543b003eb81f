#!/usr/bin/env bash
# A real torchrun (PyPI torch's, from .venv-torch) launching retrace's ranks:
#   1. `torchrun --nproc-per-node 2 --no-python retrace record ...` gives the same trace, bit for
#      bit, as retrace's own launcher (agent store: the agent serves the TCPStore on MASTER_PORT and
#      the ranks are its clients; LOCAL_WORLD_SIZE; the launcher recorded in the fingerprint);
#   2. one rank is killed mid-run: torchrun stops the other and fails; `torchrun ... retrace
#      resume RUN` continues it, and the whole trace equals the uninterrupted one;
#   3. torchrun's own restart (--max-restarts 1): the restarted ranks (TORCHELASTIC_RESTART_COUNT=1)
#      resume the run themselves, under a fresh store prefix, and the trace equals it too;
#   4. ZeRO stage 1 under torchrun: a run whose rank 1 is killed and which torchrun then resumes
#      equals the uninterrupted ZeRO run of retrace's own launcher bit for bit;
#   5. ZeRO's reduce-scatter (runtime.zero_reduce) under torchrun equals it under retrace's launcher.
# Usage: torchrun_test.sh RETRACE TORCHRUN SOURCE_DIR. Exit 77 (skipped) without torchrun.
set -euo pipefail
bin=$1 torchrun=$2 src=$3
if [[ ! -x "$torchrun" ]]; then
  echo "SKIPPED: no torchrun at $torchrun (tools/setup.sh --torch2 makes .venv-torch with PyPI torch)"
  exit 77
fi
py=$(command -v python3)
# c10d's store protocol changes between versions: torchrun's agent store serves the clients of its
# own torch only. Against another LibTorch the ranks must fail with a message that says so.
theirs=$("$(dirname "$torchrun")/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2> /dev/null)
ours=$("$bin" --version | sed -n 's/.*LibTorch \([0-9.]*\).*/\1/p')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--plain --set train.eval_each_epoch=false --set data.eval_batch_size=10000 --total-steps 30
        --set checkpoint.every_steps=10 --set runtime.collective_timeout_s=30)
port=$((20000 + RANDOM % 20000))
tr() { "$torchrun" --nproc-per-node 2 --no-python --master-addr 127.0.0.1 --master-port "$port" "$@"; }
same() { "$py" "$src/tests/run/same_trace.py" "$bin" "$1/trace.rtrace" "$2/trace.rtrace"; }

if [[ "$theirs" != "$ours" ]]; then
  echo "== torchrun of torch $theirs, retrace built against LibTorch $ours"
  set +e
  out=$("$torchrun" --nproc-per-node 2 --no-python --master-addr 127.0.0.1 --master-port "$port" "$bin" record \
        --out "$work/x" "${common[@]}" --set runtime.collective_timeout_s=10 2>&1)
  rc=$?
  set -e
  [[ $rc -ne 0 ]] || { echo "the ranks joined another version's agent store?"; exit 1; }
  grep -q "retrace: environment error: rank [01] of 2 .*could not join the process group.*launcher: torchrun.*only a torchrun of the same torch version as this retrace's LibTorch $ours" <<< "$out" \
    || { echo "no clear message:"; tail -20 <<< "$out"; exit 1; }
  # The ranks fail together and share torchrun's stderr: each message is a line of its own, not
  # pieces of two interleaved (each error is written with one write(2)).
  if grep "environment error" <<< "$out" | grep -vq "^retrace: environment error: rank [01] of 2 .*speaks its protocol$"; then
    echo "the ranks' messages are not whole lines of their own:"; grep "environment error" <<< "$out"; exit 1
  fi
  if grep -q "Exception raised from\|frame #" <<< "$out"; then echo "a C++ stack trace was printed"; exit 1; fi
  grep -m1 "could not join" <<< "$out" | cut -c1-400
  echo "SKIPPED the torchrun runs: they need a torchrun of torch $ours (the clear refusal above passed)"
  exit 77
fi

echo "== reference: retrace's own launcher"
"$bin" record --world-size 2 --out "$work/ref" "${common[@]}" > "$work/ref.log"

echo "== 1. torchrun record"
tr "$bin" record --out "$work/tr" "${common[@]}" > "$work/tr.log" 2>&1 || { cat "$work/tr.log"; exit 1; }
same "$work/ref" "$work/tr"
"$bin" inspect "$work/tr/trace.rtrace" --json > "$work/tr.json"
grep -q '"info.launcher": *"torchrun (run id [^,]*, restart 0, agent store), 2 ranks on this host"' "$work/tr.json" \
  || { echo "the fingerprint does not record the torchrun launch:"; grep -o '"info.launcher"[^,]*,[^,]*,[^,]*' "$work/tr.json"; exit 1; }

echo "== 2. a rank is killed; torchrun resume"
set +e
tr "$bin" record --out "$work/k" "${common[@]}" --inject crash@15:1 > "$work/k.log" 2>&1
rc=$?
set -e
[[ $rc -ne 0 ]] || { echo "torchrun exited 0 although rank 1 was killed"; cat "$work/k.log"; exit 1; }
grep -q "Signal 9 (SIGKILL)\|exitcode *: -9\|SIGKILL" "$work/k.log" || { echo "torchrun did not report the killed rank:"; tail -30 "$work/k.log"; exit 1; }
tr "$bin" resume "$work/k" --plain > "$work/k2.log" 2>&1 || { cat "$work/k2.log"; exit 1; }
grep -q "resumed from" "$work/k2.log" || { cat "$work/k2.log"; exit 1; }
same "$work/ref" "$work/k"

echo "== 3. torchrun restarts the ranks itself; they resume"
tr --max-restarts 1 "$bin" record --out "$work/el" "${common[@]}" --inject crash@15:1 > "$work/el.log" 2>&1 \
  || { cat "$work/el.log"; exit 1; }
grep -q "torchrun restart 1: resuming" "$work/el.log" || { echo "the restarted ranks did not resume:"; tail -30 "$work/el.log"; exit 1; }
same "$work/ref" "$work/el"
echo "== 4. ZeRO stage 1 under torchrun: killed, resumed"
zero=(--set runtime.zero_stage=1 --set trace.digest_version=3)
"$bin" record --world-size 2 --out "$work/zref" "${common[@]}" "${zero[@]}" > "$work/zref.log"
set +e
tr "$bin" record --out "$work/z" "${common[@]}" "${zero[@]}" --inject crash@15:1 > "$work/z.log" 2>&1
rc=$?
set -e
[[ $rc -ne 0 ]] || { echo "torchrun exited 0 although rank 1 was killed"; cat "$work/z.log"; exit 1; }
tr "$bin" resume "$work/z" --plain > "$work/z2.log" 2>&1 || { cat "$work/z2.log"; exit 1; }
grep -q "resumed from" "$work/z2.log" || { cat "$work/z2.log"; exit 1; }
same "$work/zref" "$work/z"
echo "== 5. ZeRO's reduce-scatter under torchrun"
rs=("${zero[@]}" --set runtime.zero_reduce=reduce_scatter)
"$bin" record --world-size 2 --out "$work/rsref" "${common[@]}" "${rs[@]}" > "$work/rsref.log"
tr "$bin" record --out "$work/rs" "${common[@]}" "${rs[@]}" > "$work/rs.log" 2>&1 || { cat "$work/rs.log"; exit 1; }
same "$work/rsref" "$work/rs"
echo "torchrun: record, kill, resume and restart all equal the uninterrupted run bitwise, with ZeRO and its reduce-scatter too"
