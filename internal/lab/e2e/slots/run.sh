#!/usr/bin/env bash
# slots/run.sh: when does a router learn the slots of engines that publish
# none? One router over two replica-sims of 2 slots each (they publish
# running and waiting, not max-num-seqs, as vLLM does); six bursts of 5
# requests 1.3 s apart; after each burst, the router's
# kvmesh_replica_engine_slots per replica (0: unknown). A measurement,
# not a test: it prints and exits 0.
# Env: KVMESH_BIN [built from this tree], PORT_BASE [29600] (uses
# PORT_BASE..PORT_BASE+9 on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
P=${PORT_BASE:-29600}
BIN=${KVMESH_BIN:-}
if [ -z "$BIN" ]; then
	BIN=$(mktemp -d)/kvmesh
	go build -o "$BIN" ./cmd/kvmesh
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
for i in 1 2; do
	"$BIN" replica-sim --listen 127.0.0.1:$((P + i)) --max-num-seqs 2 --decode-ms-per-token 10 >/dev/null 2>&1 &
	pids+=($!)
done
"$BIN" router --name slots --listen 127.0.0.1:$P --admin-listen 127.0.0.1:$((P + 9)) \
	--replica http://127.0.0.1:$((P + 1)) --replica http://127.0.0.1:$((P + 2)) --admit-max-waiting 0 >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 300); do curl -sf http://127.0.0.1:$P/v1/models | grep -q "\"id\"" && break; sleep 0.1; done
model=$(curl -sf http://127.0.0.1:$P/v1/models | python3 -c 'import json,sys;print(json.load(sys.stdin)["data"][0]["id"])')
for b in 1 2 3 4 5 6; do
	reqs=()
	for i in 1 2 3 4 5; do
		curl -s -o /dev/null http://127.0.0.1:$P/v1/completions -H 'Content-Type: application/json' \
			-d "{\"model\":\"$model\",\"prompt\":\"burst $b request $i\",\"max_tokens\":40}" &
		reqs+=($!)
	done
	wait "${reqs[@]}"
	echo "after burst $b: $(curl -s http://127.0.0.1:$((P + 9))/metrics | grep '^kvmesh_replica_engine_slots' | sed 's/.*:\([0-9]*\)"} /port \1: /' | tr '\n' ' ')"
	sleep 1.3
done
