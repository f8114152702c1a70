#!/usr/bin/env bash
# peers.sh: kvmesh and the published peer routers side by side on the
# multi-turn chat workload (issue 7), each front end over its own 4 fresh
# replica-sims.
#
#   examples/peers.sh                 every front end below, one after another
#   examples/peers.sh kvmesh-3 smg-1  only these
#
# Front ends (names as printed):
#   kvmesh-3            3 kvmesh routers in one mesh; router i owns replicas
#                       k with k mod 3 == i; turn t of conversation c goes to
#                       router (c+t) mod 3, so every next turn meets another
#                       router
#   kvmesh-1            one kvmesh router owning the 4 replicas
#   haproxy-roundrobin  HAProxy, balance roundrobin
#   haproxy-leastconn   HAProxy, balance leastconn
#   smg-1               SGLang Model Gateway (pip: smg), --policy cache_aware, one instance
#   smg-3-mesh          3 SMG instances, cache_aware, joined by --enable-mesh
#                       (turns spread over them as for kvmesh-3)
#   sglang-router       sglang-router 0.3.x (pip; SMG's older package), cache_aware, one instance
#   vllm-router         vllm-router (pip), --policy cache_aware
#
# Per front end: 4 fresh `kvmesh replica-sim --max-num-seqs 4 --kv-blocks
# 4096 --prefill-tokens-per-s 10000 --decode-ms-per-token 2`, the front end,
# then `kvmesh bench --conversations 24 --turns 6 --clients 12 --think
# 400ms`; everything is stopped before the next. One table at the end; the
# JSON of each run, the kvmesh routers' decision and prediction metrics
# (<front>-metrics.txt) and the logs stay in OUT.
#
# Environment (defaults in brackets):
#   PEERS_VENV    [$HOME/.cache/kvmesh-peers-venv]  venv for smg and
#                 vllm-router; created with pip if missing
#   BASE_PORT     [19100]  replicas BASE..BASE+3, front ends BASE+10..,
#                 gossip/mesh ports BASE+40.., peers' metrics BASE+50..,
#                 kvmesh admin (metrics) BASE+60..
#   GOSSIP_PROFILE [lan]   kvmesh gossip timings
#   BENCH_ARGS    []       more `kvmesh bench` flags (e.g. "--conversations 8")
#   OUT           [a new directory under /tmp]
#   COMMIT        [git describe of the tree]  label of the kvmesh figures
# Needs: go, curl, haproxy (apt-get install haproxy), python3 with venv.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
	exit 0
fi

HOST=127.0.0.1
BASE_PORT=${BASE_PORT:-19100}
GOSSIP_PROFILE=${GOSSIP_PROFILE:-lan}
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/kvmesh-peers-venv}
read -r -a bench_args <<<"${BENCH_ARGS:-}"
ALL=(kvmesh-3 kvmesh-1 haproxy-roundrobin haproxy-leastconn smg-1 smg-3-mesh sglang-router vllm-router)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-peers.XXXXXX")}
mkdir -p "$OUT/logs"
# The kvmesh routers' shared gossip key, which also authenticates their
# hops (a router with --join refuses to start without one).
(umask 077 && head -c 32 /dev/urandom | base64 >"$OUT/gossip.key")
COMMIT=${COMMIT:-$(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown)}
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVMESH_' || true)

if (($#)); then fronts=("$@"); else fronts=("${ALL[@]}"); fi

pids=()
names=()
stop_all() {
	local i
	# Front ends first (a kvmesh router drains, then leaves), then replicas.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		[[ ${names[i]} == replica-* ]] && continue
		kill -TERM "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	pids=()
	names=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in the background, logging to logs/<front>-NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$OUT/logs/$front-$name.log" 2>&1 &
	pids+=("$!")
	names+=("$name")
}

check_alive() {
	local i
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			echo "peers.sh: ${names[i]} exited; last lines of its log:" >&2
			tail -n 20 "$OUT/logs/$front-${names[i]}.log" >&2
			return 1
		fi
	done
}

# wait_ok URL [BODY]: waits up to 120 s for a 200 (POST BODY if given).
wait_ok() {
	local url=$1 body=${2:-} code tries=0
	while :; do
		if [[ -n $body ]]; then
			code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' -d "$body" "$url" || true)
		else
			code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
		fi
		[[ $code == 200 ]] && return 0
		# (set -e does not hold inside the caller's `if`, so check explicitly.)
		check_alive || return 1
		if ((++tries > 600)); then
			echo "peers.sh: $url not ready after 120 s (last status $code)" >&2
			return 1
		fi
		sleep 0.2
	done
}

port_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# need_peers installs the published peers into PEERS_VENV once. Both smg
# and sglang-router install a console script named `smg` (sglang-router's
# runs its own, older CLI), so SMG is always run as `python -m smg.cli`.
need_peers() {
	if [[ ! -x $PEERS_VENV/bin/sglang-router || ! -x $PEERS_VENV/bin/vllm-router ]] ||
		! "$PEERS_VENV/bin/python" -c 'import smg.cli' 2>/dev/null; then
		echo "installing smg, sglang-router and vllm-router into $PEERS_VENV" >&2
		python3 -m venv "$PEERS_VENV"
		"$PEERS_VENV/bin/pip" install -q smg sglang-router vllm-router
	fi
}

echo "building kvmesh ($COMMIT) into $OUT" >&2
(cd "$repo" && go build -o "$OUT/kvmesh" ./cmd/kvmesh)
bin=$OUT/kvmesh

rep_urls=()
for k in 0 1 2 3; do rep_urls+=("http://$HOST:$((BASE_PORT + k))"); done
fe_port=$((BASE_PORT + 10))
mesh_port=$((BASE_PORT + 40))
probe='{"model":"kvmesh-sim","messages":[{"role":"user","content":"ready?"}],"max_tokens":1}'

start_replicas() {
	local k p
	for k in 0 1 2 3; do
		p=$((BASE_PORT + k))
		port_free "$p" || { echo "peers.sh: port $p is in use (set BASE_PORT)" >&2; return 1; }
		start "replica-$((k + 1))" "$bin" replica-sim --listen "$HOST:$p" --max-num-seqs 4 --kv-blocks 4096 \
			--prefill-tokens-per-s 10000 --decode-ms-per-token 2 --log-level warn
	done
	for u in "${rep_urls[@]}"; do wait_ok "$u/health"; done
}

# kvmesh N: N routers; router i owns replicas k with k mod N == i.
start_kvmesh() {
	local n=$1 i k args
	urls=()
	for ((i = 0; i < n; i++)); do
		args=(router --name "router-$((i + 1))" --region local --listen "$HOST:$((fe_port + i))"
			--gossip-bind "$HOST:$((mesh_port + i))" --admin-listen "$HOST:$((mesh_port + 20 + i))"
			--gossip-profile "$GOSSIP_PROFILE" --log-level warn --gossip-key-file "$OUT/gossip.key")
		((i > 0)) && args+=(--join "$HOST:$mesh_port")
		for ((k = i; k < 4; k += n)); do args+=(--replica "${rep_urls[k]}"); done
		start "router-$((i + 1))" "$bin" "${args[@]}"
		urls+=("http://$HOST:$((fe_port + i))")
	done
	for u in "${urls[@]}"; do wait_ok "$u/readyz"; done
	# Every router sees all 4 replicas before the run.
	for u in "${urls[@]}"; do wait_ok "$u/v1/chat/completions" "$probe"; done
	# A router answers as soon as it owns one replica; give the gossip a
	# few rounds so each sees the others' replicas.
	((n > 1)) && sleep 3
	return 0
}

start_haproxy() {
	local balance=$1 cfg=$OUT/haproxy-$1.cfg k
	command -v haproxy >/dev/null || { echo "peers.sh: haproxy not installed (apt-get install haproxy)" >&2; return 1; }
	{
		printf 'global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 10m\n  timeout server 10m\n'
		printf 'frontend openai\n  bind %s:%d\n  default_backend replicas\nbackend replicas\n  balance %s\n' "$HOST" "$fe_port" "$balance"
		for k in 0 1 2 3; do printf '  server r%d %s:%d\n' "$k" "$HOST" "$((BASE_PORT + k))"; done
	} >"$cfg"
	start haproxy haproxy -db -f "$cfg"
	urls=("http://$HOST:$fe_port")
	wait_ok "${urls[0]}/v1/chat/completions" "$probe"
}

# smg N: N SMG instances with the cache_aware policy over all 4 replicas;
# with N > 1 they form one mesh (--enable-mesh), the later joining the first.
start_smg() {
	local n=$1 i args
	need_peers
	urls=()
	for ((i = 0; i < n; i++)); do
		args=(launch --host "$HOST" --port "$((fe_port + i))" --worker-urls "${rep_urls[@]}"
			--policy cache_aware --prometheus-host "$HOST" --prometheus-port "$((mesh_port + 10 + i))" --log-level warn)
		if ((n > 1)); then
			args+=(--enable-mesh --mesh-server-name "smg-$((i + 1))" --mesh-host "$HOST" --mesh-port "$((mesh_port + i))")
			((i > 0)) && args+=(--mesh-peer-urls "$HOST:$mesh_port")
		fi
		start "smg-$((i + 1))" "$PEERS_VENV/bin/python" -m smg.cli "${args[@]}"
		urls+=("http://$HOST:$((fe_port + i))")
	done
	for u in "${urls[@]}"; do wait_ok "$u/v1/chat/completions" "$probe"; done
	if ((n > 1)); then
		# The mesh is up when the last instance has a connection to each
		# other (its router_mesh_peer_connections gauges); then a few sync
		# rounds.
		local tries=0
		until (($(curl -s "http://$HOST:$((mesh_port + 10 + n - 1))/metrics" |
			grep -c '^router_mesh_peer_connections{peer="smg-[0-9]*"} 1') >= n - 1)); do
			((++tries > 150)) && { echo "peers.sh: the SMG mesh did not form" >&2; return 1; }
			sleep 0.2
		done
		sleep 3
	fi
}

# sglang-router: the older package of the same gateway (0.3.x), one
# instance, cache_aware.
start_sglang_router() {
	need_peers
	start sglang-router "$PEERS_VENV/bin/sglang-router" launch --host "$HOST" --port "$fe_port" --worker-urls "${rep_urls[@]}" \
		--policy cache_aware --prometheus-host "$HOST" --prometheus-port "$((mesh_port + 10))" --log-level warn
	urls=("http://$HOST:$fe_port")
	wait_ok "${urls[0]}/v1/chat/completions" "$probe"
}

start_vllm_router() {
	need_peers
	start vllm-router "$PEERS_VENV/bin/vllm-router" --host "$HOST" --port "$fe_port" --worker-urls "${rep_urls[@]}" \
		--policy cache_aware --prometheus-host "$HOST" --prometheus-port "$((mesh_port + 10))" --log-level warning
	urls=("http://$HOST:$fe_port")
	wait_ok "${urls[0]}/v1/chat/completions" "$probe"
}

status=0
for front in "${fronts[@]}"; do
	echo "== $front" >&2
	if ! {
		start_replicas || exit 1
		case $front in
		kvmesh-3) start_kvmesh 3 ;;
		kvmesh-1) start_kvmesh 1 ;;
		haproxy-roundrobin) start_haproxy roundrobin ;;
		haproxy-leastconn) start_haproxy leastconn ;;
		smg-1) start_smg 1 ;;
		smg-3-mesh) start_smg 3 ;;
		sglang-router) start_sglang_router ;;
		vllm-router) start_vllm_router ;;
		*) echo "peers.sh: unknown front end $front (one of ${ALL[*]})" >&2; false ;;
		esac
	}; then
		echo "peers.sh: $front could not be started; skipped" >&2
		status=1
		stop_all
		continue
	fi
	# The readiness probes put a few tokens in some caches: start clean.
	for u in "${rep_urls[@]}"; do curl -s -o /dev/null -X POST "$u/reset_prefix_cache" || true; done
	"$bin" bench --conversations 24 --turns 6 --clients 12 --think 400ms --model kvmesh-sim \
		--commit "$COMMIT" --group "$front=$(IFS=,; echo "${urls[*]}")" "${bench_args[@]}" --json \
		>"$OUT/$front.json" 2>"$OUT/logs/$front-bench.log" || status=1
	"$bin" bench --table-from "$OUT/$front.json" || true
	if [[ $front == kvmesh-* ]]; then
		# The routers' own account: decisions by reason, predicted against
		# reported cached tokens, forgotten blocks.
		for ((i = 0; i < ${#urls[@]}; i++)); do
			echo "# ${urls[i]} (admin http://$HOST:$((mesh_port + 20 + i)))"
			curl -s "http://$HOST:$((mesh_port + 20 + i))/metrics" | grep -E '^kvmesh_(route_decisions_total|cache_prediction_error_blocks_(sum|count)|forgotten_blocks_total|predicted_cached_tokens_total|reported_cached_tokens_total|prompt_tokens_total|upstream_retries_total)' || true
		done >"$OUT/$front-metrics.txt"
	fi
	stop_all
done

echo
echo "commit $COMMIT; results in $OUT"
"$bin" bench --table-from "$(IFS=,; for f in "${fronts[@]}"; do [[ -s $OUT/$f.json ]] && printf '%s,' "$OUT/$f.json"; done)"
exit $status
