#!/usr/bin/env bash
# End-to-end check of kvmesh with the official openai npm client: builds
# kvmesh, starts 2 simulated replicas and 2 routers (the second joins the
# first's gossip; each fronts one replica) on 127.0.0.1, installs the pinned
# client from package-lock.json into a temp dir, and runs check.mjs against
# each router. Every child is killed on exit. Needs go, node >= 20 and npm.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-e2e-openai.XXXXXX")
pids=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "--- e2e-openai FAILED (exit $rc); process logs:" >&2
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

die() { echo "e2e-openai: $*" >&2; exit 1; }
for tool in go node npm python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
  die "node >= 20 is needed, found $(node --version)"

echo "e2e-openai: building kvmesh"
(cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh)

echo "e2e-openai: installing the openai client (npm ci)"
mkdir "$work/npm"
cp "$here/package.json" "$here/package-lock.json" "$here/check.mjs" "$work/npm/"
(cd "$work/npm" && npm ci --no-audit --no-fund --loglevel=error) >"$work/npm.log" 2>&1 ||
  { cat "$work/npm.log" >&2; die "npm ci failed"; }

# Six ports the OS says are free, each bound on TCP and UDP (gossip uses
# both) and held until all are chosen so none repeats. They are drawn
# below the kernel's ephemeral range, so programs binding port 0 at the
# same time (a parallel `go test`) cannot take one before we bind it.
# A command substitution (not < <(...)) waits for python to exit, and so
# to release the ports, before anything binds them.
picked=$(python3 - <<'EOF'
import random, socket
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
lo = max(lo, 12000)
held, ports = [], []
for _ in range(1000):
    if len(ports) == 6:
        break
    port = random.randrange(10000, lo)
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
[ "${#ports[@]}" -eq 6 ] || die "could not pick free ports"
sim1=${ports[0]} sim2=${ports[1]} api1=${ports[2]} api2=${ports[3]} gossip1=${ports[4]} gossip2=${ports[5]}

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

router_flags=(--region local --gossip-profile test --health-interval 200ms --log-level warn)
start router1 router --name r1 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" \
  --replica "http://127.0.0.1:$sim1" "${router_flags[@]}"
wait_http "http://127.0.0.1:$api1/readyz" "router 1"
start router2 router --name r2 --listen "127.0.0.1:$api2" --gossip-bind "127.0.0.1:$gossip2" \
  --join "127.0.0.1:$gossip1" --replica "http://127.0.0.1:$sim2" "${router_flags[@]}"
wait_http "http://127.0.0.1:$api2/readyz" "router 2"

# Both routers must see both replicas healthy, with the model, before the
# checks: poll each router's mesh view (bounded: 30 s).
healthy_replicas() { # healthy_replicas PORT: how many replicas the router there sees healthy
  curl -fsS --max-time 1 "http://127.0.0.1:$1/debug/mesh" 2>/dev/null | node -e '
    let s = ""; process.stdin.on("data", d => s += d).on("end", () => {
      try { const m = JSON.parse(s);
        console.log((m.replicas || []).filter(r => r.healthy && (r.models || []).includes(process.argv[1])).length);
      } catch { console.log(0); } });' "$model"
}
for api in "$api1" "$api2"; do
  for ((i = 0; ; i++)); do
    [ "$(healthy_replicas "$api")" = 2 ] && break
    [ "$i" -lt 300 ] || die "router on port $api did not see both replicas healthy (/debug/mesh)"
    sleep 0.1
  done
done

for api in "$api1" "$api2"; do
  echo "e2e-openai: check.mjs against router http://127.0.0.1:$api"
  (cd "$work/npm" && KVMESH_URL="http://127.0.0.1:$api" KVMESH_MODEL="$model" node check.mjs) || die "check.mjs failed against router http://127.0.0.1:$api"
done
echo "e2e-openai: passed"
