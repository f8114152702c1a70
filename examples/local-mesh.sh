#!/usr/bin/env bash
# local-mesh.sh: a kvmesh mesh on this machine, as separate processes.
#
# Starts, on 127.0.0.1 only, 8 simulated vLLM-like replicas
# (`kvmesh replica-sim`) and 3 kvmesh routers that gossip over a mesh;
# router i fronts replicas j with j mod 3 == i, routers 2 and 3 join
# router 1. Waits until every router's /readyz answers 200, prints the
# URLs and runs until Ctrl-C, then stops everything it started.
#
#   examples/local-mesh.sh            run the mesh until Ctrl-C
#   examples/local-mesh.sh --bench    also measure it against HAProxy
#                                     (round-robin and least-connections),
#                                     print the tables and exit
#
# With --bench, each front end replays the built-in 10-minute slice of the
# Mooncake conversation trace at 20x with every replica's prefix cache
# emptied first (POST /reset_prefix_cache), so each starts cold: kvmesh,
# then haproxy-roundrobin, then haproxy-leastconn. `kvmesh bench` itself
# does not reset caches between groups, hence one bench run per group.
# Reports land in examples/bench-report-<group>.html.
#
# The settings are those of `kvmesh demo`, which runs the same comparison
# in one process: replicas 6x faster than the modelled engine, 256
# running sequences each, and a KV cache sized so that the 8 replicas
# together hold a quarter of the trace's distinct prompt blocks
# (demoKVBlocks: 34850 distinct 512-token blocks x 0.25 x 512 / 16 / 8
# = 34850 engine blocks of 16 tokens each).
#
# Everything is configurable from the environment (defaults in brackets):
#   REPLICA_PORT [8101]   first replica port (replica k on REPLICA_PORT+k-1)
#   ROUTER_PORT  [8081]   first router API port
#   GOSSIP_PORT  [7941]   first router gossip port (TCP and UDP)
#   ADMIN_PORT   [9191]   first router admin port (/metrics, /debug/mesh)
#   RR_PORT      [8091]   HAProxy round-robin port
#   LC_PORT      [8092]   HAProxy least-connections port
#   KV_BLOCKS    [34850]  KV cache of each replica, in 16-token blocks
#   TIME_SCALE   [6]      replica speed-up over the modelled engine
#   MAX_NUM_SEQS [256]    running sequences per replica
#   SPEEDUP      [20]     trace replay speed-up
#   CONCURRENCY  [512]    most requests in flight during a bench
#   REPORT_DIR   [examples/]  where the bench HTML reports go
#   BENCH_ARGS   []       more `kvmesh bench` flags, e.g. "--max-requests 200"
#   KEEP_LOGS    [0]      1: keep the work directory (binary, logs) on exit
# (Script settings avoid the KVMESH_ prefix on purpose: `kvmesh router`
# reads KVMESH_<FLAG> variables, and the script's own must not leak in.)
set -euo pipefail

REPLICAS=8
ROUTERS=3
HOST=127.0.0.1
REPLICA_PORT=${REPLICA_PORT:-8101}
ROUTER_PORT=${ROUTER_PORT:-8081}
GOSSIP_PORT=${GOSSIP_PORT:-7941}
ADMIN_PORT=${ADMIN_PORT:-9191}
RR_PORT=${RR_PORT:-8091}
LC_PORT=${LC_PORT:-8092}
KV_BLOCKS=${KV_BLOCKS:-34850}
TIME_SCALE=${TIME_SCALE:-6}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
SPEEDUP=${SPEEDUP:-20}
CONCURRENCY=${CONCURRENCY:-512}
KEEP_LOGS=${KEEP_LOGS:-0}
read -r -a bench_args <<<"${BENCH_ARGS:-}"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

bench=0
for arg in "$@"; do
	case $arg in
	--bench) bench=1 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "local-mesh.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
	esac
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
REPORT_DIR=${REPORT_DIR:-$here}

# Every variable a child could read as a flag is cleared, so a stray
# KVMESH_JOIN (say) in the caller's shell cannot change this mesh.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVMESH_' || true)

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-local-mesh.XXXXXX")
mkdir -p "$dir/logs"
# The routers' shared gossip key: it also authenticates the requests they
# forward to each other (a router with --join refuses to start without one).
(umask 077 && head -c 32 /dev/urandom | base64 >"$dir/gossip.key")
pids=()
names=()

cleanup() {
	local status=$?
	trap - EXIT INT TERM
	if ((${#pids[@]})); then
		echo "stopping ${#pids[@]} processes" >&2
		# Routers first, all at once: on SIGTERM each leaves the mesh (a
		# leave no peer is left to hear is no error) and drains its
		# in-flight requests, while the replicas still serve them.
		local i
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			[[ ${names[i]} == router-* ]] || continue
			kill -TERM "${pids[i]}" 2>/dev/null || true
		done
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			[[ ${names[i]} == router-* ]] || continue
			wait "${pids[i]}" 2>/dev/null || true
		done
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			kill -TERM "${pids[i]}" 2>/dev/null || true
		done
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			wait "${pids[i]}" 2>/dev/null || true
		done
	fi
	if [[ $KEEP_LOGS == 1 || ($status -ne 0 && $interrupted == 0) ]]; then
		echo "logs kept in $dir/logs" >&2
	else
		rm -rf "$dir"
	fi
	exit "$status"
}
interrupted=0
trap cleanup EXIT
trap 'interrupted=1; exit 130' INT
trap 'interrupted=1; exit 143' TERM

# start NAME CMD...: runs CMD in the background, logging to logs/NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$dir/logs/$name.log" 2>&1 &
	pids+=("$!")
	names+=("$name")
}

# check_alive: fails if any child has exited (a port in use, a bad flag).
check_alive() {
	local i
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			echo "local-mesh.sh: ${names[i]} exited; last lines of its log:" >&2
			tail -n 20 "$dir/logs/${names[i]}.log" >&2
			return 1
		fi
	done
}

# wait_http URL: waits up to 30 s for URL to answer 200.
wait_http() {
	local url=$1 code tries=0
	while :; do
		code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
		[[ $code == 200 ]] && return 0
		check_alive
		if ((++tries > 300)); then
			echo "local-mesh.sh: $url not ready after 30 s (last status $code)" >&2
			return 1
		fi
		sleep 0.1
	done
}

port_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

echo "building kvmesh" >&2
(cd "$repo" && go build -o "$dir/kvmesh" ./cmd/kvmesh)
bin=$dir/kvmesh

replica_urls=()
for ((k = 0; k < REPLICAS; k++)); do
	replica_urls+=("http://$HOST:$((REPLICA_PORT + k))")
done
router_urls=()
admin_urls=()
for ((i = 0; i < ROUTERS; i++)); do
	router_urls+=("http://$HOST:$((ROUTER_PORT + i))")
	admin_urls+=("http://$HOST:$((ADMIN_PORT + i))")
done

for ((k = 0; k < REPLICAS; k++)); do
	p=$((REPLICA_PORT + k))
	port_free "$p" || { echo "local-mesh.sh: port $p is in use (set REPLICA_PORT)" >&2; exit 1; }
	start "replica-$((k + 1))" "$bin" replica-sim --listen "$HOST:$p" \
		--time-scale "$TIME_SCALE" --kv-blocks "$KV_BLOCKS" --max-num-seqs "$MAX_NUM_SEQS" --log-level warn
done
for u in "${replica_urls[@]}"; do wait_http "$u/health"; done

seed=$HOST:$GOSSIP_PORT
for ((i = 0; i < ROUTERS; i++)); do
	p=$((ROUTER_PORT + i))
	port_free "$p" || { echo "local-mesh.sh: port $p is in use (set ROUTER_PORT)" >&2; exit 1; }
	args=(router --name "router-$((i + 1))" --region local
		--listen "$HOST:$p" --gossip-bind "$HOST:$((GOSSIP_PORT + i))" --admin-listen "$HOST:$((ADMIN_PORT + i))"
		--gossip-profile test --health-interval 500ms --log-level warn --gossip-key-file "$dir/gossip.key")
	if ((i > 0)); then args+=(--join "$seed"); fi
	for ((k = i; k < REPLICAS; k += ROUTERS)); do
		args+=(--replica "${replica_urls[k]}")
	done
	start "router-$((i + 1))" "$bin" "${args[@]}"
done
for u in "${router_urls[@]}"; do wait_http "$u/readyz"; done

echo
echo "kvmesh local mesh is up (work directory $dir)"
for ((i = 0; i < ROUTERS; i++)); do
	echo "  router-$((i + 1))   ${router_urls[i]}   (gossip $HOST:$((GOSSIP_PORT + i)))"
done
for ((k = 0; k < REPLICAS; k++)); do
	echo "  replica-$((k + 1))  ${replica_urls[k]}   (owned by router-$((k % ROUTERS + 1)))"
done
echo "try: curl -s ${router_urls[0]}/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "       -d '{\"model\":\"kvmesh-sim\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8}'"
echo "     curl -s ${admin_urls[0]}/debug/mesh ; curl -s ${admin_urls[0]}/metrics | grep ^kvmesh_"
echo

if ((!bench)); then
	echo "Ctrl-C stops the mesh"
	# wait -n returns when a child exits (then the mesh is broken: say so
	# and stop) or when a signal's trap runs.
	wait -n "${pids[@]}" || true
	check_alive
	exit 0
fi

# --- bench -----------------------------------------------------------------

groups=("kvmesh=$(IFS=,; echo "${router_urls[*]}")")
if command -v haproxy >/dev/null; then
	lb_env=()
	for ((k = 0; k < REPLICAS; k++)); do
		lb_env+=("REPLICA_$((k + 1))=$HOST:$((REPLICA_PORT + k))")
	done
	for lb in roundrobin:$RR_PORT leastconn:$LC_PORT; do
		policy=${lb%%:*} p=${lb##*:}
		port_free "$p" || { echo "local-mesh.sh: port $p is in use (set RR_PORT / LC_PORT)" >&2; exit 1; }
		cfg=$here/haproxy/haproxy-$policy.cfg
		env "${lb_env[@]}" LB_BIND="$HOST:$p" haproxy -c -q -f "$cfg"
		start "haproxy-$policy" env "${lb_env[@]}" LB_BIND="$HOST:$p" haproxy -db -f "$cfg"
		wait_http "http://$HOST:$p/v1/models"
		groups+=("haproxy-$policy=http://$HOST:$p")
		echo "  haproxy-$policy  http://$HOST:$p" >&2
	done
else
	echo "haproxy is not installed: benching kvmesh alone (apt-get install haproxy for the baselines)" >&2
fi

reset_caches() {
	local u
	for u in "${replica_urls[@]}"; do
		curl -fsS -o /dev/null --max-time 10 -X POST "$u/reset_prefix_cache"
	done
}

mkdir -p "$REPORT_DIR"
for g in "${groups[@]}"; do
	name=${g%%=*}
	reset_caches
	echo "== $name: replaying the trace at ${SPEEDUP}x (replica caches emptied)" >&2
	"$bin" bench --group "$g" --speedup "$SPEEDUP" --concurrency "$CONCURRENCY" ${bench_args[@]+"${bench_args[@]}"} \
		--report "$REPORT_DIR/bench-report-$name.html" | tee "$dir/table-$name.txt" >&2
	if [[ $name == kvmesh ]]; then
		# What each router decided, from its own metrics (as the demo prints).
		for ((i = 0; i < ROUTERS; i++)); do
			printf 'router-%d decisions:' "$((i + 1))" >"$dir/decisions-$i.txt"
			curl -fsS "${admin_urls[i]}/metrics" |
				awk '/^kvmesh_route_decisions_total\{/ && $2 > 0 { match($1, /"[^"]*"/); printf " %s=%d", substr($1, RSTART+1, RLENGTH-2), $2 }' >>"$dir/decisions-$i.txt"
			echo >>"$dir/decisions-$i.txt"
		done
	fi
	check_alive
done

# One table of all groups: the data rows of every run, aligned afresh.
echo
echo "local mesh: the Mooncake conversation slice at ${SPEEDUP}x through each front end, caches emptied in between"
echo "($REPLICAS replica-sim processes at ${TIME_SCALE}x, $KV_BLOCKS KV blocks each; TTFT in wall-clock ms)"
echo
{
	printf '%-20s %6s %6s %9s %11s %8s %8s %8s %11s %9s %6s %6s\n' name ok errors "hit ratio" "TTFT p50 ms" "p90 ms" "p99 ms" "mean ms" "goodput rps" "out tok/s" queued "wall s"
	for g in "${groups[@]}"; do
		awk 'NR > 1 && NF == 12 { printf "%-20s %6s %6s %9s %11s %8s %8s %8s %11s %9s %6s %6s\n", $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12; next }
		     NR > 1 { print }' "$dir/table-${g%%=*}.txt"
	done
	cat "$dir"/decisions-*.txt 2>/dev/null || true
}
echo
echo "reports: $(for g in "${groups[@]}"; do printf '%s ' "$REPORT_DIR/bench-report-${g%%=*}.html"; done)"
