#!/usr/bin/env bash
# datatypes.sh: every data type of inference-perf 0.7.0 once through a
# kvmesh front end (or another, FRONTS), over fresh replicas per type, to
# check that each one's requests are routed and answered. Offline: the
# types that download a Hugging Face data set read a local file of the
# same layout that datasets.py writes from local text instead.
#
#   internal/lab/bench/inferenceperf/datatypes.sh
#   TYPES="random sharegpt" FRONTS="kvmesh-4" datatypes.sh
#
# Types (TYPES; the API inference-perf sends in brackets):
#   mock           [chat]  "mock prompt i", no max_tokens
#   mock-messages  [anthropic_messages]  the same as /v1/messages
#   random         [completion]  random tokens, lengths from distributions
#   synthetic      [completion]  corpus text, lengths from distributions
#   multimodal     [chat]  synthetic with a generated image per request
#   shared-prefix  [chat]  shared_prefix without multi-turn
#   sharegpt       [chat]  shareGPT (local file)
#   cnn            [completion]  cnn_dailymail (local file)
#   billsum        [chat]  billsum_conversations (local file)
#   infinity       [chat]  infinity_instruct (local file)
#   visionarena    [chat]  VisionArena rows with an image (local parquet)
#   conversation   [completion]  conversation_replay (multi-turn, shared
#                  system prompt)
#   agentic        [chat]  synthetic_agentic (tool calls, sub-agents)
#   weka           [chat]  weka_trace_replay (local traces)
#   otel           [chat]  otel_trace_replay (local traces)
# Each runs RATE [2] req/s for DURATION [20] s (the session replays,
# agentic, weka and otel, 8 sessions 4 at a time at their own pace,
# stopped at 3 x DURATION). Per type: requests,
# failures (inference-perf's error count), the share of prompt tokens the
# replicas reported cached, TTFT; one table at the end.
#
# Environment: as run.sh (OUT, BASE_PORT, REPLICAS, NREP, SLOTS,
# KVMESH_BIN, ROUTER_LOG, IPERF_HOME, TRAIN_TEXT), FRONTS [kvmesh-1].
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
	exit 0
fi

RATE=${RATE:-2}
DURATION=${DURATION:-20}
NUM_WORKERS=${NUM_WORKERS:-2}
read -r -a types <<<"${TYPES:-mock mock-messages random synthetic multimodal shared-prefix sharegpt cnn billsum infinity visionarena conversation agentic weka otel}"
read -r -a fronts <<<"${FRONTS:-kvmesh-1}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

data=$OUT/data
"$venv/bin/python" "$here/datasets.py" "$TRAIN_TEXT" "$data"

dist() { printf '{min: %d, max: %d, mean: %d, std_dev: %d}' "$@"; }

# datacfg TYPE: the api and data sections of TYPE's configuration.
datacfg() {
	local api=chat
	case $1 in
	random | synthetic | cnn | conversation) api=completion ;;
	mock-messages) api=anthropic_messages ;;
	esac
	printf 'api:\n  type: %s\n  streaming: true\ndata:\n' "$api"
	case $1 in
	mock | mock-messages) printf '  type: mock\n' ;;
	random | synthetic)
		printf '  type: %s\n  input_distribution: %s\n  output_distribution: %s\n' "$1" "$(dist 100 800 400 150)" "$(dist 8 48 24 8)"
		;;
	multimodal)
		printf '  type: synthetic\n  input_distribution: %s\n  output_distribution: %s\n' "$(dist 50 200 100 40)" "$(dist 8 32 16 6)"
		printf '  multimodal:\n    image:\n      count: {min: 1, max: 1, mean: 1, std_dev: 0}\n'
		;;
	shared-prefix)
		printf '  type: shared_prefix\n  shared_prefix:\n    num_groups: 4\n    num_prompts_per_group: 8\n'
		printf '    system_prompt_len: 600\n    question_len: 100\n    output_len: 24\n'
		;;
	sharegpt) printf '  type: shareGPT\n  path: %s\n' "$data/sharegpt.json" ;;
	cnn) printf '  type: cnn_dailymail\n  path: %s\n' "$data/cnn.json" ;;
	billsum) printf '  type: billsum_conversations\n  path: %s\n' "$data/billsum.json" ;;
	infinity) printf '  type: infinity_instruct\n  path: %s\n' "$data/infinity.json" ;;
	visionarena)
		printf '  type: visionarena\n  visionarena:\n    hf_dataset_name: parquet\n    hf_data_files: %s\n    num_rows: 64\n' "$data/visionarena.parquet"
		;;
	conversation)
		printf '  type: conversation_replay\n  conversation_replay:\n    num_conversations: 16\n    shared_system_prompt_len: 800\n'
		printf '    dynamic_system_prompt_len: %s\n    turns_per_conversation: %s\n' "$(dist 50 200 100 40)" "$(dist 2 5 3 1)"
		printf '    input_tokens_per_turn: %s\n    output_tokens_per_turn: %s\n' "$(dist 20 120 60 20)" "$(dist 8 32 16 6)"
		;;
	agentic)
		printf '  type: synthetic_agentic\n  synthetic_agentic:\n    num_sessions: 8\n    shared_system_prompt_len: 600\n'
		printf '    use_static_model: true\n    static_model_name: %s\n' "$MODEL_NAME"
		printf '    input_tokens_per_turn: %s\n    output_tokens_per_turn: %s\n' "$(dist 20 120 60 20)" "$(dist 8 32 16 6)"
		printf '    max_model_len: 16384\n'
		;;
	weka)
		printf '  type: weka_trace_replay\n  weka_trace_replay:\n    trace_directory: %s\n' "$data/weka"
		printf '    use_static_model: true\n    static_model_name: %s\n    ignore_trace_delays: false\n' "$MODEL_NAME"
		;;
	otel)
		printf '  type: otel_trace_replay\n  otel_trace_replay:\n    trace_directory: %s\n' "$data/otel"
		printf '    use_static_model: true\n    static_model_name: %s\n' "$MODEL_NAME"
		;;
	*)
		echo "datatypes.sh: unknown type $1" >&2
		return 1
		;;
	esac
}

# loadcfg TYPE: the load section: a constant rate, or for the session
# replays (which inference-perf runs only so) their sessions, 4 at a time,
# within DURATION.
loadcfg() {
	case $1 in
	agentic | weka | otel)
		printf 'load:\n  type: trace_session_replay\n  stages:\n  - concurrent_sessions: 4\n    session_rate: 1\n'
		printf '    num_sessions: 8\n    timeout: %d\n  num_workers: %d\n' $((DURATION * 3)) "$NUM_WORKERS"
		;;
	*)
		printf 'load:\n  type: constant\n  stages:\n  - rate: %s\n    duration: %d\n  num_workers: %d\n' "$RATE" "$DURATION" "$NUM_WORKERS"
		;;
	esac
}

# config TYPE DIR: the inference-perf configuration of one run.
config() {
	datacfg "$1"
	loadcfg "$1"
	cat <<-YAML
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
for front in "${fronts[@]}"; do
	for type in "${types[@]}"; do
		run=$type-$front
		echo "== $run" >&2
		if ! { start_replicas && start_front "$front"; }; then
			echo "datatypes.sh: $run could not be started; skipped" >&2
			status=1
			stop_all
			continue
		fi
		clear_caches
		mkdir -p "$OUT/$run"
		config "$type" "$OUT/$run/iperf" >"$OUT/$run/config.yaml"
		HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout $((DURATION * 6 + 120)) \
			nice "$venv/bin/inference-perf" --config_file "$OUT/$run/config.yaml" >"$OUT/logs/$run-iperf.log" 2>&1 || {
			echo "datatypes.sh: $run: inference-perf failed (see logs/$run-iperf.log)" >&2
			status=1
		}
		collect "$front" "$OUT/$run"
		if [[ -s $OUT/$run/iperf/per_request_lifecycle_metrics.json ]]; then
			"$PY" "$here/analyze.py" "$run" "$OUT/$run/iperf/per_request_lifecycle_metrics.json" "${mets[@]}" |
				tee "$OUT/$run/result.json"
			results+=("$OUT/$run/result.json")
		else
			echo "datatypes.sh: $run produced no per-request record (see logs/$run-iperf.log)" >&2
			status=1
		fi
		stop_all
	done
done

echo
echo "kvmesh: $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown), $REPLICAS replicas; results in $OUT"
table "${results[@]}"
exit $status
