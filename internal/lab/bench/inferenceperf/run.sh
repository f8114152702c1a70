#!/usr/bin/env bash
# run.sh: kvmesh against HAProxy round-robin and SGLang Model Gateway on
# kubernetes-sigs' inference-perf (0.7.0, from PyPI), shared_prefix data
# with multi-turn chat on, over 8 fresh `kvmesh replica-sim` replicas per
# run, offline (a byte-level BPE tokenizer trained here on local text).
#
#   internal/lab/bench/inferenceperf/run.sh                 every shape x front
#   FRONTS="kvmesh-1 haproxy-rr" SHAPES=groups16 run.sh     some of them
#
# Shapes (SHAPES):
#   groups16   16 groups x 8 sessions (more sessions per group prompt)
#   groups64   64 groups x 4 sessions (more sessions than a replica holds)
#   Both: 1,500-token group prompts, 200-token questions, 50-token
#   answers, RATE req/s for DURATION s. inference-perf 0.7.0 sends every
#   turn as /v1/completions with the session's text so far (its first
#   prompt, the answer, and the same prompt again).
# Fronts (FRONTS):
#   kvmesh-N     N kvmesh routers joined by seed with a generated gossip
#                key; router i owns replicas k with k mod N == i; with N > 1
#                an HAProxy round-robin spreads the requests over the routers
#   haproxy-rr   HAProxy, balance roundrobin over the replicas
#   smg-1        SGLang Model Gateway (pip: smg), --policy cache_aware
# Replicas: `kvmesh replica-sim --max-num-seqs 4 --kv-blocks 2048` (4
# running sequences, 32,768 cached tokens).
#
# Per run, the share of prompt tokens the replicas reported cached (all
# turns, follow-up turns), TTFT p50/p90/p99 from inference-perf's
# per-request record, and the requests each replica served (from its
# /metrics); one table at the end. Everything stays in OUT: per run the
# inference-perf output, the replicas' and routers' /metrics and, for
# kvmesh, /debug/mesh.
#
# Environment (defaults in brackets):
#   OUT        [a new directory under /tmp]
#   BASE_PORT  [23400]  replicas BASE..BASE+7, fronts BASE+10.., client
#              front BASE+20, gossip BASE+40.., SMG metrics BASE+50,
#              kvmesh admin BASE+60..
#   RATE [4]  DURATION [90]  SEED [42]  NUM_WORKERS [2]
#   KVMESH_BIN [built from this tree]  the kvmesh binary under test
#   IPERF_HOME [$HOME/.cache/kvmesh-iperf]  venvs and the tokenizer
#   TRAIN_TEXT [/work/shared/traces/mtbench_questions.jsonl]  tokenizer text
# Needs: go, curl, haproxy (apt-get install haproxy), python3.12 with venv.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
	exit 0
fi

HOST=127.0.0.1
BASE_PORT=${BASE_PORT:-23400}
RATE=${RATE:-4}
DURATION=${DURATION:-90}
SEED=${SEED:-42}
NUM_WORKERS=${NUM_WORKERS:-2}
IPERF_HOME=${IPERF_HOME:-$HOME/.cache/kvmesh-iperf}
PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python}
TRAIN_TEXT=${TRAIN_TEXT:-/work/shared/traces/mtbench_questions.jsonl}
read -r -a shapes <<<"${SHAPES:-groups16 groups64}"
read -r -a fronts <<<"${FRONTS:-kvmesh-1 kvmesh-4 haproxy-rr smg-1}"
NREP=8

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
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
	HF_HUB_OFFLINE=1 "$venv/bin/python" "$here/tokenizer.py" "$TRAIN_TEXT" "$tok"
fi
smg_venv=$IPERF_HOME/smg-venv
need_smg() {
	if ! "$smg_venv/bin/python" -c 'import smg.cli' 2>/dev/null; then
		echo "installing smg into $smg_venv" >&2
		"$PY" -m venv "$smg_venv"
		"$smg_venv/bin/pip" install -q smg
	fi
}

if [[ -z ${KVMESH_BIN:-} ]]; then
	(cd "$repo" && go build -o "$OUT/kvmesh" ./cmd/kvmesh)
	KVMESH_BIN=$OUT/kvmesh
fi
bin=$KVMESH_BIN
(umask 077 && head -c 32 /dev/urandom | base64 >"$OUT/gossip.key")

pids=()
names=()
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
			echo "run.sh: ${names[i]} exited; last lines of its log:" >&2
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
			echo "run.sh: $url not ready after 60 s (last status $code)" >&2
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
probe='{"model":"kvmesh-sim","prompt":"ready?","max_tokens":1}'

start_replicas() {
	local k p
	for ((k = 0; k < NREP; k++)); do
		p=$((BASE_PORT + k))
		port_free "$p" || { echo "run.sh: port $p is in use (set BASE_PORT)" >&2; return 1; }
		start "replica-$k" "$bin" replica-sim --listen "$HOST:$p" --max-num-seqs 4 --kv-blocks 2048 --log-level warn
	done
	for u in "${rep_urls[@]}"; do wait_ok "$u/health"; done
}

# haproxy_rr PORT URL...: HAProxy round-robin on PORT over the URLs.
haproxy_rr() {
	local port=$1 cfg=$OUT/haproxy-$run.cfg k=0 u
	shift
	command -v haproxy >/dev/null || { echo "run.sh: haproxy not installed (apt-get install haproxy)" >&2; return 1; }
	{
		printf 'global\n  maxconn 4096\ndefaults\n  mode http\n  option http-keep-alive\n  option http-no-delay\n  timeout connect 5s\n  timeout client 10m\n  timeout server 10m\n'
		printf 'frontend openai\n  bind %s:%d\n  default_backend up\nbackend up\n  balance roundrobin\n' "$HOST" "$port"
		for u in "$@"; do printf '  server s%d %s\n' "$k" "${u#http://}"; k=$((k + 1)); done
	} >"$cfg"
	start haproxy haproxy -db -f "$cfg"
}

# kvmesh N: N routers; router i owns replicas k with k mod N == i.
start_kvmesh() {
	local n=$1 i k args
	routers=()
	for ((i = 0; i < n; i++)); do
		args=(router --name "router-$i" --region local --listen "$HOST:$((fe_port + i))"
			--gossip-bind "$HOST:$((mesh_port + i))" --admin-listen "$HOST:$((admin_port + i))"
			--log-level warn --gossip-key-file "$OUT/gossip.key")
		((i > 0)) && args+=(--join "$HOST:$mesh_port")
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

start_smg() {
	need_smg
	start smg "$smg_venv/bin/python" -m smg.cli launch --host "$HOST" --port "$fe_port" --worker-urls "${rep_urls[@]}" \
		--policy cache_aware --prometheus-host "$HOST" --prometheus-port "$((BASE_PORT + 50))" --log-level warn
	target=http://$HOST:$fe_port
	wait_ok "$target/v1/completions" "$probe"
}

# config SHAPE DIR: the inference-perf configuration of one run.
config() {
	local groups sessions
	case $1 in
	groups16) groups=16 sessions=8 ;;
	groups64) groups=64 sessions=4 ;;
	*) echo "run.sh: unknown shape $1" >&2; return 1 ;;
	esac
	cat <<-YAML
		api:
		  type: completion
		  streaming: true
		data:
		  type: shared_prefix
		  shared_prefix:
		    num_groups: $groups
		    num_prompts_per_group: $sessions
		    system_prompt_len: 1500
		    question_len: 200
		    output_len: 50
		    enable_multi_turn_chat: true
		    seed: $SEED
		load:
		  type: constant
		  stages:
		  - rate: $RATE
		    duration: $DURATION
		  num_workers: $NUM_WORKERS
		server:
		  type: vllm
		  model_name: kvmesh-sim
		  base_url: $target
		  ignore_eos: true
		tokenizer:
		  pretrained_model_name_or_path: $tok
		report:
		  request_lifecycle:
		    summary: true
		    per_stage: false
		    per_request: true
		    per_request_fields:
		      request: false
		      response: false
		      response_chunks: false
		storage:
		  local_storage:
		    path: $2
	YAML
}

results=()
status=0
for shape in "${shapes[@]}"; do
	for front in "${fronts[@]}"; do
		run=$shape-$front
		echo "== $run" >&2
		target=
		if ! {
			start_replicas || exit 1
			case $front in
			kvmesh-*) start_kvmesh "${front#kvmesh-}" ;;
			haproxy-rr)
				haproxy_rr "$fe_port" "${rep_urls[@]}"
				target=http://$HOST:$fe_port
				wait_ok "$target/v1/completions" "$probe"
				;;
			smg-1) start_smg ;;
			*) echo "run.sh: unknown front end $front" >&2; false ;;
			esac
		}; then
			echo "run.sh: $run could not be started; skipped" >&2
			status=1
			stop_all
			continue
		fi
		# The readiness probes put a few tokens in some caches: start clean.
		for u in "${rep_urls[@]}"; do curl -s -o /dev/null -X POST "$u/reset_prefix_cache" || true; done
		mkdir -p "$OUT/$run"
		config "$shape" "$OUT/$run/iperf" >"$OUT/$run/config.yaml"
		HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice "$venv/bin/inference-perf" --config_file "$OUT/$run/config.yaml" \
			>"$OUT/logs/$run-iperf.log" 2>&1 || status=1
		mets=()
		for ((k = 0; k < NREP; k++)); do
			curl -s "${rep_urls[k]}/metrics" >"$OUT/$run/replica-$k.metrics" || true
			mets+=("$OUT/$run/replica-$k.metrics")
		done
		if [[ $front == kvmesh-* ]]; then
			for ((i = 0; i < ${front#kvmesh-}; i++)); do
				curl -s "http://$HOST:$((admin_port + i))/metrics" >"$OUT/$run/router-$i.metrics" || true
				curl -s "http://$HOST:$((admin_port + i))/debug/mesh" >"$OUT/$run/router-$i.debug.json" || true
			done
		fi
		if [[ -s $OUT/$run/iperf/per_request_lifecycle_metrics.json ]]; then
			"$PY" "$here/analyze.py" "$run" "$OUT/$run/iperf/per_request_lifecycle_metrics.json" "${mets[@]}" |
				tee "$OUT/$run/result.json"
			results+=("$OUT/$run/result.json")
		else
			echo "run.sh: $run produced no per-request record (see logs/$run-iperf.log)" >&2
			status=1
		fi
		stop_all
	done
done

echo
echo "kvmesh: $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown); results in $OUT"
"$PY" - "${results[@]}" <<-'PY'
	import json, sys
	print(f"{'run':24} {'cached all':>10} {'follow-up':>10} {'TTFT p50':>9} {'p90':>7} {'p99':>7}  requests per replica")
	for p in sys.argv[1:]:
	    r = json.load(open(p))
	    t = r["ttft_ms"]
	    print(f"{r['label']:24} {r['cached_all']!s:>10} {r['cached_followup']!s:>10} {t['p50']!s:>9} {t['p90']!s:>7} {t['p99']!s:>7}  {r['per_replica']}")
PY
exit $status
