#!/usr/bin/env bash
# latebind.sh ARM OUT: one run of the --late-bind measurement on real
# llama.cpp (not part of run.sh's suite; docs/BENCHMARKS.md, "Late binding
# on llama.cpp"). Starts REPLICAS fresh llama-server replicas (start.sh,
# SLOTS slots each), ROUTERS kvmesh routers over them (1: one router owning
# every replica; REPLICAS: one replica each, joined by seed with a
# generated gossip key, a conversation's turns going round them), with
# --late-bind when ARM is "on" and without when "off", runs the
# conversation benchmark with heavy-tailed answers to max_tokens
# (--answer-sigma, --ignore-eos), keeps each router's /metrics (the
# late-binding holds) and log, and stops everything. OUT gets bench.json,
# bench.log, router-N.metrics.txt, router-N.log and the replicas' logs.
# latebind.py tabulates the runs. Run each under
# `nice flock /tmp/bench.lock`, alternating the arms.
#
# Env [default]: PORT_BASE [29000] (replicas from there, the routers'
# ports from PORT_BASE+50), REPLICAS [2], SLOTS [4], ROUTERS [1],
# CONVERSATIONS [48], TURNS [4], CLIENTS [2 x REPLICAS x SLOTS],
# ANSWER_TOKENS [32] (the median), ANSWER_SIGMA [1], SEED [1],
# KVMESH_BIN [built from this tree], KVMESH_ROUTER_FLAGS (more router
# flags), BENCH_FLAGS (more bench flags, e.g. "--document-words 200"),
# THREADS, PIN and the rest of start.sh's.
set -euo pipefail

if [ $# -ne 2 ] || { [ "$1" != on ] && [ "$1" != off ]; }; then
  echo "usage: $0 on|off OUT_DIR" >&2
  exit 2
fi
arm=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
PORT_BASE=${PORT_BASE:-29000}
REPLICAS=${REPLICAS:-2}
export SLOTS=${SLOTS:-4}
ROUTERS=${ROUTERS:-1}
CONVERSATIONS=${CONVERSATIONS:-48}
TURNS=${TURNS:-4}
CLIENTS=${CLIENTS:-$((2 * REPLICAS * SLOTS))}
ANSWER_TOKENS=${ANSWER_TOKENS:-32}
ANSWER_SIGMA=${ANSWER_SIGMA:-1}
SEED=${SEED:-1}
MODEL_ALIAS=gemma3-270m
if [ "$ROUTERS" != 1 ] && [ "$ROUTERS" != "$REPLICAS" ]; then
  echo "ROUTERS must be 1 or REPLICAS ($REPLICAS), got $ROUTERS" >&2
  exit 2
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
export LOGDIR=$out
pidfile=$out/replicas.pids
pids=()
cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -e "$pidfile" ] && "$here/stop.sh" "$pidfile" >/dev/null 2>&1
  rm -f "$out/gossip.key"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
die() { echo "latebind: $*" >&2; exit 1; }
url() { echo "http://127.0.0.1:$1"; }

bin=${KVMESH_BIN:-}
if [ -z "$bin" ]; then
  bin=$out/kvmesh
  (cd "$repo" && go build -o "$bin" ./cmd/kvmesh)
fi

reps=()
for ((i = 0; i < REPLICAS; i++)); do reps+=("$(url $((PORT_BASE + i)))"); done
PIDFILE=$pidfile "$here/start.sh" "$REPLICAS" "$PORT_BASE" 2>>"$out/start.log" >/dev/null || die "start.sh failed (see $out/start.log)"

read -r -a extra <<<"${KVMESH_ROUTER_FLAGS:-}"
read -r -a bench_extra <<<"${BENCH_FLAGS:-}"
flags=(--region local --gossip-profile test --health-interval 200ms --engine-load-interval 250ms --log-level debug ${extra[@]+"${extra[@]}"})
if [ "$arm" = on ]; then flags+=(--late-bind); fi
(umask 077 && head -c 32 /dev/urandom | base64 >"$out/gossip.key")
fronts=() admins=()
for ((r = 0; r < ROUTERS; r++)); do
  api=$((PORT_BASE + 50 + 3 * r)) gossip=$((PORT_BASE + 51 + 3 * r)) admin=$((PORT_BASE + 52 + 3 * r))
  own=()
  if [ "$ROUTERS" = 1 ]; then
    for u in "${reps[@]}"; do own+=(--replica "$u"); done
  else
    own=(--replica "${reps[$r]}")
  fi
  join=()
  if [ "$r" -gt 0 ]; then join=(--join "127.0.0.1:$((PORT_BASE + 51))"); fi
  "$bin" router --name "r$r" --listen "127.0.0.1:$api" --gossip-bind "127.0.0.1:$gossip" \
    --admin-listen "127.0.0.1:$admin" --gossip-key-file "$out/gossip.key" ${join[@]+"${join[@]}"} \
    "${own[@]}" "${flags[@]}" >"$out/router-$r.log" 2>&1 &
  pids+=($!)
  fronts+=("$(url "$api")") admins+=("$admin")
  for ((i = 0; i < 300; i++)); do
    curl -fsS -o /dev/null --max-time 1 "$(url "$api")/readyz" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || die "router r$r exited (see $out/router-$r.log)"
    sleep 0.1
  done
done
# Every router sees every replica healthy with the model, and its owner
# has learnt its slots from /props (late binding holds only for known
# slots).
for admin in "${admins[@]}"; do
  ok=0
  for ((i = 0; i < 300; i++)); do
    if curl -fsS --max-time 1 "$(url "$admin")/debug/mesh" 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)
rs = m.get("replicas") or []
ok = sum(1 for r in rs if r.get("healthy") and sys.argv[1] in (r.get("models") or [])) == int(sys.argv[2])
ok = ok and all(r.get("engine_slots") == int(sys.argv[3]) for r in rs if r.get("owned"))
sys.exit(0 if ok else 1)' "$MODEL_ALIAS" "$REPLICAS" "$SLOTS" 2>/dev/null; then ok=1; break; fi
    sleep 0.2
  done
  [ $ok = 1 ] || die "the router with admin port $admin did not see $REPLICAS replicas healthy with $SLOTS slots"
done

echo "latebind: $arm, $REPLICAS replicas x $SLOTS slots, $ROUTERS router(s), $CLIENTS clients, $CONVERSATIONS conversations x $TURNS turns, answers median $ANSWER_TOKENS sigma $ANSWER_SIGMA, seed $SEED" >&2
front_list=$(IFS=,; echo "${fronts[*]}")
"$bin" bench --conversations "$CONVERSATIONS" --turns "$TURNS" --clients "$CLIENTS" \
  --answer-tokens "$ANSWER_TOKENS" --answer-sigma "$ANSWER_SIGMA" --ignore-eos --seed "$SEED" \
  --model "$MODEL_ALIAS" --request-ids --commit "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  ${bench_extra[@]+"${bench_extra[@]}"} --group "late-bind-$arm=$front_list" --json >"$out/bench.json" 2>"$out/bench.log" || die "bench failed (see $out/bench.log)"
for ((r = 0; r < ROUTERS; r++)); do
  curl -fsS "$(url "${admins[$r]}")/metrics" >"$out/router-$r.metrics.txt" 2>/dev/null || true
done
echo "$arm" >"$out/arm"
echo "latebind: $arm done in $out" >&2
