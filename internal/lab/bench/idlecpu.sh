#!/usr/bin/env bash
# What an idle mesh costs: 8 kvmesh routers over 8 replica-sims on
# 127.0.0.1, no requests, the routers' summed utime+stime over MEASURE s
# after SETTLE s up, as a share of one core (docs/DESIGN.md, "Load
# beacons": the beacon loop does no work while no load changes).
#   internal/lab/bench/idlecpu.sh KVMESH_BIN LOAD_INTERVAL    e.g. ./kvmesh 25ms, or 0 for no beacons
# Ports BASE_PORT..BASE_PORT+307 (default 21000). Run it under the
# machine's benchmark lock: anything else running is counted as noise.
set -u
BIN=$1 LI=$2 MEASURE=${MEASURE:-30} SETTLE=${SETTLE:-10} P=${BASE_PORT:-21000}
W=$(mktemp -d /tmp/kvmesh-idlecpu.XXXX)
(umask 077 && head -c 32 /dev/urandom | base64 >"$W/gossip.key")
pids=() rpids=()
cleanup() { for p in "${rpids[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for k in 0 1 2 3 4 5 6 7; do
  "$BIN" replica-sim --listen 127.0.0.1:$((P + k)) --max-num-seqs 4 --kv-blocks 2048 --log-level warn >"$W/rep$k.log" 2>&1 &
  pids+=($!)
done
for k in 0 1 2 3 4 5 6 7; do until curl -fsS -o /dev/null --max-time 1 http://127.0.0.1:$((P + k))/health; do sleep 0.1; done; done
for i in 0 1 2 3 4 5 6 7; do
  args=(router --name "router-$i" --region local --listen 127.0.0.1:$((P + 100 + i)) --gossip-bind 127.0.0.1:$((P + 200 + i))
    --admin-listen 127.0.0.1:$((P + 300 + i)) --log-level warn --gossip-key-file "$W/gossip.key" --load-interval "$LI"
    --replica http://127.0.0.1:$((P + i)))
  ((i > 0)) && args+=(--join 127.0.0.1:$((P + 200)))
  "$BIN" "${args[@]}" >"$W/router$i.log" 2>&1 &
  rpids+=($!)
done
for i in 0 1 2 3 4 5 6 7; do
  tries=0
  until (($(curl -s http://127.0.0.1:$((P + 300 + i))/metrics | grep -c '^kvmesh_summary_age_seconds{' || true) >= 7)); do
    ((++tries > 300)) && { echo "router-$i never saw 7 others" >&2; exit 1; }
    sleep 0.2
  done
done
sleep "$SETTLE"
ticks() { local s=0 p f; for p in "${rpids[@]}"; do f=($(sed 's/^.*) //' /proc/$p/stat)); s=$((s + f[11] + f[12])); done; echo $s; }
t0=$(ticks); s0=$(date +%s.%N)
sleep "$MEASURE"
t1=$(ticks); s1=$(date +%s.%N)
sent=0
for i in 0 1 2 3 4 5 6 7; do
  n=$(curl -s http://127.0.0.1:$((P + 300 + i))/metrics | awk '/^kvmesh_load_beacon_entries_total\{outcome="sent"\}/ {print $2}')
  sent=$(awk -v a="$sent" -v b="${n:-0}" 'BEGIN{print a+b}')
done
awk -v t="$((t1 - t0))" -v a="$s0" -v b="$s1" -v s="$sent" 'BEGIN{printf "%.2f %% of a core (%d ticks in %.1f s), beacon entries sent %s\n", t/(b-a), t, b-a, s}'
