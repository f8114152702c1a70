#!/usr/bin/env bash
# stop.sh PIDFILE — stop the vLLM servers that start.sh recorded (one process-group leader pid per line):
# SIGTERM to each group, wait up to 30 s, then SIGKILL what is left, and remove PIDFILE.
# From the kvmesh team's checked vLLM CPU recipe (shared/engines/vllm-cpu/stop.sh).
set -uo pipefail
if [ $# -ne 1 ]; then echo "usage: $0 PIDFILE" >&2; exit 2; fi
PIDFILE=$1
[ -f "$PIDFILE" ] || { echo "no $PIDFILE" >&2; exit 1; }
mapfile -t PIDS < <(grep -E '^[0-9]+$' "$PIDFILE")
alive() { ps -eo pgid= | awk -v g="$1" '$1 == g {f = 1} END {exit !f}'; }
for p in "${PIDS[@]}"; do alive "$p" && kill -TERM -- "-$p" 2>/dev/null; done
for _ in $(seq 1 30); do
  left=0; for p in "${PIDS[@]}"; do alive "$p" && left=1; done
  [ $left = 0 ] && break; sleep 1
done
for p in "${PIDS[@]}"; do alive "$p" && { echo "SIGKILL group $p" >&2; kill -KILL -- "-$p" 2>/dev/null; }; done
rm -f "$PIDFILE"
echo "stopped ${#PIDS[@]} server(s)"
