#!/usr/bin/env bash
# admission.sh: the router's admission at work, on this machine.
#
# Starts, on 127.0.0.1 only, one simulated vLLM-like replica with 2
# sequence slots and 2 s per request (`kvmesh replica-sim`) and one router
# in front of it; lets the router learn the engine's slots (4 requests, a
# metrics scrape that sees 2 of them waiting); then sends a burst of 30
# low-class requests that may wait 1 s in the router's queue, and, half a
# second later, 3 high-class ones. Prints each answer's status and time,
# then the router's admission counters, and stops what it started.
#
# Typically: 2 low requests served, 28 shed with 503 and Retry-After after
# their 1 s deadline (kvmesh_admission_shed_total{class="low",
# reason="deadline"}), and the 3 high requests served, ahead of every
# queued low one.
#
#   examples/admission.sh
#
# Ports (defaults in brackets): REPLICA_PORT [18411], ROUTER_PORT [18412],
# GOSSIP_PORT [18413], ADMIN_PORT [18414].
set -euo pipefail

REPLICA_PORT=${REPLICA_PORT:-18411}
ROUTER_PORT=${ROUTER_PORT:-18412}
GOSSIP_PORT=${GOSSIP_PORT:-18413}
ADMIN_PORT=${ADMIN_PORT:-18414}
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

(cd "$repo" && go build -o "$dir/kvmesh" ./cmd/kvmesh)
"$dir/kvmesh" replica-sim --listen "127.0.0.1:$REPLICA_PORT" --max-num-seqs 2 \
	--decode-ms-per-token 100 --default-max-tokens 20 --log-level error &
pids+=($!)
"$dir/kvmesh" router --name r1 --listen "127.0.0.1:$ROUTER_PORT" --gossip-bind "127.0.0.1:$GOSSIP_PORT" \
	--admin-listen "127.0.0.1:$ADMIN_PORT" --replica "http://127.0.0.1:$REPLICA_PORT" --log-level error &
pids+=($!)
api="http://127.0.0.1:$ROUTER_PORT"
until curl -sf "$api/readyz" >/dev/null; do sleep 0.2; done

# ask CLASS TEXT [HEADER...]: one chat completion; prints the class, the
# status, Retry-After and the time it took.
ask() {
	local class=$1 text=$2
	shift 2
	curl -s -o /dev/null -D "$dir/h.${text// /_}" -w "$class %{http_code} %{time_total}s\n" "$api/v1/chat/completions" \
		-H "X-Kvmesh-Priority: $class" -H 'Content-Type: application/json' "$@" \
		-d "{\"model\":\"kvmesh-sim\",\"messages\":[{\"role\":\"user\",\"content\":\"$text\"}]}"
}

warm=()
for i in 1 2 3 4; do
	ask low "warm-up $i" >/dev/null &
	warm+=($!)
done
sleep 3 # a scrape or two: the router learns the engine's 2 slots
wait "${warm[@]}"

jobs=()
for i in $(seq 30); do
	ask low "low $i" -H 'X-Kvmesh-Queue-Timeout: 1s' &
	jobs+=($!)
done
sleep 0.5
for i in 1 2 3; do
	ask high "high $i" &
	jobs+=($!)
done
wait "${jobs[@]}"
echo "answers with Retry-After: $(grep -il '^retry-after' "$dir"/h.low_* "$dir"/h.high_* | wc -l)"
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^kvmesh_admission_(admitted|shed)_total' | grep -v ' 0$'
