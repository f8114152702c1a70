#!/usr/bin/env bash
# start.sh N BASE_PORT — start N llama-server replicas on 127.0.0.1:BASE_PORT..BASE_PORT+N-1.
# From the kvmesh team's checked llama.cpp recipe (shared/engines/llamacpp/start.sh), with
# --no-repack on by default: on AVX-512/AMX hosts the CPU weight-repack path of build b11312
# died with SIGILL (REPACK=1 turns it back on).
# Waits for every /health to answer {"status":"ok"}, writes one pid per line to PIDFILE and prints PIDFILE.
# Stop them with: stop.sh PIDFILE
#
# Environment overrides (defaults in brackets):
#   LLAMA_SERVER   binary            [$ENGINES_HOME/bin/llama-server]
#   MODEL          GGUF              [$ENGINES_HOME/models/gemma3-270m-q4_k_m.gguf]
#   THREADS        threads/replica   [1]
#   SLOTS          parallel slots    [4]
#   CTX            total ctx/replica [16384]  (non-unified KV: CTX/SLOTS = 4096 tokens per slot)
#   CACHE_RAM_MIB  host prompt cache [1024]   (0 disables; llama.cpp default is 8192 — too much for N replicas in 24 GiB;
#                                              ~33 MiB per cached 1k-token prompt incl. SWA checkpoints)
#   PIN            1 = pin replica i to CPU (i mod nproc) with taskset [0]
#   ALIAS          model name served in /v1/models [gemma3-270m]
#   PIDFILE        [/tmp/realengine-BASE_PORT.pids]
#   LOGDIR         [/tmp]  (log per replica: LOGDIR/realengine-PORT.log)
#   HEALTH_TIMEOUT seconds to wait per replica [120]
#   REPACK         1 = let llama.cpp repack weights for the CPU [0]
#   EXTRA_ARGS     appended to every llama-server command line
set -euo pipefail

if [ $# -ne 2 ]; then echo "usage: $0 N BASE_PORT" >&2; exit 2; fi
N=$1; BASE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=${ENGINES_HOME:-$HOME/.cache/kvmesh-engines}; mkdir -p "$TOOLS"
LLAMA_SERVER=${LLAMA_SERVER:-$TOOLS/bin/llama-server}
MODEL=${MODEL:-$TOOLS/models/gemma3-270m-q4_k_m.gguf}
THREADS=${THREADS:-1}
SLOTS=${SLOTS:-4}
CTX=${CTX:-16384}
CACHE_RAM_MIB=${CACHE_RAM_MIB:-1024}
PIN=${PIN:-0}
ALIAS=${ALIAS:-gemma3-270m}
PIDFILE=${PIDFILE:-/tmp/realengine-$BASE.pids}
LOGDIR=${LOGDIR:-/tmp}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-120}
EXTRA_ARGS=${EXTRA_ARGS:-}
REPACK=${REPACK:-0}
repack=()
[ "$REPACK" = 1 ] || repack=(--no-repack)

[ -x "$LLAMA_SERVER" ] || { echo "missing $LLAMA_SERVER (see README.md: build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "missing $MODEL (see README.md: model)" >&2; exit 1; }
if [ -e "$PIDFILE" ]; then echo "$PIDFILE exists: replicas already running? run stop.sh $PIDFILE first" >&2; exit 1; fi
for ((i = 0; i < N; i++)); do
  port=$((BASE + i))
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port already in use" >&2; exit 1; fi
done

NCPU=$(nproc)
: > "$PIDFILE"
for ((i = 0; i < N; i++)); do
  port=$((BASE + i))
  pin=()
  if [ "$PIN" = 1 ]; then pin=(taskset -c $((i % NCPU))); fi
  # shellcheck disable=SC2086
  nohup "${pin[@]}" "$LLAMA_SERVER" -m "$MODEL" --alias "$ALIAS" \
      --host 127.0.0.1 --port "$port" \
      -t "$THREADS" -tb "$THREADS" -np "$SLOTS" -c "$CTX" --no-kv-unified \
      --cache-ram "$CACHE_RAM_MIB" --metrics --slots --no-webui "${repack[@]}" \
      $EXTRA_ARGS > "$LOGDIR/realengine-$port.log" 2>&1 < /dev/null &
  echo $! >> "$PIDFILE"
done

for ((i = 0; i < N; i++)); do
  port=$((BASE + i))
  pid=$(sed -n "$((i + 1))p" "$PIDFILE")
  ok=0
  for ((t = 0; t < HEALTH_TIMEOUT * 4; t++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "replica on port $port (pid $pid) exited; log $LOGDIR/realengine-$port.log:" >&2
      tail -20 "$LOGDIR/realengine-$port.log" >&2
      break
    fi
    if curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"ok"'; then ok=1; break; fi
    sleep 0.25
  done
  if [ $ok != 1 ]; then
    echo "replica on port $port not healthy; stopping all" >&2
    "$HERE/stop.sh" "$PIDFILE" >&2 || true
    exit 1
  fi
  echo "replica $i: http://127.0.0.1:$port pid $pid log $LOGDIR/realengine-$port.log" >&2
done
echo "$PIDFILE"
