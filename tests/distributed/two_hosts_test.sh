#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, each with its own
# address (10.231.7.1 and 10.231.7.2, which exist only inside them), one rank in each, started by
# plain environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR on the veth, MASTER_PORT).
# Checks:
#   1. the run equals a single-host run (retrace's own launcher on loopback) bit for bit; rank 0
#      binds by its route to MASTER_ADDR, rank 1 by GLOO_SOCKET_IFNAME; the fingerprint records
#      the interfaces;
#   2. the link is cut mid-run: both ranks fail within the collective timeout with a message that
#      names the peer, and no checkpoint is torn;
#   3. the link is restored and both ranks resume: the whole trace equals the single-host one;
#   4. ZeRO stage 1 across the two hosts equals ZeRO on one host bit for bit.
# Needs root and iproute2 (CI runs as root); exit 77 (skipped) otherwise.
# Usage: two_hosts_test.sh RETRACE SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
if [[ $(id -u) -ne 0 ]] || ! command -v ip > /dev/null; then
  echo "SKIPPED: needs root and iproute2 to make network namespaces"
  exit 77
fi
py=$(command -v python3)
work=$(mktemp -d)
tag=$$
ns0=rt0_$tag ns1=rt1_$tag v0=rtv0_$tag v1=rtv1_$tag
a0=10.231.7.1 a1=10.231.7.2
cleanup() {
  ip netns pids "$ns0" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
  ip netns pids "$ns1" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
  ip netns del "$ns0" 2> /dev/null || true
  ip netns del "$ns1" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add "$ns0" 2> "$work/ns.err"; then
  echo "SKIPPED: cannot make a network namespace here: $(cat "$work/ns.err")"
  exit 77
fi
ip netns add "$ns1"
ip link add "$v0" type veth peer name "$v1"
ip link set "$v0" netns "$ns0"
ip link set "$v1" netns "$ns1"
ip -n "$ns0" addr add "$a0/24" dev "$v0"
ip -n "$ns1" addr add "$a1/24" dev "$v1"
for n in "$ns0" "$ns1"; do ip -n "$n" link set lo up; done
ip -n "$ns0" link set "$v0" up
ip -n "$ns1" link set "$v1" up
ip -n "$ns1" route get "$a0" > /dev/null

timeout_s=8
common=(--plain --set train.eval_each_epoch=false --set data.eval_batch_size=10000
        --set checkpoint.every_steps=10 --set checkpoint.keep_last=100 --set runtime.collective_timeout_s=$timeout_s)
same() { "$py" "$src/tests/run/same_trace.py" "$bin" "$1/trace.rtrace" "$2/trace.rtrace"; }
port=$((20000 + RANDOM % 20000))
# rank0/rank1 CMD...: one rank in its namespace, in the background; its pid in $pid0 / $pid1.
rank0() { ip netns exec "$ns0" env RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=$a0 MASTER_PORT=$port "$bin" "$@" & pid0=$!; }
rank1() { ip netns exec "$ns1" env RANK=1 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=$a0 MASTER_PORT=$port GLOO_SOCKET_IFNAME=$v1 "$bin" "$@" & pid1=$!; }

echo "== single-host reference (loopback)"
"$bin" record --world-size 2 --out "$work/ref" --total-steps 400 "${common[@]}" > "$work/ref.log"

echo "== 1. one rank per namespace, 60 steps"
"$bin" record --world-size 2 --out "$work/ref60" --total-steps 60 "${common[@]}" > "$work/ref60.log"
rank0 record --out "$work/two" --total-steps 60 "${common[@]}" > "$work/two0.log" 2>&1
rank1 record --out "$work/two" --total-steps 60 "${common[@]}" > "$work/two1.log" 2>&1
wait "$pid0" || { echo "rank 0 failed:"; cat "$work/two0.log"; exit 1; }
wait "$pid1" || { echo "rank 1 failed:"; cat "$work/two1.log"; exit 1; }
same "$work/ref60" "$work/two"
"$bin" inspect "$work/two/trace.rtrace" --json > "$work/two.json"
grep -q "\"info.dist_endpoint\": *\"$v0 $a0 (route to MASTER_ADDR $a0)\"" "$work/two.json" \
  || { echo "rank 0's endpoint is not recorded:"; grep -o '"info.dist_[a-z]*": *"[^"]*"' "$work/two.json"; exit 1; }
grep -q "\"info.dist_peers\": *\"rank 1 at $v1 $a1 (GLOO_SOCKET_IFNAME)\"" "$work/two.json" \
  || { echo "rank 1's endpoint is not recorded:"; grep -o '"info.dist_[a-z]*": *"[^"]*"' "$work/two.json"; exit 1; }

echo "== 2. the link is cut mid-run"
port=$((port + 1))
rank0 record --out "$work/cut" --total-steps 400 "${common[@]}" > "$work/cut0.log" 2>&1
rank1 record --out "$work/cut" --total-steps 400 "${common[@]}" > "$work/cut1.log" 2>&1
for _ in $(seq 600); do
  [[ -e "$work/cut/checkpoints/step-00000040/manifest.json" ]] && break
  sleep 0.05
done
[[ -e "$work/cut/checkpoints/step-00000040/manifest.json" ]] || { echo "no checkpoint at step 40:"; ls "$work/cut/checkpoints"; exit 1; }
ip -n "$ns1" link set "$v1" down
cut_at=$(date +%s.%N)
set +e
wait "$pid0"; rc0=$?
t0=$(date +%s.%N)
wait "$pid1"; rc1=$?
t1=$(date +%s.%N)
set -e
for r in 0 1; do
  rc=$([[ $r == 0 ]] && echo $rc0 || echo $rc1)
  [[ $rc -eq 4 ]] || { echo "rank $r exited $rc after the cut, not 4:"; tail -5 "$work/cut$r.log"; exit 1; }
done
grep -q "peers: rank 1 at $v1 $a1" "$work/cut0.log" || { echo "rank 0's message does not name its peer:"; tail -3 "$work/cut0.log"; exit 1; }
grep -q "peers: rank 0 at $v0 $a0" "$work/cut1.log" || { echo "rank 1's message does not name its peer:"; tail -3 "$work/cut1.log"; exit 1; }
if grep -q "Exception raised from\|frame #" "$work/cut0.log" "$work/cut1.log"; then echo "a C++ stack trace was printed"; exit 1; fi
"$py" - "$cut_at" "$t0" "$t1" "$timeout_s" << 'PY'
import sys
cut, t0, t1, limit = map(float, sys.argv[1:5])
worst = max(t0, t1) - cut
print(f"both ranks failed {t0 - cut:.1f} s and {t1 - cut:.1f} s after the cut (collective timeout {limit:.0f} s)")
sys.exit(0 if worst <= limit + 10 else 1)
PY
echo "rank 0: $(grep -m1 -o 'rank 0 ([^)]*)[^;]*' "$work/cut0.log" | head -c 300)"
for d in "$work"/cut/checkpoints/step-*; do
  [[ -e "$d/manifest.json" ]] || continue
  "$bin" verify "$d" > /dev/null || { echo "torn checkpoint $d"; exit 1; }
done

echo "== 3. the link is back; both ranks resume"
ip -n "$ns1" link set "$v1" up
ip -n "$ns1" route get "$a0" > /dev/null
port=$((port + 1))
rank0 resume "$work/cut" --plain > "$work/res0.log" 2>&1
rank1 resume "$work/cut" --plain > "$work/res1.log" 2>&1
wait "$pid0" || { echo "rank 0's resume failed:"; cat "$work/res0.log"; exit 1; }
wait "$pid1" || { echo "rank 1's resume failed:"; cat "$work/res1.log"; exit 1; }
grep -m1 "resumed from" "$work/res0.log"
same "$work/ref" "$work/cut"
echo "== 4. ZeRO stage 1 across the two hosts"
zero=(--set runtime.zero_stage=1 --set trace.digest_version=3)
"$bin" record --world-size 2 --out "$work/zref" --total-steps 30 "${common[@]}" "${zero[@]}" > "$work/zref.log"
port=$((port + 1))
rank0 record --out "$work/z" --total-steps 30 "${common[@]}" "${zero[@]}" > "$work/z0.log" 2>&1
rank1 record --out "$work/z" --total-steps 30 "${common[@]}" "${zero[@]}" > "$work/z1.log" 2>&1
wait "$pid0" || { echo "rank 0 failed:"; cat "$work/z0.log"; exit 1; }
wait "$pid1" || { echo "rank 1 failed:"; cat "$work/z1.log"; exit 1; }
same "$work/zref" "$work/z"
echo "two hosts: bitwise equal to one host, with ZeRO too; a cut link fails both ranks naming the peer; resume continues bitwise"
