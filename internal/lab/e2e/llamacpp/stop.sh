#!/usr/bin/env bash
# stop.sh PIDFILE — stop the replicas that start.sh wrote to PIDFILE (only those pids), then remove PIDFILE.
# From the kvmesh team's checked llama.cpp recipe (shared/engines/llamacpp/stop.sh).
set -uo pipefail
if [ $# -ne 1 ]; then echo "usage: $0 PIDFILE" >&2; exit 2; fi
PIDFILE=$1
[ -f "$PIDFILE" ] || { echo "no such pidfile: $PIDFILE" >&2; exit 1; }
mapfile -t PIDS < "$PIDFILE"
for pid in "${PIDS[@]}"; do
  [ -n "$pid" ] || continue
  # only signal it if it is still a llama-server (the pid may have been reused)
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q llama-server; then
    kill -TERM "$pid" 2>/dev/null || true
  fi
done
for pid in "${PIDS[@]}"; do
  [ -n "$pid" ] || continue
  for ((t = 0; t < 40; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q llama-server; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
done
rm -f "$PIDFILE"
echo "stopped ${#PIDS[@]} replica(s)"
