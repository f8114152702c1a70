#!/usr/bin/env bash
# run.sh: kvmesh against HAProxy round-robin and SGLang Model Gateway on
# kubernetes-sigs' inference-perf (0.7.0, from PyPI), shared_prefix data
# with multi-turn chat on, over fresh replicas per run (8 `kvmesh
# replica-sim` by default, or real llama.cpp ones), offline (a byte-level
# BPE tokenizer trained here on local text).
#
#   internal/lab/bench/inferenceperf/run.sh                 every shape x front
#   FRONTS="kvmesh-1 haproxy-rr" SHAPES=groups16 run.sh     some of them
#
# Shapes (SHAPES):
#   groups16   16 groups x 8 sessions (more sessions per group prompt)
#   groups64   64 groups x 4 sessions (more sessions than a replica holds)
#   gGxS       G groups x S sessions (e.g. g4x4)
#   All: SYSTEM_LEN-token group prompts, QUESTION_LEN-token questions,
#   OUTPUT_LEN-token answers, RATE req/s for DURATION s. inference-perf
#   0.7.0 sends every turn as /v1/completions with the session's text so
#   far (its first prompt, the answer, and the same prompt again).
# Fronts (FRONTS): kvmesh-N, smg-N, haproxy-rr (lib.sh).
# Replicas (REPLICAS): sim [default] or llamacpp (lib.sh).
#
# Per run, the share of prompt tokens the replicas reported cached (all
# turns, follow-up turns), TTFT p50/p90/p99 from inference-perf's
# per-request record, and the requests each replica served (from its
# /metrics, less the readiness probes'); one table at the end.
# Everything stays in OUT: per run the inference-perf output, the
# replicas' and front ends' /metrics and, for kvmesh, /debug/mesh.
#
# Environment (defaults in brackets):
#   OUT        [a new directory under /tmp]
#   BASE_PORT  [23400]  replicas BASE..BASE+NREP-1, fronts BASE+10..,
#              client front BASE+20, gossip BASE+40.., SMG metrics
#              BASE+50.., kvmesh admin BASE+60..
#   RATE [4]  DURATION [90]  SEED [42]  NUM_WORKERS [2]
#   SYSTEM_LEN [1500]  QUESTION_LEN [200]  OUTPUT_LEN [50]
#   REPLICAS [sim]  NREP [8]  SLOTS [4]  CTX [16384] (llamacpp: per replica)
#   LLAMA_ARGS [--swa-full]  more llama-server flags (lib.sh)
#   ROUTER_LOG [warn]  kvmesh routers' log level (debug logs each decision)
#   ROUTER_FLAGS []  more flags for every kvmesh router (llama.cpp on a
#              loaded machine: --upstream-idle-timeout 10m, HAProxy's
#              timeout here, as a queued prefill sends nothing for a minute)
#   KVMESH_BIN [built from this tree]  the kvmesh binary under test
#   IPERF_HOME [$HOME/.cache/kvmesh-iperf]  venvs and the tokenizer
#   TRAIN_TEXT [/work/shared/traces/mtbench_questions.jsonl]  tokenizer text
# Needs: go, curl, haproxy (apt-get install haproxy), python3.12 with venv.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
	exit 0
fi

RATE=${RATE:-4}
DURATION=${DURATION:-90}
SEED=${SEED:-42}
NUM_WORKERS=${NUM_WORKERS:-2}
SYSTEM_LEN=${SYSTEM_LEN:-1500}
QUESTION_LEN=${QUESTION_LEN:-200}
OUTPUT_LEN=${OUTPUT_LEN:-50}
read -r -a shapes <<<"${SHAPES:-groups16 groups64}"
read -r -a fronts <<<"${FRONTS:-kvmesh-1 kvmesh-4 kvmesh-8 smg-1 smg-4 haproxy-rr}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

# config SHAPE DIR: the inference-perf configuration of one run.
config() {
	local groups sessions
	case $1 in
	groups16) groups=16 sessions=8 ;;
	groups64) groups=64 sessions=4 ;;
	g[0-9]*x[0-9]*)
		groups=${1#g} sessions=${1#*x}
		groups=${groups%x*}
		;;
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
		    system_prompt_len: $SYSTEM_LEN
		    question_len: $QUESTION_LEN
		    output_len: $OUTPUT_LEN
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
		  model_name: $MODEL_NAME
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
		if ! { start_replicas && start_front "$front"; }; then
			echo "run.sh: $run could not be started; skipped" >&2
			status=1
			stop_all
			continue
		fi
		# The readiness probes put a few tokens in some caches: start clean.
		clear_caches
		mkdir -p "$OUT/$run"
		# The replicas' counts so far (the probes'), which analyze.py takes
		# off the requests each served.
		for ((k = 0; k < NREP; k++)); do
			curl -s "${rep_urls[k]}/metrics" >"$OUT/$run/replica-$k.before.metrics" || true
		done
		config "$shape" "$OUT/$run/iperf" >"$OUT/$run/config.yaml"
		HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice "$venv/bin/inference-perf" --config_file "$OUT/$run/config.yaml" \
			>"$OUT/logs/$run-iperf.log" 2>&1 || status=1
		collect "$front" "$OUT/$run"
		if [[ -s $OUT/$run/iperf/per_request_lifecycle_metrics.json ]]; then
			ANSWER_TOKENS=$OUTPUT_LEN "$PY" "$here/analyze.py" "$run" "$OUT/$run/iperf/per_request_lifecycle_metrics.json" "${mets[@]}" |
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
echo "kvmesh: $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown), $REPLICAS replicas; results in $OUT"
table "${results[@]}"
exit $status
