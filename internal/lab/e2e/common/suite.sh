# shellcheck shell=bash
# suite.sh: what the real-engine suites (../llamacpp/run.sh, ../vllm/run.sh)
# share, sourced by them: the children's cleanup, the kvmesh build, the
# engines' replicas (their start.sh and stop.sh), the routers' waits, the
# benchmark, and the phases both run (features, x1, x2, rr) and the gates
# both apply (predict, compare).
#
# The sourcing script sets first: SUITE (its name in messages, e.g.
# e2e-vllm), here (its folder: start.sh, stop.sh, install.sh, check.py),
# ENGINE (llamacpp or vllm: the features check's profile), MODEL_ALIAS,
# CONVERSATIONS, TURNS, ANSWER_TOKENS, PHASES. It may define
# replica_env BASE, printing VAR=value words for start.sh.
#
# ENGINE_SIM=1 is the suites' dry path: install.sh is skipped and each
# replica is a kvmesh replica-sim (a vLLM-like simulated engine) serving
# MODEL_ALIAS, so the suite's plumbing (ports, routers, benchmark, gates)
# runs in seconds on any machine; the features check then expects the
# sim's engine (vllm) and no slots, and the comparison does not gate.
# It runs the phases features, x1, x2 and rr, and the vLLM suite's peers
# (the sims serve /reset_prefix_cache; they publish no KV events, so not
# events or peerview). Nothing it measures is an engine's.

common=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$common/../../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-$SUITE.XXXXXX")
ENGINE_SIM=${ENGINE_SIM:-0}
export LOGDIR=$work
pids=()
pidfiles=()

phase() { [[ " $PHASES " == *" $1 "* ]]; }

cleanup() {
  local rc=$? pid f
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for f in "${pidfiles[@]}"; do [ -e "$f" ] && stop_pidfile "$f" >/dev/null 2>&1; done
  if [ "$rc" -ne 0 ]; then
    echo "--- $SUITE FAILED (exit $rc); process logs:" >&2
    for f in "$work"/*.log; do
      [ -e "$f" ] || continue
      echo "--- $(basename "$f") (last 30 lines but memberlist's connections)" >&2
      grep -v 'memberlist: Stream connection\|memberlist: Initiating push/pull' "$f" | tail -n 30 >&2
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "$SUITE: $*" >&2; exit 1; }

# prepare: the tools, the engine (install.sh, cached; not with
# ENGINE_SIM=1) and kvmesh (KVMESH_BIN, else built from this tree).
prepare() {
  local tool
  for tool in go python3 curl; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
  done
  if [ "$ENGINE_SIM" = 1 ]; then
    echo "$SUITE: ENGINE_SIM=1: replica-sim replicas stand in for the engine (a dry run of the suite)"
  else
    "$here/install.sh"
  fi
  echo "$SUITE: building kvmesh"
  if [ -n "${KVMESH_BIN:-}" ]; then cp "$KVMESH_BIN" "$work/kvmesh"; else (cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh); fi
}

# pick_ports PAIRS SINGLES [BASE] [OFFSET,...]: free ports into the array
# ports (../common/e2echeck.py ports).
pick_ports() {
  local picked
  picked=$(python3 "$common/e2echeck.py" ports "$@") || die "could not pick free ports"
  read -r -a ports <<<"$picked"
  [ "${#ports[@]}" -eq $((2 * $1 + $2)) ] || die "could not pick free ports"
}

start() { # start NAME ARGS...: runs kvmesh ARGS in the background, logging to NAME.log
  local name=$1; shift
  start_cmd "$name" "$work/kvmesh" "$@"
}
start_cmd() { # start_cmd NAME CMD ARGS...: runs CMD ARGS in the background, logging to NAME.log
  local name=$1; shift
  "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
}

replicas() { # replicas BASE: 2 fresh replicas on BASE and BASE+1 (start.sh waits for /health)
  local f extra=()
  if [ "$ENGINE_SIM" = 1 ]; then
    sim_replicas "$1"
    return
  fi
  if declare -F replica_env >/dev/null; then read -r -a extra <<<"$(replica_env "$1")"; fi
  f=$(env ${extra[@]+"${extra[@]}"} PIDFILE="$work/replicas-$1.pids" "$here/start.sh" 2 "$1" 2>>"$work/start.log") ||
    die "start.sh 2 $1 failed"
  pidfiles+=("$f")
}
sim_replicas() { # sim_replicas BASE: replicas' dry-run stand-ins, a pid a line in replicas-BASE.pids
  local f=$work/replicas-$1.pids i port
  : >"$f"
  pidfiles+=("$f")
  for i in 0 1; do
    port=$(($1 + i))
    "$work/kvmesh" replica-sim --listen "127.0.0.1:$port" --model "$MODEL_ALIAS" --log-level warn \
      >"$work/sim-$port.log" 2>&1 &
    echo $! >>"$f"
  done
  for i in 0 1; do wait_http "$(url $(($1 + i)))/health" "replica-sim on $(($1 + i))" "$(sed -n "$((i + 1))p" "$f")"; done
}
stop_replicas() { # stop_replicas BASE
  stop_pidfile "$work/replicas-$1.pids" >/dev/null
}
stop_pidfile() { # stop_pidfile PIDFILE: the engine's stop.sh, or the sims' kill
  if [ "$ENGINE_SIM" = 1 ]; then
    local pid
    while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$1"
    local i
    while read -r pid; do
      for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    done <"$1"
    rm -f "$1"
    return
  fi
  "$here/stop.sh" "$1"
}
stop_frontends() { # SIGTERM every kvmesh child: routers drain and exit
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

wait_http() { # wait_http URL WHAT [PID...]: until URL answers 200 (60 s), while every child (and PID) lives
  local i pid url=$1 what=$2
  shift 2
  for ((i = 0; i < 600; i++)); do
    curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && return 0
    for pid in "${pids[@]}" "$@"; do kill -0 "$pid" 2>/dev/null || die "a child exited while waiting for $what"; done
    sleep 0.1
  done
  die "timed out waiting for $what ($url)"
}
wait_healthy() { # wait_healthy ADMIN_PORT N: until the router there sees N replicas healthy with the model (60 s)
  local i n
  for ((i = 0; i < 300; i++)); do
    n=$(curl -fsS --max-time 1 "http://127.0.0.1:$1/debug/mesh" 2>/dev/null | python3 -c '
import json, sys
try:
    m = json.load(sys.stdin)
    print(sum(1 for r in m.get("replicas") or [] if r.get("healthy") and sys.argv[1] in (r.get("models") or [])))
except ValueError:
    print(0)' "$MODEL_ALIAS") || n=0
    [ "$n" = "$2" ] && return 0
    sleep 0.2
  done
  die "the router with admin port $1 did not see $2 replicas healthy"
}

# wait_ready URL WHAT: until a one-token chat completion through the front
# end at URL answers 200 (120 s). A peer router has no readiness endpoint
# that says its workers are admitted, so it is asked what the benchmark
# asks; the prompt shares only the chat template's first tokens with it.
wait_ready() {
  local i pid code body
  body=$(printf '{"model":"%s","messages":[{"role":"user","content":"ready?"}],"max_tokens":1}' "$MODEL_ALIAS")
  for ((i = 0; i < 600; i++)); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' \
      -d "$body" "$1/v1/chat/completions" 2>/dev/null) || code=000
    [ "$code" = 200 ] && return 0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "a child exited while waiting for $2"; done
    sleep 0.2
  done
  die "timed out waiting for $2 ($1, last status $code)"
}
need_venv() { # need_venv DIR PACKAGE: a venv at DIR with PACKAGE from PyPI, created once
  [ -x "$1/bin/python" ] && "$1/bin/pip" show -q "$2" >/dev/null 2>&1 && return 0
  echo "$SUITE: installing $2 into $1"
  "${PYTHON:-python3}" -m venv "$1" || die "could not create the venv $1"
  "$1/bin/pip" install -q "$2" || die "pip install $2 failed"
}

# The published cache-aware routers kvmesh is compared with (issue 22),
# each in its venv (PYTHON creates them): SGLang Model Gateway (PyPI smg)
# and vllm-router (PyPI vllm-router).
SMG_VENV=${SMG_VENV:-$HOME/.cache/kvmesh-iperf/smg-venv}
VLLM_ROUTER_VENV=${VLLM_ROUTER_VENV:-$HOME/.cache/kvmesh-vllm-router-venv}
need_peer() { # need_peer FE: installs front end FE's package when it is a peer router (once)
  case $1 in
  smg) need_venv "$SMG_VENV" smg ;;
  vllm-router) need_venv "$VLLM_ROUTER_VENV" vllm-router ;;
  esac
}

# start_frontend FE LOG R1 R2 [ROUTER_FLAG...]: starts front end FE over
# the replicas at URLs R1 and R2 and waits until it serves; sets front to
# its URL (kvmesh-x2: both routers', comma-separated). FE: kvmesh-x1 (one
# router, both replicas), kvmesh-x2 (two routers joined by seed with a
# generated gossip key, one replica each; logs LOG-1 and LOG-2), smg or
# vllm-router (--policy cache_aware, on peerport with Prometheus on
# peerprom). The ROUTER_FLAGs go to kvmesh's routers.
start_frontend() {
  local fe=$1 log=$2 r1=$3 r2=$4
  shift 4
  case $fe in
  kvmesh-x1)
    start "$log" router --name r0 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" \
      --admin-listen "127.0.0.1:$admin1" --replica "$r1" --replica "$r2" "$@"
    wait_http "$(url "$api1")/readyz" "router r0"
    wait_healthy "$admin1" 2
    front=$(url "$api1") ;;
  kvmesh-x2)
    (umask 077 && head -c 32 /dev/urandom | base64 >"$work/gossip.key")
    start "$log-1" router --name r1 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" \
      --admin-listen "127.0.0.1:$admin1" --replica "$r1" --gossip-key-file "$work/gossip.key" "$@"
    wait_http "$(url "$api1")/readyz" "router r1"
    start "$log-2" router --name r2 --listen "127.0.0.1:$api2" --gossip-bind "127.0.0.1:$gossip2" \
      --admin-listen "127.0.0.1:$admin2" --join "127.0.0.1:$gossip1" --replica "$r2" \
      --gossip-key-file "$work/gossip.key" "$@"
    wait_http "$(url "$api2")/readyz" "router r2"
    wait_healthy "$admin1" 2
    wait_healthy "$admin2" 2
    front="$(url "$api1"),$(url "$api2")" ;;
  smg)
    # Run as a module: sglang-router installs a console script named smg too.
    start_cmd "$log" "$SMG_VENV/bin/python" -m smg.cli launch --host 127.0.0.1 --port "$peerport" \
      --worker-urls "$r1" "$r2" --policy cache_aware \
      --prometheus-host 127.0.0.1 --prometheus-port "$peerprom" --log-level warn
    wait_ready "$(url "$peerport")" "SMG"
    front=$(url "$peerport") ;;
  vllm-router)
    start_cmd "$log" "$VLLM_ROUTER_VENV/bin/vllm-router" --host 127.0.0.1 --port "$peerport" \
      --worker-urls "$r1" "$r2" --policy cache_aware \
      --prometheus-host 127.0.0.1 --prometheus-port "$peerprom" --log-level warning
    wait_ready "$(url "$peerport")" "vllm-router"
    front=$(url "$peerport") ;;
  *) die "unknown front end $fe (kvmesh-x1, kvmesh-x2, smg, vllm-router)" ;;
  esac
}

# KVMESH_ROUTER_FLAGS (split on spaces) are added to every router's flags.
# Routers log at debug: a line per response with its predicted and
# reported cached tokens, for check.py predict.
read -r -a extra_router_flags <<<"${KVMESH_ROUTER_FLAGS:-}"
router_flags=(--region local --gossip-profile test --health-interval 200ms --log-level debug ${extra_router_flags[@]+"${extra_router_flags[@]}"})
url() { echo "http://127.0.0.1:$1"; }
bench() { # bench NAME FRONTEND_URLS: the conversation benchmark, JSON to NAME.json
  local t=$SECONDS
  "$work/kvmesh" bench --conversations "$CONVERSATIONS" --turns "$TURNS" --answer-tokens "$ANSWER_TOKENS" \
    --group "$1=$2" --json >"$work/$1.json" 2>"$work/bench-$1.log" || die "bench $1 failed"
  echo "$SUITE: $1 benchmarked in $((SECONDS - t)) s"
}

scrape() { # scrape NAME ADMIN_PORT: the router's metrics and mesh view, kept with the results
  curl -fsS "$(url "$2")/metrics" >"$work/$1.metrics.txt" 2>/dev/null || true
  curl -fsS "$(url "$2")/debug/mesh" >"$work/$1.mesh.json" 2>/dev/null || true
}

# The phases both suites run, on the ports the sourcing script picked:
# rep_feat, rep_x1, rep_x2, rep_rr (pairs of replica ports), api1, api2,
# gossip1, gossip2, admin1, admin2, lbport (and for the peer routers
# peerport, peerprom).

# phase_features [SLOTS]: one router over 2 replicas; check.py features
# (the engine's slots when it has them).
phase_features() {
  echo "$SUITE: features through one router over 2 replicas"
  replicas "$rep_feat"
  start router-features router --name r0 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" \
    --admin-listen "127.0.0.1:$admin1" --engine-load-interval 250ms \
    --replica "$(url "$rep_feat")" --replica "$(url $((rep_feat + 1)))" "${router_flags[@]}"
  wait_http "$(url "$api1")/readyz" "router r0"
  wait_healthy "$admin1" 2
  local engine=$ENGINE
  if [ "$ENGINE_SIM" = 1 ]; then
    engine=vllm # the sim's metrics are vLLM's, and it has no /props
    python3 "$common/e2echeck.py" features "$(url "$api1")" "$(url "$admin1")" "$MODEL_ALIAS" 2 vllm
  else
    python3 "$here/check.py" features "$(url "$api1")" "$(url "$admin1")" "$MODEL_ALIAS" 2 "$@"
  fi
  grep -q "engine detected.*engine=$engine" "$work/router-features.log" || die "the router did not log the engine detected"
  stop_frontends
  stop_replicas "$rep_feat"
}

phase_x1() { # kvmesh x1: one router over both replicas
  echo "$SUITE: kvmesh x1 ($CONVERSATIONS conversations x $TURNS turns)"
  replicas "$rep_x1"
  start_frontend kvmesh-x1 router-x1 "$(url "$rep_x1")" "$(url $((rep_x1 + 1)))" "${router_flags[@]}"
  bench kvmesh-x1 "$front"
  scrape kvmesh-x1-r0 "$admin1"
  # Every turn reached the client whole (the bench stops reading at [DONE]),
  # so the router counts none as gone (499) and learnt every answer.
  local gone
  gone=$(curl -fsS "$(url "$admin1")/metrics" | awk '/^kvmesh_requests_total\{.*code="499"/ {n += $2} END {print n + 0}')
  [ "$gone" = 0 ] || die "kvmesh x1 counted $gone requests as 499 (client gone) though the bench read every answer to [DONE]"
  stop_frontends
  stop_replicas "$rep_x1"
}

phase_x2() { # kvmesh x2: two routers joined by seed, one replica each, turns alternating
  echo "$SUITE: kvmesh x2 (two routers, one replica each, turns alternating)"
  replicas "$rep_x2"
  start_frontend kvmesh-x2 router-x2 "$(url "$rep_x2")" "$(url $((rep_x2 + 1)))" "${router_flags[@]}"
  bench kvmesh-x2 "$front"
  scrape kvmesh-x2-r1 "$admin1"
  scrape kvmesh-x2-r2 "$admin2"
  stop_frontends
  stop_replicas "$rep_x2"
}

# phase_peer FE NAME BASE: the benchmark (as NAME) through peer router FE
# (smg, vllm-router) over 2 fresh replicas at BASE.
phase_peer() {
  echo "$SUITE: $1 x1 (cache_aware)"
  need_peer "$1"
  replicas "$3"
  start_frontend "$1" "$1" "$(url "$3")" "$(url $(($3 + 1)))"
  bench "$2" "$front"
  stop_frontends
  stop_replicas "$3"
}

phase_rr() { # the round-robin baseline (kvmesh bench --balance)
  echo "$SUITE: round-robin baseline"
  replicas "$rep_rr"
  start balancer bench --balance "127.0.0.1:$lbport" --balance-policy round-robin \
    --backend "$(url "$rep_rr"),$(url $((rep_rr + 1)))"
  wait_http "$(url "$lbport")/v1/models" "the round-robin balancer"
  bench round-robin "$(url "$lbport")"
  stop_frontends
  stop_replicas "$rep_rr"
}

# keep_artifacts PREFIX RESULT... -- FILE...: with KVMESH_ARTIFACTS, copies
# the results' JSON (RESULT.json) and the FILEs there, each named
# PREFIX-NAME. Run before the gates, so that a failed run's are kept too.
keep_artifacts() {
  [ -n "${KVMESH_ARTIFACTS:-}" ] || return 0
  local prefix=$1 f
  shift
  mkdir -p "$KVMESH_ARTIFACTS"
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    if [ -e "$work/$1.json" ]; then cp "$work/$1.json" "$KVMESH_ARTIFACTS/$prefix-$1.json"; fi
    shift
  done
  [ $# -gt 0 ] && shift
  for f in "$@"; do if [ -e "$f" ]; then cp "$f" "$KVMESH_ARTIFACTS/$prefix-${f##*/}"; fi; done
}

# gates: the routers' predicted against reported cached tokens, from
# their per-response debug lines, within 10% for each kvmesh front end
# that ran (check.py predict); with the default phases, the benchmark
# comparison (check.py compare: every turn answered with usage, kvmesh's
# follow-ups more cached than round-robin's, x2's at least 0.97x x1's).
gates() {
  local predicted=()
  if phase x1; then predicted+=("kvmesh-x1=$work/router-x1.log"); fi
  if phase x2; then predicted+=("kvmesh-x2=$work/router-x2-1.log,$work/router-x2-2.log"); fi
  if [ ${#predicted[@]} -gt 0 ]; then python3 "$common/e2echeck.py" predict --gate 0.9,1.1 "${predicted[@]}"; fi
  if [ "$PHASES" = "features x1 x2 rr" ]; then
    if [ "$ENGINE_SIM" = 1 ]; then
      # Printed, not gating: in a short run round-robin can hand each
      # conversation's turns to one sim alternately in step with the
      # turns, and tie kvmesh's share. The dry run checks the plumbing.
      python3 "$common/e2echeck.py" compare "$work/kvmesh-x1.json" "$work/kvmesh-x2.json" "$work/round-robin.json" ||
        echo "$SUITE: ENGINE_SIM=1: the comparison above does not gate the dry run"
      return 0
    fi
    python3 "$common/e2echeck.py" compare "$work/kvmesh-x1.json" "$work/kvmesh-x2.json" "$work/round-robin.json"
  fi
}
