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
#   internal/lab/bench/slowclients.sh             this tree's router
#   BEFORE_REV=main internal/lab/bench/slowclients.sh
#                                             a revision's router instead
#                                             (before --write-timeout: run
#                                             without it)
#
# Environment: BASE_PORT [19500], STALLED [2000], READ_RATE [0], HOLD [40s],
# WRITE_TIMEOUT [10s], TOKEN_GAP [1ms], CLIENT_SEND_BUFFER [] (the router's
# --client-send-buffer; unset: its default), UPSTREAM_RECV_BUFFER [] (its
# --upstream-recv-buffer; unset: its default), JSON [] (1: JSON output).
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
	--max-inflight-per-client 0 ${CLIENT_SEND_BUFFER:+--client-send-buffer "$CLIENT_SEND_BUFFER"} \
	${UPSTREAM_RECV_BUFFER:+--upstream-recv-buffer "$UPSTREAM_RECV_BUFFER"} "${timeout_flag[@]}" 2>"$dir/router.log" &
router_pid=$!
pids+=("$router_pid")
wait_ok "http://$HOST:$((BASE_PORT + 1))" || { cat "$dir/router.log" >&2; exit 1; }
echo "router: ${BEFORE_REV:-this tree} ${timeout_flag[*]:-(no write timeout)}; load: $(uptime)" >&2
# Kernel memory of the router's sockets (ss's skmem, Linux): the send
# queues of its API connections (w: what a stalled reader pins, bounded by
# --client-send-buffer) and the receive queues of its replica connections
# (r: what a stalled stream leaves on the replica's side, bounded by
# --upstream-recv-buffer), sampled every 2 s; the peaks are printed at the end.
skmem_peak=$dir/skmem
echo "0 0 0" >"$skmem_peak"
if command -v ss >/dev/null; then
	(
		while sleep 2; do
			api=$(ss -tmnH state established "( sport = :$((BASE_PORT + 1)) )" 2>/dev/null | grep -o 'skmem:([^)]*)' |
				awk -F'[(,)]' '{for (i = 2; i <= NF; i++) if ($i ~ /^w[0-9]/) w += substr($i, 2); n++} END {print n + 0, w + 0}')
			up=$(ss -tmnH state established "( dport = :$BASE_PORT )" 2>/dev/null | grep -o 'skmem:([^)]*)' |
				awk -F'[(,)]' '{for (i = 2; i <= NF; i++) if ($i ~ /^r[0-9]/) r += substr($i, 2)} END {print r + 0}')
			read -r pn pw pr <"$skmem_peak"
			read -r n w <<<"$api"
			((w > pw)) && pn=$n pw=$w
			((up > pr)) && pr=$up
			echo "$pn $pw $pr" >"$skmem_peak"
		done
	) &
	pids+=("$!")
fi
"$dir/kvmesh" bench --slow-clients "${STALLED:-2000}" --read-rate "${READ_RATE:-0}" --hold "${HOLD:-40s}" \
	--frontend "http://$HOST:$((BASE_PORT + 1))" --admin "http://$HOST:$((BASE_PORT + 6))" --router-pid "$router_pid" \
	--model bench ${JSON:+--json}
read -r pn pw pr <"$skmem_peak"
echo "peak send queues of the router's API sockets: $((pw >> 20)) MB over $pn sockets; peak receive queues of its replica sockets: $((pr >> 20)) MB" >&2
echo "router log lines: $(wc -l <"$dir/router.log")" >&2
grep -v '^\s*$' "$dir/router.log" | tail -3 >&2 || true
