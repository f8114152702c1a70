# lib.sh: what run.sh and datatypes.sh share, sourced by both: the venvs
# and the tokenizer, the kvmesh binary, starting and stopping replicas
# and front ends, and reading their metrics after a run.
#
# The caller sets `run` (the run's name, for the log files) before it
# starts anything; start_replicas, start_front and collect use the
# globals below.
#
# Replicas (REPLICAS):
#   sim        NREP `kvmesh replica-sim --max-num-seqs SLOTS --kv-blocks 2048`
#              (4 running sequences, 32,768 cached tokens each)
#   llamacpp   NREP llama-server replicas (internal/lab/e2e/llamacpp:
#              Gemma 3 270M on CPU, its install.sh builds them), SLOTS
#              slots of CTX/SLOTS tokens each, one thread each, with
#              LLAMA_ARGS [--swa-full]: Gemma 3's sliding-window KV cache
#              otherwise reuses no prefix that a new prompt shares with a
#              different continuation (a group prompt: 0 tokens cached),
#              only a cached sequence the new prompt extends
# Front ends (start_front NAME):
#   kvmesh-N     N kvmesh routers joined by seed with a generated gossip
#                key; router i owns replicas k with k mod N == i; with N > 1
#                an HAProxy round-robin spreads the requests over them
#   smg-N        N SGLang Model Gateway instances (pip: smg), --policy
#                cache_aware over every replica; with N > 1 joined by
#                --enable-mesh behind an HAProxy round-robin
#   haproxy-rr   HAProxy, balance roundrobin over the replicas

HOST=127.0.0.1
BASE_PORT=${BASE_PORT:-23400}
IPERF_HOME=${IPERF_HOME:-$HOME/.cache/kvmesh-iperf}
PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python}
TRAIN_TEXT=${TRAIN_TEXT:-/work/shared/traces/mtbench_questions.jsonl}
ROUTER_LOG=${ROUTER_LOG:-warn}
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"
REPLICAS=${REPLICAS:-sim}
NREP=${NREP:-8}
SLOTS=${SLOTS:-4}
CTX=${CTX:-16384}
LLAMA_ARGS=${LLAMA_ARGS---swa-full}
case $REPLICAS in
sim) MODEL_NAME=kvmesh-sim ;;
llamacpp) MODEL_NAME=gemma3-270m ;;
*)
	echo "inferenceperf: unknown REPLICAS $REPLICAS (sim or llamacpp)" >&2
	exit 2
	;;
esac

lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$lib/../../../.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-iperf.XXXXXX")}
mkdir -p "$OUT/logs"
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVMESH_' | grep -v '^KVMESH_BIN$' || true)

# The venvs: inference-perf with tokenizers, and SMG apart (their pins
# need not agree).
venv=$IPERF_HOME/venv
if [[ ! -x $venv/bin/inference-perf ]]; then
	echo "installing inference-perf 0.7.0 into $venv" >&2
	"$PY" -m venv "$venv"
	"$venv/bin/pip" install -q inference-perf==0.7.0 tokenizers
fi
tok=$IPERF_HOME/tokenizer
if [[ ! -s $tok/tokenizer.json ]]; then
	HF_HUB_OFFLINE=1 "$venv/bin/python" "$lib/tokenizer.py" "$TRAIN_TEXT" "$tok"
fi
smg_venv=$IPERF_HOME/smg-venv
need_smg() {
	if ! "$smg_venv/bin/python" -c 'import smg.cli' 2>/dev/null; then
		echo "installing smg into $smg_venv" >&2
		"$PY" -m venv "$smg_venv"
		"$smg_venv/bin/pip" install -q smg
	fi
}
llama=$repo/internal/lab/e2e/llamacpp
if [[ $REPLICAS == llamacpp ]]; then
	"$llama/install.sh"
fi

if [[ -z ${KVMESH_BIN:-} ]]; then
	(cd "$repo" && go build -o "$OUT/kvmesh" ./cmd/kvmesh)
	KVMESH_BIN=$OUT/kvmesh
fi
bin=$KVMESH_BIN
(umask 077 && head -c 32 /dev/urandom | base64 >"$OUT/gossip.key")

pids=()
names=()
llama_pidfile=
stop_all() {
	local i
	# Front ends first (a kvmesh router drains, then leaves), then replicas.
	for pass in front replica; do
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			[[ $pass == front && ${names[i]} == replica-* ]] && continue
			kill -TERM "${pids[i]}" 2>/dev/null || true
			wait "${pids[i]}" 2>/dev/null || true
		done
	done
	if [[ -n $llama_pidfile && -e $llama_pidfile ]]; then
		"$llama/stop.sh" "$llama_pidfile" >/dev/null 2>&1 || true
	fi
	llama_pidfile=
	pids=()
	names=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD niced in the background, logging to logs/<run>-NAME.log.
start() {
	local name=$1
	shift
	nice "$@" >"$OUT/logs/$run-$name.log" 2>&1 &
	pids+=("$!")
	names+=("$name")
}

check_alive() {
	local i
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			echo "inferenceperf: ${names[i]} exited; last lines of its log:" >&2
			tail -n 20 "$OUT/logs/$run-${names[i]}.log" >&2
			return 1
		fi
	done
}

# wait_ok URL [BODY]: waits up to 60 s for a 200 (POST BODY if given).
wait_ok() {
	local url=$1 body=${2:-} code tries=0
	while :; do
		if [[ -n $body ]]; then
			code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' -d "$body" "$url" || true)
		else
			code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
		fi
		[[ $code == 200 ]] && return 0
		check_alive || return 1
		if ((++tries > 300)); then
			echo "inferenceperf: $url not ready after 60 s (last status $code)" >&2
			return 1
		fi
		sleep 0.2
	done
}

port_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

rep_urls=()
for ((k = 0; k < NREP; k++)); do rep_urls+=("http://$HOST:$((BASE_PORT + k))"); done
fe_port=$((BASE_PORT + 10))
client_port=$((BASE_PORT + 20))
mesh_port=$((BASE_PORT + 40))
admin_port=$((BASE_PORT + 60))
smg_metrics_port=$((BASE_PORT + 50))
probe="{\"model\":\"$MODEL_NAME\",\"prompt\":\"ready?\",\"max_tokens\":1}"

# start_replicas: NREP fresh replicas (empty caches) on BASE_PORT...
start_replicas() {
	local k p
	for ((k = 0; k < NREP; k++)); do
		p=$((BASE_PORT + k))
		port_free "$p" || { echo "inferenceperf: port $p is in use (set BASE_PORT)" >&2; return 1; }
	done
	if [[ $REPLICAS == llamacpp ]]; then
		llama_pidfile=$OUT/llama-$run.pids
		mkdir -p "$OUT/logs/$run"
		PIDFILE=$llama_pidfile LOGDIR=$OUT/logs/$run SLOTS=$SLOTS CTX=$CTX EXTRA_ARGS=$LLAMA_ARGS \
			nice "$llama/start.sh" "$NREP" "$BASE_PORT" >/dev/null
		return
	fi
	for ((k = 0; k < NREP; k++)); do
		start "replica-$k" "$bin" replica-sim --listen "$HOST:$((BASE_PORT + k))" --max-num-seqs "$SLOTS" \
			--kv-blocks 2048 --log-level warn
	done
	for u in "${rep_urls[@]}"; do wait_ok "$u/health"; done
}

# clear_caches: a replica-sim's probes' blocks out (a llama-server
# replica is fresh and the probes' few tokens stay).
clear_caches() {
	[[ $REPLICAS == sim ]] || return 0
	for u in "${rep_urls[@]}"; do curl -s -o /dev/null -X POST "$u/reset_prefix_cache" || true; done
}

# haproxy_rr PORT URL...: HAProxy round-robin on PORT over the URLs.
haproxy_rr() {
	local port=$1 cfg=$OUT/haproxy-$run.cfg k=0 u
	shift
	command -v haproxy >/dev/null || { echo "inferenceperf: haproxy not installed (apt-get install haproxy)" >&2; return 1; }
	{
		printf 'global\n  maxconn 4096\ndefaults\n  mode http\n  option http-keep-alive\n  option http-no-delay\n  timeout connect 5s\n  timeout client 10m\n  timeout server 10m\n'
		printf 'frontend openai\n  bind %s:%d\n  default_backend up\nbackend up\n  balance roundrobin\n' "$HOST" "$port"
		for u in "$@"; do printf '  server s%d %s\n' "$k" "${u#http://}"; k=$((k + 1)); done
	} >"$cfg"
	start haproxy haproxy -db -f "$cfg"
}

# start_kvmesh N: N routers; router i owns replicas k with k mod N == i.
start_kvmesh() {
	local n=$1 i k args
	routers=()
	for ((i = 0; i < n; i++)); do
		args=(router --name "router-$i" --region local --listen "$HOST:$((fe_port + i))"
			--gossip-bind "$HOST:$((mesh_port + i))" --admin-listen "$HOST:$((admin_port + i))"
			--log-level "$ROUTER_LOG" --gossip-key-file "$OUT/gossip.key")
		((i > 0)) && args+=(--join "$HOST:$mesh_port")
		args+=("${router_flags[@]}")
		for ((k = i; k < NREP; k += n)); do args+=(--replica "${rep_urls[k]}"); done
		start "router-$i" "$bin" "${args[@]}"
		routers+=("http://$HOST:$((fe_port + i))")
	done
	for u in "${routers[@]}"; do wait_ok "$u/readyz"; done
	for u in "${routers[@]}"; do wait_ok "$u/v1/completions" "$probe"; done
	if ((n > 1)); then
		# Every router sees every replica before the run.
		# (A router's summary ages are of the replicas it does not own.)
		local tries=0 others
		for ((i = 0; i < n; i++)); do
			others=$((NREP - (NREP - i + n - 1) / n))
			until (($(curl -s "http://$HOST:$((admin_port + i))/metrics" | grep -c '^kvmesh_summary_age_seconds{' || true) >= others)); do
				((++tries > 150)) && break
				sleep 0.2
			done
		done
		sleep 3
		haproxy_rr "$client_port" "${routers[@]}"
		target=http://$HOST:$client_port
		wait_ok "$target/v1/completions" "$probe"
	else
		target=${routers[0]}
	fi
}

# start_smg N: N SMG instances, cache_aware over every replica; with
# N > 1 one mesh (--enable-mesh, the later joining the first) behind an
# HAProxy round-robin, as kvmesh-N.
start_smg() {
	local n=$1 i args tries=0
	need_smg
	routers=()
	for ((i = 0; i < n; i++)); do
		args=(launch --host "$HOST" --port "$((fe_port + i))" --worker-urls "${rep_urls[@]}"
			--policy cache_aware --prometheus-host "$HOST" --prometheus-port "$((smg_metrics_port + i))" --log-level warn)
		if ((n > 1)); then
			args+=(--enable-mesh --mesh-server-name "smg-$i" --mesh-host "$HOST" --mesh-port "$((mesh_port + i))")
			((i > 0)) && args+=(--mesh-peer-urls "$HOST:$mesh_port")
		fi
		start "smg-$i" "$smg_venv/bin/python" -m smg.cli "${args[@]}"
		routers+=("http://$HOST:$((fe_port + i))")
	done
	for u in "${routers[@]}"; do wait_ok "$u/v1/completions" "$probe"; done
	if ((n > 1)); then
		# The mesh is up when the last instance has a connection to each
		# other (its router_mesh_peer_connections gauges); then a few
		# sync rounds.
		until (($(curl -s "http://$HOST:$((smg_metrics_port + n - 1))/metrics" |
			grep -c '^router_mesh_peer_connections{peer="smg-[0-9]*"} 1' || true) >= n - 1)); do
			((++tries > 150)) && { echo "inferenceperf: the SMG mesh did not form" >&2; return 1; }
			sleep 0.2
		done
		sleep 3
		haproxy_rr "$client_port" "${routers[@]}"
		target=http://$HOST:$client_port
		wait_ok "$target/v1/completions" "$probe"
	else
		target=${routers[0]}
	fi
}

# start_front NAME: starts the front end NAME and sets target, its URL.
start_front() {
	target=
	case $1 in
	kvmesh-*) start_kvmesh "${1#kvmesh-}" ;;
	smg-*) start_smg "${1#smg-}" ;;
	haproxy-rr)
		haproxy_rr "$fe_port" "${rep_urls[@]}"
		target=http://$HOST:$fe_port
		wait_ok "$target/v1/completions" "$probe"
		;;
	*)
		echo "inferenceperf: unknown front end $1" >&2
		return 1
		;;
	esac
}

# collect FRONT DIR: the replicas' /metrics into DIR (their paths in
# mets), and the front end's: each kvmesh router's /metrics and
# /debug/mesh, each SMG instance's /metrics.
collect() {
	local front=$1 dir=$2 i k
	mets=()
	for ((k = 0; k < NREP; k++)); do
		curl -s "${rep_urls[k]}/metrics" >"$dir/replica-$k.metrics" || true
		mets+=("$dir/replica-$k.metrics")
	done
	case $front in
	kvmesh-*)
		for ((i = 0; i < ${front#kvmesh-}; i++)); do
			curl -s "http://$HOST:$((admin_port + i))/metrics" >"$dir/router-$i.metrics" || true
			curl -s "http://$HOST:$((admin_port + i))/debug/mesh" >"$dir/router-$i.debug.json" || true
		done
		;;
	smg-*)
		for ((i = 0; i < ${front#smg-}; i++)); do
			curl -s "http://$HOST:$((smg_metrics_port + i))/metrics" >"$dir/smg-$i.metrics" || true
		done
		;;
	esac
}

# table RESULT...: one line per run's result.json.
table() {
	"$PY" - "$@" <<-'PY'
		import json, sys
		print(f"{'run':28} {'reqs':>5} {'fail':>4} {'cached all':>10} {'follow-up':>10} {'TTFT p50':>9} {'p90':>7} {'p99':>7}  requests per replica")
		for p in sys.argv[1:]:
		    r = json.load(open(p))
		    t = r["ttft_ms"]
		    print(f"{r['label']:28} {r['requests']:>5} {r['failed']:>4} {r['cached_all']!s:>10} {r['cached_followup']!s:>10} {t['p50']!s:>9} {t['p90']!s:>7} {t['p99']!s:>7}  {r['per_replica']}")
	PY
}
