#!/usr/bin/env bash
# sim.sh: the router's cache prediction error with and without KV events,
# on two replica-sims with small caches that publish vLLM-format KV events
# (kvmesh replica-sim --kv-events), under the conversation benchmark.
# For each mode (off, on) it starts fresh replicas and one router (with
# --kv-events auto for "on"), runs kvmesh bench --conversations, and
# prints each mode's check.py report (cached tokens, the router's
# kvmesh_cache_prediction_error_blocks: predicted minus engine-reported
# cached blocks per answer, the event counters), then both side by side
# (check.py events: error p50/p95, engine-reported cached share).
# Env: KV_BLOCKS [250] (16-token blocks per replica), CONV [24], TURNS [6],
# CLIENTS [8], TIME_SCALE [20], PORT_BASE [23100], KVMESH_BIN, MODES
# ["off on"], KEEP (a directory to copy the logs and metrics to).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-kvevents.XXXXXX")
P=${PORT_BASE:-23100}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] && cp -r "$work" "$KEEP"; rm -rf "$work"
}
trap cleanup EXIT
B=$work/kvmesh
if [ -n "${KVMESH_BIN:-}" ]; then cp "$KVMESH_BIN" "$B"; else (cd "$repo" && go build -o "$B" ./cmd/kvmesh); fi
run() { # run MODE
  local mode=$1 i kv=()
  pids=()
  for i in 0 1; do
    "$B" replica-sim --listen "127.0.0.1:$((P + i))" --kv-blocks "${KV_BLOCKS:-250}" --block-size 16 --time-scale "${TIME_SCALE:-20}" \
      --kv-events "tcp://127.0.0.1:$((P + 10 + i))" --kv-events-replay "tcp://127.0.0.1:$((P + 20 + i))" --log-level warn >"$work/sim$i.log" 2>&1 &
    pids+=($!)
  done
  if [ "$mode" = on ]; then kv=(--kv-events auto); fi
  "$B" router --name r0 --region local --listen "127.0.0.1:$((P + 30))" --gossip-bind "127.0.0.1:$((P + 31))" \
    --admin-listen "127.0.0.1:$((P + 32))" --replica "http://127.0.0.1:$P" --replica "http://127.0.0.1:$((P + 1))" \
    --health-interval 200ms --gossip-profile test --log-level warn "${kv[@]}" >"$work/router.log" 2>&1 &
  pids+=($!)
  # Both replicas healthy before the first request: a conversation's first
  # turn sent while only one is admitted caches the shared system prompt
  # there alone, and every later conversation follows it (one replica
  # serves all, whatever the mode).
  for i in $(seq 300); do
    n=$(curl -fsS "http://127.0.0.1:$((P + 32))/debug/mesh" 2>/dev/null |
      python3 -c 'import json, sys; print(sum(1 for r in json.load(sys.stdin).get("replicas") or [] if r.get("healthy")))' 2>/dev/null) || n=0
    [ "$n" = 2 ] && break
    sleep 0.1
  done
  [ "$n" = 2 ] || { echo "sim.sh: the router did not see both replicas healthy" >&2; exit 1; }
  "$B" bench --conversations "${CONV:-24}" --turns "${TURNS:-6}" --clients "${CLIENTS:-8}" --answer-tokens 48 --think 50ms \
    --model kvmesh-sim --group "$mode=http://127.0.0.1:$((P + 30))" --json >"$work/bench-$mode.json" 2>"$work/bench-$mode.log"
  curl -fsS "http://127.0.0.1:$((P + 32))/metrics" >"$work/metrics-$mode.txt"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  python3 "$here/../vllm/check.py" report "$work/metrics-$mode.txt" | sed "s/^/$mode: /"
}
for m in ${MODES:-off on}; do run "$m"; done
if [ -e "$work/metrics-off.txt" ] && [ -e "$work/metrics-on.txt" ]; then
  python3 "$here/../vllm/check.py" events "$work/metrics-off.txt" "$work/metrics-on.txt"
fi
