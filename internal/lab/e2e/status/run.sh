#!/usr/bin/env bash
# End-to-end check of the router's status page in headless Chromium:
# builds kvmesh, starts 3 simulated replicas and 3 routers in one mesh on
# 127.0.0.1 (r2 and r3 join r1; each fronts one replica), sends a few
# conversation turns through them, then loads every router's status page
# (GET /) with `chromium --headless --dump-dom` and asserts that it
# rendered and lists every router of the mesh as alive and every replica.
# A screenshot of r1's page is kept as a CI artefact:
#   ${KVMESH_ARTIFACTS:-./artifacts}/status.png  (and status-rN.html, the DOMs)
# Installs Debian's chromium package when it is missing (needs root).
# Every child is killed on exit. Needs go, python3 and curl.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
artifacts=${KVMESH_ARTIFACTS:-$PWD/artifacts}
work=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-e2e-status.XXXXXX")
pids=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "--- e2e-status FAILED (exit $rc); process logs:" >&2
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

die() { echo "e2e-status: $*" >&2; exit 1; }
for tool in go python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

# Debian's chromium; installed here when missing (CI runs as root).
chromium_bin=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium_bin" ]; then
  [ "$(id -u)" -eq 0 ] || die "chromium is not installed (apt-get install -y chromium, as root)"
  echo "e2e-status: installing chromium (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends chromium >"$work/apt.log" 2>&1; then
    apt-get update >>"$work/apt.log" 2>&1 &&
      apt-get install -y --no-install-recommends chromium >>"$work/apt.log" 2>&1 ||
      { tail -n 20 "$work/apt.log" >&2; die "apt-get install chromium failed"; }
  fi
  chromium_bin=$(command -v chromium) || die "chromium missing after apt-get install"
fi
echo "e2e-status: $("$chromium_bin" --version 2>/dev/null | head -n 1)"

# browse MODE URL OUT: headless Chromium, one page. --no-sandbox because CI
# runs as root in a container; its own profile so runs do not share state.
browse() {
  local mode=$1 url=$2 out=$3
  local flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
    --no-default-browser-check --disable-extensions --hide-scrollbars --mute-audio
    --user-data-dir="$work/chromium-profile" --window-size=1400,1300)
  case $mode in
    dom) timeout 120 "$chromium_bin" "${flags[@]}" --dump-dom "$url" >"$out" 2>>"$work/chromium.log" ;;
    png) timeout 120 "$chromium_bin" "${flags[@]}" --screenshot="$out" "$url" >>"$work/chromium.log" 2>&1 ;;
  esac
}

echo "e2e-status: building kvmesh"
(cd "$repo" && go build -o "$work/kvmesh" ./cmd/kvmesh)

# Nine ports the OS says are free, each bound on TCP and UDP (gossip uses
# both) and held until all are chosen so none repeats; drawn below the
# kernel's ephemeral range (see internal/lab/e2e/openai/run.sh).
picked=$(python3 - <<'EOF'
import random, socket
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
lo = max(lo, 12000)
held, ports = [], []
for _ in range(2000):
    if len(ports) == 12:
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
[ "${#ports[@]}" -eq 12 ] || die "could not pick free ports"
sims=("${ports[@]:0:3}") apis=("${ports[@]:3:3}") gossips=("${ports[@]:6:3}") admins=("${ports[@]:9:3}")

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

model=kvmesh-sim
sim_flags=(--model "$model" --log-level warn --decode-ms-per-token 1 --max-num-seqs 16)
for i in 0 1 2; do
  start "sim$((i + 1))" replica-sim --listen "127.0.0.1:${sims[i]}" "${sim_flags[@]}"
done
for i in 0 1 2; do wait_http "http://127.0.0.1:${sims[i]}/health" "replica $((i + 1))"; done

# The routers share a gossip key: it also authenticates their hops (a
# router with --join refuses to start without one or --insecure-mesh).
(umask 077 && head -c 32 /dev/urandom | base64 >"$work/gossip.key")
router_flags=(--region local --gossip-profile test --health-interval 200ms --log-level warn --gossip-key-file "$work/gossip.key")
for i in 0 1 2; do
  join=()
  if [ "$i" -gt 0 ]; then join=(--join "127.0.0.1:${gossips[0]}"); fi
  start "router$((i + 1))" router --name "r$((i + 1))" --listen "127.0.0.1:${apis[i]}" \
    --gossip-bind "127.0.0.1:${gossips[i]}" --admin-listen "127.0.0.1:${admins[i]}" --replica "http://127.0.0.1:${sims[i]}" "${join[@]}" "${router_flags[@]}"
  wait_http "http://127.0.0.1:${apis[i]}/readyz" "router r$((i + 1))"
done

# Every router must see 3 alive routers and 3 healthy replicas before the
# page is judged: poll each router's mesh view (bounded: 30 s).
converged() { # converged PORT: prints yes when the router there sees the whole mesh
  curl -fsS --max-time 1 "http://127.0.0.1:$1/debug/mesh" 2>/dev/null | python3 -c '
import json, sys
try:
    m = json.load(sys.stdin)
except ValueError:
    print("no"); sys.exit()
alive = [x for x in m.get("members") or [] if x.get("state") == "alive"]
healthy = [r for r in m.get("replicas") or [] if r.get("healthy") and sys.argv[1] in (r.get("models") or [])]
print("yes" if len(alive) == 3 and len(healthy) == 3 else "no")' "$model" || echo no
}
for admin in "${admins[@]}"; do
  for ((i = 0; ; i++)); do
    [ "$(converged "$admin")" = yes ] && break
    [ "$i" -lt 300 ] || die "router with admin port $admin did not see 3 routers and 3 healthy replicas (/debug/mesh)"
    sleep 0.1
  done
done

# turn ROUTER_PORT N: turn N of a conversation (its earlier turns as
# history), so later turns find their prefix cached.
system=$(printf 'You are a careful assistant who explains distributed systems. %.0s' {1..20})
turn() {
  local api=$1 n=$2 msgs="" k
  for ((k = 1; k <= n; k++)); do
    if [ -n "$msgs" ]; then msgs+=","; fi
    msgs+="{\"role\":\"user\",\"content\":\"Question $k about gossip, Bloom filters and prefix caches.\"}"
    if [ "$k" -lt "$n" ]; then msgs+=",{\"role\":\"assistant\",\"content\":\"Answer $k.\"}"; fi
  done
  curl -fsS --max-time 30 -o /dev/null -H 'Content-Type: application/json' \
    -d "{\"model\":\"$model\",\"max_tokens\":8,\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},$msgs]}" \
    "http://127.0.0.1:$api/v1/chat/completions" || die "chat completion through port $api failed"
}

# Three rounds of traffic, each followed by a view of every page (spaced
# more than half the refresh period apart, so each view is a history
# sample and the last one draws sparklines).
for round in 1 2 3; do
  for api in "${apis[@]}"; do turn "$api" "$round"; done
  sleep 1 # one gossip round or so, so summaries spread
  for admin in "${admins[@]}"; do curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$admin/"; done
  if [ "$round" -lt 3 ]; then sleep 2.6; fi
done

mkdir -p "$artifacts"
for i in 0 1 2; do
  name="r$((i + 1))" url="http://127.0.0.1:${admins[i]}/"
  dom="$artifacts/status-$name.html"
  echo "e2e-status: chromium --dump-dom $url"
  browse dom "$url" "$dom" || die "chromium could not load $url (see chromium.log)"
  grep -q "data-router=\"$name\"" "$dom" || die "$name: the page did not render (no data-router) in $dom"
  grep -q '<svg' "$dom" || die "$name: no inline SVG in $dom"
  grep -q 'http-equiv="refresh"' "$dom" || die "$name: the page does not refresh itself"
  grep -q 'id="decisions"' "$dom" || die "$name: no decisions section in $dom"
  for j in 1 2 3; do
    grep -q "data-member=\"r$j\" data-state=\"alive\"" "$dom" || die "$name: router r$j is not listed as alive in $dom"
  done
  for s in "${sims[@]}"; do
    grep -q "data-replica=\"http://127.0.0.1:$s\"" "$dom" || die "$name: replica http://127.0.0.1:$s is not listed in $dom"
  done
done

png="$artifacts/status.png"
rm -f "$png"
echo "e2e-status: chromium --screenshot $png"
browse png "http://127.0.0.1:${admins[0]}/" "$png" || die "chromium could not take the screenshot (see chromium.log)"
[ -s "$png" ] && [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  die "no PNG screenshot at $png"
echo "e2e-status: passed; screenshot $png ($(wc -c <"$png") bytes)"
