#!/usr/bin/env bash
# End-to-end check of kvmesh with the official openai Python client: builds
# kvmesh, starts 2 simulated replicas and 2 routers (the second joins the
# first's gossip; each fronts one replica) on 127.0.0.1, installs the pinned
# client (requirements.txt) into a venv in a temp dir, and runs check.py
# against each router; then starts two more routers that cannot gossip,
# each fronting both replicas, and runs keys.py (client routing keys) across
# them; last, cut.py: a replica that stalls mid-stream behind one router
# (--upstream-idle-timeout 500ms), reached at that router and over a hop
# from a second one, must make the client raise APIError from the router's
# error event. Every child is killed on exit. Needs go, python3 >= 3.9 (with
# venv) and curl. BASE_PORT, when set, draws the ports from BASE_PORT to
# BASE_PORT+99 instead of anywhere below the ephemeral range.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-e2e-python.XXXXXX")
pids=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "--- e2e-python FAILED (exit $rc); process logs:" >&2
    for f in "$work"/*.log; do
      [ -e "$f" ] || continue
      echo "--- $(basename "$f") (last 40 lines)" >&2
      tail -n 40 "$f" >&2
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "e2e-python: $*" >&2; exit 1; }
for tool in go python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' ||
  die "python >= 3.9 is needed, found $(python3 --version)"

echo "e2e-python: building kvmesh"
(cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh)

echo "e2e-python: installing the openai client ($(cat "$here/requirements.txt")) into a venv"
python3 -m venv "$work/venv" >"$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; die "python3 -m venv failed (Debian: apt-get install python3-venv)"; }
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$here/requirements.txt" >>"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; die "pip install failed"; }
py="$work/venv/bin/python"

# Ten ports the OS says are free, each bound on TCP and UDP (gossip uses
# both) and held until all are chosen so none repeats. They are drawn
# below the kernel's ephemeral range, so programs binding port 0 at the
# same time (a parallel `go test`) cannot take one before we bind it.
# A command substitution (not < <(...)) waits for python to exit, and so
# to release the ports, before anything binds them.
picked=$(BASE_PORT=${BASE_PORT:-} python3 - <<'EOF'
import os, random, socket
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
lo = max(lo, 12000)
first = 10000
if os.environ.get("BASE_PORT"):
    first = int(os.environ["BASE_PORT"]); lo = first + 100
held, ports = [], []
for _ in range(1000):
    if len(ports) == 21:
        break
    port = random.randrange(first, lo)
    if port in ports:
        continue
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        t.bind(("127.0.0.1", port))
        u.bind(("127.0.0.1", port))
    except OSError:
        t.close(); u.close(); continue
    held += [t, u]; ports.append(port)
print(*ports)
EOF
) || die "could not pick free ports"
read -r -a ports <<<"$picked"
[ "${#ports[@]}" -eq 21 ] || die "could not pick free ports"
sim1=${ports[0]} sim2=${ports[1]} api1=${ports[2]} api2=${ports[3]} gossip1=${ports[4]} gossip2=${ports[5]}
api3=${ports[6]} api4=${ports[7]} gossip3=${ports[8]} gossip4=${ports[9]}
admin1=${ports[10]} admin2=${ports[11]} admin3=${ports[12]} admin4=${ports[13]}
stall=${ports[14]} api5=${ports[15]} api6=${ports[16]} gossip5=${ports[17]} gossip6=${ports[18]} admin5=${ports[19]} admin6=${ports[20]}

start() { # start NAME ARGS...: runs kvmesh ARGS in the background, logging to NAME.log
  local name=$1; shift
  "$work/kvmesh" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
}

# wait_http URL WHAT: polls URL until it answers 200 (bounded: 30 s).
wait_http() {
  local url=$1 what=$2 i
  for ((i = 0; i < 300; i++)); do
    if curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; then return 0; fi
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "a child exited while waiting for $what"; done
    sleep 0.1
  done
  die "timed out waiting for $what ($url)"
}

# Short decode (1 ms/token) so the checks take seconds, not minutes.
model=kvmesh-sim
sim_flags=(--model "$model" --log-level warn --decode-ms-per-token 1 --max-num-seqs 16)
start sim1 replica-sim --listen "127.0.0.1:$sim1" "${sim_flags[@]}"
start sim2 replica-sim --listen "127.0.0.1:$sim2" "${sim_flags[@]}"
wait_http "http://127.0.0.1:$sim1/health" "replica 1"
wait_http "http://127.0.0.1:$sim2/health" "replica 2"

# The routers share a gossip key: it also authenticates their hops (a
# router with --join refuses to start without one or --insecure-mesh).
(umask 077 && head -c 32 /dev/urandom | base64 >"$work/gossip.key")
router_flags=(--region local --gossip-profile test --health-interval 200ms --log-level warn --gossip-key-file "$work/gossip.key")
start router1 router --name r1 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" --admin-listen "127.0.0.1:$admin1" \
  --replica "http://127.0.0.1:$sim1" "${router_flags[@]}"
wait_http "http://127.0.0.1:$api1/readyz" "router 1"
start router2 router --name r2 --listen "127.0.0.1:$api2" --gossip-bind "127.0.0.1:$gossip2" --admin-listen "127.0.0.1:$admin2" \
  --join "127.0.0.1:$gossip1" --replica "http://127.0.0.1:$sim2" "${router_flags[@]}"
wait_http "http://127.0.0.1:$api2/readyz" "router 2"

# Both routers must see both replicas healthy, with the model, before the
# checks: poll each router's mesh view (bounded: 30 s).
healthy_replicas() { # healthy_replicas ADMIN_PORT: how many replicas the router with that admin port sees healthy
  curl -fsS --max-time 1 "http://127.0.0.1:$1/debug/mesh" 2>/dev/null | "$py" -c '
import json, sys
try:
    m = json.load(sys.stdin)
    print(sum(1 for r in m.get("replicas") or [] if r.get("healthy") and sys.argv[1] in (r.get("models") or [])))
except Exception:
    print(0)' "$model"
}
wait_healthy() { # wait_healthy ADMIN_PORT N: until the router there sees N replicas healthy (30 s)
  local i
  for ((i = 0; ; i++)); do
    [ "$(healthy_replicas "$1")" = "$2" ] && return
    [ "$i" -lt 300 ] || die "router with admin port $1 did not see $2 replica(s) healthy (/debug/mesh)"
    sleep 0.1
  done
}
for admin in "$admin1" "$admin2"; do
  wait_healthy "$admin" 2
done

for pair in "$api1 $api2" "$api2 $api1"; do
  read -r api other <<<"$pair"
  echo "e2e-python: check.py against router http://127.0.0.1:$api (its peer: $other)"
  KVMESH_URL="http://127.0.0.1:$api" KVMESH_PEER_URL="http://127.0.0.1:$other" KVMESH_MODEL="$model" "$py" "$here/check.py" ||
    die "check.py failed against router http://127.0.0.1:$api"
done
# Client routing keys: two more routers that cannot gossip (neither joins
# anyone), each fronting both replicas, must place requests that carry the
# same key alike whatever their prompts.
for n in 3 4; do
  api_var=api$n gossip_var=gossip$n admin_var=admin$n
  start "router$n" router --name "r$n" --listen "127.0.0.1:${!api_var}" --gossip-bind "127.0.0.1:${!gossip_var}" --admin-listen "127.0.0.1:${!admin_var}" \
    --replica "http://127.0.0.1:$sim1" --replica "http://127.0.0.1:$sim2" "${router_flags[@]}"
done
for n in 3 4; do
  api_var=api$n admin_var=admin$n api=${!api_var}
  wait_http "http://127.0.0.1:$api/readyz" "router on port $api"
  wait_healthy "${!admin_var}" 2
done
echo "e2e-python: keys.py against routers that cannot gossip"
KVMESH_URLS="http://127.0.0.1:$api3 http://127.0.0.1:$api4" KVMESH_REPLICAS="http://127.0.0.1:$sim1 http://127.0.0.1:$sim2" \
  KVMESH_ADMINS="http://127.0.0.1:$admin3 http://127.0.0.1:$admin4" \
  KVMESH_MODEL="$model" "$py" "$here/keys.py" || die "keys.py failed"
# A stream cut mid-body: a replica that stalls after two events, owned by
# r5 (idle timeout 500 ms); r6 joins r5 and owns nothing, so its requests
# hop to r5. The client must raise APIError at both, within 20 s of the
# stall (the timeout, r6's hop slack of a second, and a loaded machine's).
KVMESH_MODEL="$model" "$py" "$here/cut.py" replica "$stall" >"$work/stall.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$stall/v1/models" "the stalling replica"
start router5 router --name r5 --listen "127.0.0.1:$api5" --gossip-bind "127.0.0.1:$gossip5" --admin-listen "127.0.0.1:$admin5" \
  --replica "http://127.0.0.1:$stall" --upstream-idle-timeout 500ms "${router_flags[@]}"
wait_http "http://127.0.0.1:$api5/readyz" "router 5"
start router6 router --name r6 --listen "127.0.0.1:$api6" --gossip-bind "127.0.0.1:$gossip6" --admin-listen "127.0.0.1:$admin6" \
  --join "127.0.0.1:$gossip5" --upstream-idle-timeout 500ms "${router_flags[@]}"
wait_http "http://127.0.0.1:$api6/readyz" "router 6"
for admin in "$admin5" "$admin6"; do
  wait_healthy "$admin" 1
done
for api in "$api5" "$api6"; do
  echo "e2e-python: cut.py against router http://127.0.0.1:$api"
  KVMESH_URL="http://127.0.0.1:$api" KVMESH_MODEL="$model" KVMESH_CUT_BOUND=20 "$py" "$here/cut.py" ||
    die "cut.py failed against router http://127.0.0.1:$api"
done
echo "e2e-python: passed"
