#!/usr/bin/env bash
# slowclients.sh: what thousands of stalled stream readers make one router
# hold, and whether it lets go of them (docs/RELIABILITY.md "Slow
# clients"). A router in front of an instant replica (`kvmesh bench
# --instant-replica`), everything on 127.0.0.1; `kvmesh bench
# --slow-clients` opens STALLED streaming requests that read nothing (a 4 KB
# receive buffer; READ_RATE bytes/s if set) while 4 normal clients keep
# sending 20-token streams, and samples the router's goroutines, RSS and
# descriptors every second for HOLD.
#
#   internal/bench/slowclients.sh             this tree's router
#   BEFORE_REV=main internal/bench/slowclients.sh
#                                             a revision's router instead
#                                             (before --write-timeout: run
#                                             without it)
#
# Environment: BASE_PORT [19500], STALLED [2000], READ_RATE [0], HOLD [40s],
# WRITE_TIMEOUT [10s], TOKEN_GAP [1ms], JSON [] (1: JSON output).
set -euo pipefail
HOST=127.0.0.1
BASE_PORT=${BASE_PORT:-19500}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
bench_init slowclients.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

bench_build
router_bin=$dir/kvmesh
timeout_flag=(--write-timeout "${WRITE_TIMEOUT:-10s}")
if [[ -n ${BEFORE_REV:-} ]]; then
	router_bin=$dir/kvmesh-before
	"$router_bin" router --help 2>&1 | grep -q -- '-write-timeout' || timeout_flag=()
fi
"$dir/kvmesh" bench --instant-replica "$HOST:$BASE_PORT" --model bench --token-gap "${TOKEN_GAP:-1ms}" 2>"$dir/replica.log" &
pids+=("$!")
"$router_bin" router --name slow --listen "$HOST:$((BASE_PORT + 1))" --gossip-bind "$HOST:$((BASE_PORT + 2))" \
	--admin-listen "$HOST:$((BASE_PORT + 6))" --replica "http://$HOST:$BASE_PORT" --log-level warn \
	--max-inflight-per-client 0 "${timeout_flag[@]}" 2>"$dir/router.log" &
router_pid=$!
pids+=("$router_pid")
wait_ok "http://$HOST:$((BASE_PORT + 1))" || { cat "$dir/router.log" >&2; exit 1; }
echo "router: ${BEFORE_REV:-this tree} ${timeout_flag[*]:-(no write timeout)}; load: $(uptime)" >&2
"$dir/kvmesh" bench --slow-clients "${STALLED:-2000}" --read-rate "${READ_RATE:-0}" --hold "${HOLD:-40s}" \
	--frontend "http://$HOST:$((BASE_PORT + 1))" --admin "http://$HOST:$((BASE_PORT + 6))" --router-pid "$router_pid" \
	--model bench ${JSON:+--json}
echo "router log lines: $(wc -l <"$dir/router.log")" >&2
grep -v '^\s*$' "$dir/router.log" | tail -3 >&2 || true
