#!/usr/bin/env bash
# End-to-end check of kvmesh with the official openai npm client: builds
# kvmesh, starts 2 simulated replicas and 2 routers (the second joins the
# first's gossip; each fronts one replica) on 127.0.0.1, installs the pinned
# client from package-lock.json into a temp dir, and runs check.mjs against
# each router. Then it does it again with the routers secured: HTTPS with a
# throwaway CA (made here with openssl), mutual TLS between the routers, a
# gossip key, and a client API key; there, cut.mjs: a replica that stalls
# mid-stream behind a third router (--upstream-idle-timeout 500ms), reached
# at that router and over a TLS hop from a fourth, must make the client
# throw APIError from the router's error event. Every child is killed on
# exit. Needs go, node >= 20, npm and openssl. BASE_PORT, when set, draws
# the ports from BASE_PORT to BASE_PORT+99 instead of anywhere below the
# ephemeral range.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
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
for tool in go node npm python3 curl openssl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
  die "node >= 20 is needed, found $(node --version)"

echo "e2e-openai: building kvmesh"
(cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh)

echo "e2e-openai: installing the openai client (npm ci)"
mkdir "$work/npm"
cp "$here/package.json" "$here/package-lock.json" "$here/check.mjs" "$here/cut.mjs" "$work/npm/"
(cd "$work/npm" && npm ci --no-audit --no-fund --loglevel=error) >"$work/npm.log" 2>&1 ||
  { cat "$work/npm.log" >&2; die "npm ci failed"; }

# Nineteen ports the OS says are free, each bound on TCP and UDP (gossip uses
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
    if len(ports) == 19:
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
[ "${#ports[@]}" -eq 19 ] || die "could not pick free ports"
sim1=${ports[0]} sim2=${ports[1]} api1=${ports[2]} api2=${ports[3]} gossip1=${ports[4]} gossip2=${ports[5]}
admin1=${ports[6]} admin2=${ports[7]} tapi1=${ports[8]} tapi2=${ports[9]} tgossip1=${ports[10]} tgossip2=${ports[11]}
stall=${ports[12]} tapi3=${ports[13]} tapi4=${ports[14]} tgossip3=${ports[15]} tgossip4=${ports[16]} admin3=${ports[17]} admin4=${ports[18]}

start() { # start NAME ARGS...: runs kvmesh ARGS in the background, logging to NAME.log
  local name=$1; shift
  "$work/kvmesh" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  last_pid=$!
}

curl_tls=()
# wait_http URL WHAT: polls URL until it answers 200 (bounded: 30 s).
wait_http() {
  local url=$1 what=$2 i
  for ((i = 0; i < 300; i++)); do
    if curl -fsS -o /dev/null --max-time 1 "${curl_tls[@]}" "$url" 2>/dev/null; then return 0; fi
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

# start_routers SCHEME API1 API2 GOSSIP1 GOSSIP2 [FLAGS...]: router r1
# fronts replica 1, r2 replica 2 and joins r1; both ready and both seeing
# both replicas healthy (their /debug/mesh, on the admin port) on return.
start_routers() {
  local scheme=$1 a1=$2 a2=$3 g1=$4 g2=$5; shift 5
  start router1 router --name r1 --listen "127.0.0.1:$a1" --gossip-bind "127.0.0.1:$g1" --admin-listen "127.0.0.1:$admin1" \
    --replica "http://127.0.0.1:$sim1" "${router_flags[@]}" "$@"
  router_pids=("$last_pid")
  wait_http "$scheme://127.0.0.1:$a1/readyz" "router 1"
  start router2 router --name r2 --listen "127.0.0.1:$a2" --gossip-bind "127.0.0.1:$g2" --admin-listen "127.0.0.1:$admin2" \
    --join "127.0.0.1:$g1" --replica "http://127.0.0.1:$sim2" "${router_flags[@]}" "$@"
  router_pids+=("$last_pid")
  wait_http "$scheme://127.0.0.1:$a2/readyz" "router 2"
  local admin
  for admin in "$admin1" "$admin2"; do
    wait_healthy "$admin" 2
  done
}

# Both routers must see both replicas healthy, with the model, before the
# checks: poll each router's mesh view (bounded: 30 s).
healthy_replicas() { # healthy_replicas ADMIN_PORT: how many replicas the router there sees healthy
  curl -fsS --max-time 1 "http://127.0.0.1:$1/debug/mesh" 2>/dev/null | node -e '
    let s = ""; process.stdin.on("data", d => s += d).on("end", () => {
      try { const m = JSON.parse(s);
        console.log((m.replicas || []).filter(r => r.healthy && (r.models || []).includes(process.argv[1])).length);
      } catch { console.log(0); } });' "$model"
}
wait_healthy() { # wait_healthy ADMIN_PORT N: until the router there sees N replicas healthy (30 s)
  local i
  for ((i = 0; ; i++)); do
    [ "$(healthy_replicas "$1")" = "$2" ] && return
    [ "$i" -lt 300 ] || die "router with admin port $1 did not see $2 replica(s) healthy (/debug/mesh)"
    sleep 0.1
  done
}

# A gossip key even in plain HTTP: it authenticates the routers' hops (a
# router with --join refuses to start without one or --insecure-mesh).
(umask 077 && head -c 32 /dev/urandom | base64 >"$work/gossip.key")
start_routers http "$api1" "$api2" "$gossip1" "$gossip2" --gossip-key-file "$work/gossip.key"
for api in "$api1" "$api2"; do
  echo "e2e-openai: check.mjs against router http://127.0.0.1:$api"
  (cd "$work/npm" && KVMESH_URL="http://127.0.0.1:$api" KVMESH_MODEL="$model" node check.mjs) || die "check.mjs failed against router http://127.0.0.1:$api"
done

# The same over TLS with an API key: stop the plain routers (SIGTERM: they
# leave, drain and exit), make a throwaway CA and a certificate for
# 127.0.0.1 that serves and authenticates each router, a gossip key and a
# client key.
for pid in "${router_pids[@]}"; do kill -TERM "$pid"; wait "$pid" || die "a router exited non-zero on SIGTERM"; done
pids=("${pids[@]:0:2}") # the replicas; the routers have exited
pki="$work/pki"
mkdir "$pki"
(
  cd "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 1 \
    -subj /CN=kvmesh-e2e-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout router.key -out router.csr -subj /CN=127.0.0.1
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' >ext.cnf
  openssl x509 -req -in router.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out router.pem -days 1 -extfile ext.cnf
  openssl rand -base64 32 >gossip.key
  echo "sk-e2e-$(openssl rand -hex 16)" >api.keys
) >"$work/pki.log" 2>&1 || { cat "$work/pki.log" >&2; die "openssl failed"; }
api_key=$(cat "$pki/api.keys")
curl_tls=(--cacert "$pki/ca.pem")
tls_flags=(--tls-cert "$pki/router.pem" --tls-key "$pki/router.key" --peer-tls-ca "$pki/ca.pem"
  --peer-tls-cert "$pki/router.pem" --peer-tls-key "$pki/router.key"
  --gossip-key-file "$pki/gossip.key" --api-key-file "$pki/api.keys")
start_routers https "$tapi1" "$tapi2" "$tgossip1" "$tgossip2" "${tls_flags[@]}"
for api in "$tapi1" "$tapi2"; do
  echo "e2e-openai: check.mjs against router https://127.0.0.1:$api (API key, TLS between routers)"
  (cd "$work/npm" && NODE_EXTRA_CA_CERTS="$pki/ca.pem" KVMESH_URL="https://127.0.0.1:$api" KVMESH_API_KEY="$api_key" KVMESH_MODEL="$model" node check.mjs) ||
    die "check.mjs failed against router https://127.0.0.1:$api"
done

# A stream cut mid-body, over TLS: a replica that stalls after two events,
# owned by r3 (idle timeout 500 ms); r4 joins r3 and owns nothing, so its
# requests hop to r3 over mutual TLS. The client must throw APIError at
# both, within 20 s of the stall.
(cd "$work/npm" && KVMESH_MODEL="$model" exec node cut.mjs replica "$stall") >"$work/stall.log" 2>&1 &
pids+=($!)
curl_tls=()
wait_http "http://127.0.0.1:$stall/v1/models" "the stalling replica"
curl_tls=(--cacert "$pki/ca.pem")
start router3 router --name r3 --listen "127.0.0.1:$tapi3" --gossip-bind "127.0.0.1:$tgossip3" --admin-listen "127.0.0.1:$admin3" \
  --replica "http://127.0.0.1:$stall" --upstream-idle-timeout 500ms "${router_flags[@]}" "${tls_flags[@]}"
wait_http "https://127.0.0.1:$tapi3/readyz" "router 3"
start router4 router --name r4 --listen "127.0.0.1:$tapi4" --gossip-bind "127.0.0.1:$tgossip4" --admin-listen "127.0.0.1:$admin4" \
  --join "127.0.0.1:$tgossip3" --upstream-idle-timeout 500ms "${router_flags[@]}" "${tls_flags[@]}"
wait_http "https://127.0.0.1:$tapi4/readyz" "router 4"
for admin in "$admin3" "$admin4"; do
  wait_healthy "$admin" 1
done
for api in "$tapi3" "$tapi4"; do
  echo "e2e-openai: cut.mjs against router https://127.0.0.1:$api"
  (cd "$work/npm" && NODE_EXTRA_CA_CERTS="$pki/ca.pem" KVMESH_URL="https://127.0.0.1:$api" KVMESH_API_KEY="$api_key" KVMESH_MODEL="$model" KVMESH_CUT_BOUND=20 node cut.mjs) ||
    die "cut.mjs failed against router https://127.0.0.1:$api"
done
echo "e2e-openai: passed"
