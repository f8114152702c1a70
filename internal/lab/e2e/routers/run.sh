#!/usr/bin/env bash
# 1 -> 16 routers (issue 22): real `kvmesh router` processes on 127.0.0.1,
# joined by seed with a generated gossip key, in front of the same
# REPLICAS `kvmesh replica-sim` replicas. For each router count N in COUNTS:
# the replicas are started fresh (empty caches) on the same ports, N routers
# start with the replicas dealt among them (replica j declared by router
# j mod N: each owned by exactly one router; with N > REPLICAS some routers
# own none and forward everything), the suite waits until every router sees
# every other alive and every replica healthy with one owner, then runs the
# multi-turn chat benchmark (kvmesh bench --conversations) with a
# conversation's turn t at router (c + t) mod N, so each turn lands at
# another router than the one before. check.py compare prints one row per N
# (the follow-up cached share as the replicas reported it in usage, TTFT
# p50/p99, errors) and fails unless every turn was answered with usage and
# each N's follow-up share is at least RATIO x the one-router run's.
# Every child is stopped on exit; on failure the routers' mesh views and the
# logs' tails are printed. Needs go (unless KVMESH_BIN), python3 and curl.
# Env: COUNTS ["1 4 8 16"] (the first is the reference), REPLICAS [8],
# CONVERSATIONS [64] TURNS [4] CLIENTS [32] (as many as the replicas' slots:
# placement then weighs load against cache), ANSWER_TOKENS [48], THINK
# [200ms], SLOTS [4] (replica-sim --max-num-seqs), KV_BLOCKS [2048] (per
# replica, 16 tokens each: ~32k tokens, the working set fits), TIME_SCALE
# [2] (replica-sim speed-up), RATIO [0.97], KVMESH_BIN [built from this tree], KVMESH_ARTIFACTS (results, metrics and
# mesh views are copied there when set), ROUTER_LOG_LEVEL [warn] (debug logs
# every routing decision), ROUTER_FLAGS (more flags for every router, such
# as --late-bind), PORTS_FROM and PORTS_TO (the range the ports are picked
# from; by default below the ephemeral range).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-e2e-routers.XXXXXX")
COUNTS=${COUNTS:-1 4 8 16}
REPLICAS=${REPLICAS:-8}
CONVERSATIONS=${CONVERSATIONS:-64}
TURNS=${TURNS:-4}
CLIENTS=${CLIENTS:-32}
ANSWER_TOKENS=${ANSWER_TOKENS:-48}
THINK=${THINK:-200ms}
SLOTS=${SLOTS:-4}
KV_BLOCKS=${KV_BLOCKS:-2048}
TIME_SCALE=${TIME_SCALE:-2}
RATIO=${RATIO:-0.97}
ROUTER_LOG_LEVEL=${ROUTER_LOG_LEVEL:-warn}
MODEL=kvmesh-sim
routers=() # router PIDs of the current N
reps=()    # replica PIDs of the current N
admins=()  # admin base URLs of the current N's routers

stop_pids() { # stop_pids PID...: SIGTERM, then SIGKILL what is left after 10 s
  local pid i
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for ((i = 0; i < 100; i++)); do
    local left=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ] && [ "${#admins[@]}" -gt 0 ]; then
    echo "--- e2e-routers: the routers' mesh views" >&2
    python3 "$here/check.py" mesh-summary "${admins[@]}" >&2 || true
  fi
  stop_pids "${routers[@]}" "${reps[@]}"
  if [ "$rc" -ne 0 ]; then
    echo "--- e2e-routers FAILED (exit $rc); process logs:" >&2
    for f in "$work"/*.log; do
      [ -s "$f" ] || continue
      echo "--- $(basename "$f") (last 15 lines)" >&2
      tr '\r' '\n' <"$f" | grep -v -e 'similar log lines suppressed' -e '^x[0-9]*: [0-9]*/[0-9]* conversations$' |
        tail -n 15 >&2
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "e2e-routers: $*" >&2; exit 1; }
for tool in python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
t0=$SECONDS

if [ -n "${KVMESH_BIN:-}" ]; then
  cp "$KVMESH_BIN" "$work/kvmesh"
else
  command -v go >/dev/null || die "go is not installed (or set KVMESH_BIN)"
  echo "e2e-routers: building kvmesh"
  (cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh)
fi

# Ports: the replicas', then three per router (API, gossip, admin) for the
# largest N; every N reuses them once the previous routers have exited.
maxn=0
for n in $COUNTS; do [ "$n" -gt "$maxn" ] && maxn=$n; done
[ "$maxn" -ge 1 ] || die "COUNTS is empty"
read -r -a ports <<<"$(python3 "$here/check.py" ports $((REPLICAS + 3 * maxn)))" || die "could not pick free ports"
url() { echo "http://127.0.0.1:$1"; }
rep_url() { url "${ports[$1]}"; }
api_port() { echo "${ports[$((REPLICAS + 3 * $1))]}"; }
gossip_port() { echo "${ports[$((REPLICAS + 3 * $1 + 1))]}"; }
admin_port() { echo "${ports[$((REPLICAS + 3 * $1 + 2))]}"; }

(umask 077 && head -c 32 /dev/urandom | base64 >"$work/gossip.key")

wait_http() { # wait_http URL WHAT PID: until URL answers 200 (30 s), failing early if PID exits
  local i
  for ((i = 0; i < 300; i++)); do
    curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || die "$2 exited while starting"
    sleep 0.1
  done
  die "timed out waiting for $2 ($1)"
}

start_replicas() { # start_replicas N: fresh replicas (empty caches) on the same ports
  local n=$1 j
  for ((j = 0; j < REPLICAS; j++)); do
    "$work/kvmesh" replica-sim --listen "127.0.0.1:${ports[$j]}" --model "$MODEL" --max-num-seqs "$SLOTS" \
      --kv-blocks "$KV_BLOCKS" --time-scale "$TIME_SCALE" --log-level warn >"$work/replica-x$n-$j.log" 2>&1 &
    reps+=($!)
  done
  for ((j = 0; j < REPLICAS; j++)); do wait_http "$(rep_url "$j")/health" "replica $j" "${reps[$j]}"; done
}

start_routers() { # start_routers N: router i declares replicas j with j mod N = i
  local n=$1 i j
  admins=()
  for ((i = 0; i < n; i++)); do
    local args=(router --name "r$i" --region local --listen "127.0.0.1:$(api_port "$i")"
      --gossip-bind "127.0.0.1:$(gossip_port "$i")" --admin-listen "127.0.0.1:$(admin_port "$i")"
      --gossip-key-file "$work/gossip.key" --gossip-profile test --health-interval 200ms
      --engine-load-interval 250ms --log-level "$ROUTER_LOG_LEVEL")
    [ "$i" -gt 0 ] && args+=(--join "127.0.0.1:$(gossip_port 0)")
    # shellcheck disable=SC2206 # ROUTER_FLAGS is a list of words
    [ -n "${ROUTER_FLAGS:-}" ] && args+=($ROUTER_FLAGS)
    for ((j = i; j < REPLICAS; j += n)); do args+=(--replica "$(rep_url "$j")"); done
    "$work/kvmesh" "${args[@]}" >"$work/router-x$n-r$i.log" 2>&1 &
    routers+=($!)
    admins+=("$(url "$(admin_port "$i")")")
    # The seed first, so the others join it at once.
    [ "$i" = 0 ] && wait_http "$(url "$(admin_port 0)")/healthz" "router r0" "${routers[0]}"
  done
  python3 "$here/check.py" wait-mesh "$MODEL" "$REPLICAS" 60 "${admins[@]}"
}

results=()
for n in $COUNTS; do
  t=$SECONDS
  start_replicas "$n"
  start_routers "$n"
  fronts=()
  for ((i = 0; i < n; i++)); do fronts+=("$(url "$(api_port "$i")")"); done
  echo "e2e-routers: x$n ready in $((SECONDS - t)) s; benchmarking"
  t=$SECONDS
  "$work/kvmesh" bench --conversations "$CONVERSATIONS" --turns "$TURNS" --clients "$CLIENTS" \
    --answer-tokens "$ANSWER_TOKENS" --think "$THINK" --model "$MODEL" \
    --group "x$n=$(IFS=,; echo "${fronts[*]}")" --json >"$work/x$n.json" 2>"$work/bench-x$n.log" ||
    die "bench x$n failed"
  echo "e2e-routers: x$n benchmarked in $((SECONDS - t)) s"
  for ((i = 0; i < n; i++)); do
    curl -fsS --max-time 5 "${admins[$i]}/metrics" >"$work/x$n-r$i.metrics.txt" 2>/dev/null || true
    curl -fsS --max-time 5 "${admins[$i]}/debug/mesh" >"$work/x$n-r$i.mesh.json" 2>/dev/null || true
  done
  results+=("$work/x$n.json")
  stop_pids "${routers[@]}" "${reps[@]}"
  routers=() reps=() admins=()
done

status=0
python3 "$here/check.py" compare "$RATIO" "${results[@]}" || status=$?
if [ -n "${KVMESH_ARTIFACTS:-}" ]; then
  mkdir -p "$KVMESH_ARTIFACTS"
  for f in "$work"/x*.json "$work"/*.metrics.txt "$work"/*.log; do [ -e "$f" ] && cp "$f" "$KVMESH_ARTIFACTS/routers-${f##*/}"; done
fi
[ "$status" = 0 ] || die "the comparison failed"
echo "e2e-routers: passed in $((SECONDS - t0)) s"
