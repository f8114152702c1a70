#!/usr/bin/env bash
# overhead.sh: what a kvmesh router costs against HAProxy, side by side in
# one run (issue 9): both in front of the same instant replica (`kvmesh
# bench --instant-replica`), 8 KB chat bodies, closed-loop clients at
# concurrency 16 and 1, interleaved rounds; then 1,000-token streams
# relayed by each (in rounds too, order rotated) while its process CPU (utime + stime from
# /proc/<pid>/stat) is read before and after. Answer recording is on in
# the router (it owns the replica, so it reads every stream). Go's
# standard reverse proxy (`kvmesh bench --reverse-proxy`) runs alongside
# as the floor of any Go proxy: what kvmesh adds beyond it is its own work;
# and a bare Go TCP relay (`kvmesh bench --tcp-relay`: a read/write loop,
# no HTTP) as the floor of Go's runtime alone.
#
#   internal/lab/bench/overhead.sh            the table
#   internal/lab/bench/overhead.sh --json     JSON
#   HEY=1 internal/lab/bench/overhead.sh      the same front ends under `hey`
#                                         (issue 9's client; one fixed 8 KB
#                                         body), req/s, latency and CPU per request
#
# Environment: BASE_PORT [19300], ROUNDS [3], ROUND [3s], STREAMS [200],
# TOKEN_GAP [1ms] (pause between streamed tokens, so each arrives on its
# own as from a decoding engine), ROUTER_ENV [] (environment of the router,
# e.g. "GOMAXPROCS=1 GOGC=400", or KVMESH_NO_STREAM_LOOP=true for the
# router without its stream loop), BEFORE_REV [] (a git revision: its router
# runs alongside as "kvmesh-before", for a before/after in one run).
# Needs go, curl and haproxy (apt-get install haproxy).
set -euo pipefail
HOST=127.0.0.1
BASE_PORT=${BASE_PORT:-19300}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
bench_init overhead.sh
command -v haproxy >/dev/null || { echo "overhead.sh: haproxy not installed (apt-get install haproxy)" >&2; exit 1; }
bench_build
rep=http://$HOST:$BASE_PORT
"$dir/kvmesh" bench --instant-replica "$HOST:$BASE_PORT" --model bench --token-gap "${TOKEN_GAP:-1ms}" 2>"$dir/replica.log" &
pids+=("$!")
env ${ROUTER_ENV:-} "$dir/kvmesh" router --name overhead --listen "$HOST:$((BASE_PORT + 1))" --gossip-bind "$HOST:$((BASE_PORT + 2))" \
	--admin-listen "$HOST:$((BASE_PORT + 6))" --replica "$rep" --log-level warn 2>"$dir/router.log" &
router_pid=$!
pids+=("$router_pid")
before=()
if [[ -n ${BEFORE_REV:-} ]]; then
	env ${ROUTER_ENV:-} "$dir/kvmesh-before" router --name overhead-before --listen "$HOST:$((BASE_PORT + 7))" --gossip-bind "$HOST:$((BASE_PORT + 8))" \
		--admin-listen "$HOST:$((BASE_PORT + 9))" --replica "$rep" --log-level warn 2>"$dir/router-before.log" &
	pids+=("$!")
	before=(--group "kvmesh-before=http://$HOST:$((BASE_PORT + 7))" --pid "kvmesh-before=$!")
fi
cat >"$dir/haproxy.cfg" <<CFG
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 10m
  timeout server 10m
frontend openai
  bind $HOST:$((BASE_PORT + 3))
  default_backend replica
backend replica
  server r1 $HOST:$BASE_PORT
CFG
"$dir/kvmesh" bench --reverse-proxy "$HOST:$((BASE_PORT + 4))" --direct "$rep" 2>"$dir/stdproxy.log" &
std_pid=$!
pids+=("$std_pid")
"$dir/kvmesh" bench --tcp-relay "$HOST:$((BASE_PORT + 5))" --direct "$rep" 2>"$dir/tcprelay.log" &
tcp_pid=$!
pids+=("$tcp_pid")
haproxy -db -f "$dir/haproxy.cfg" 2>"$dir/haproxy.log" &
haproxy_pid=$!
pids+=("$haproxy_pid")
wait_ok "$rep"
wait_ok "http://$HOST:$((BASE_PORT + 1))"
wait_ok "http://$HOST:$((BASE_PORT + 3))"
wait_ok "http://$HOST:$((BASE_PORT + 4))"
wait_ok "http://$HOST:$((BASE_PORT + 5))"
[[ -n ${BEFORE_REV:-} ]] && wait_ok "http://$HOST:$((BASE_PORT + 7))"
if [[ -n ${HEY:-} ]]; then
	# hey (github.com/rakyll/hey, a Go module: `go run` fetches it through
	# the module proxy) at -c 16 and -c 1, ROUND each, ROUNDS interleaved
	# rounds; CPU is each process's utime + stime over its runs.
	(cd "$dir" && GOFLAGS= GOBIN="$dir" go install github.com/rakyll/hey@v0.1.5)
	python3 - "$dir/body.json" <<'PY'
import sys
filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
s = '{"model":"bench","max_tokens":1,"stream":false,"messages":[{"role":"user","content":"0000000000000001 '
while len(s) < 8192 - 4:
    s += filler[:8192 - 4 - len(s)]
open(sys.argv[1], "w").write(s + '"}]}')
PY
	cpu() { local s; s=$(<"/proc/$1/stat"); s=${s##*) }; set -- $s; echo $((${12} + ${13})); }
	targets=("direct:$BASE_PORT:0" "kvmesh:$((BASE_PORT + 1)):$router_pid" "haproxy:$((BASE_PORT + 3)):$haproxy_pid"
		"go-stdproxy:$((BASE_PORT + 4)):$std_pid" "go-tcp-relay:$((BASE_PORT + 5)):$tcp_pid")
	[[ -n ${BEFORE_REV:-} ]] && targets+=("kvmesh-before:$((BASE_PORT + 7)):${before[3]#kvmesh-before=}")
	printf '%-14s %3s %5s %8s %8s %8s %11s\n' "front end" c round req/s "p50 ms" "p99 ms" "CPU us/req"
	for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
		for c in 16 1; do
			for t in "${targets[@]}"; do
				IFS=: read -r name port pid <<<"$t"
				c0=0; [[ $pid != 0 ]] && c0=$(cpu "$pid")
				out=$("$dir/hey" -z "${ROUND:-3s}" -c "$c" -m POST -T application/json -D "$dir/body.json" "http://$HOST:$port/v1/chat/completions")
				c1=0; [[ $pid != 0 ]] && c1=$(cpu "$pid")
				n=$(awk '/\[200\]/{print $2}' <<<"$out")
				awk -v name="$name" -v c="$c" -v r="$r" -v n="${n:-0}" -v cpu=$((c1 - c0)) '
					/Requests\/sec/ {rps = $2} / 50%%? in / {p50 = $3 * 1000} / 99%%? in / {p99 = $3 * 1000}
					END {printf "%-14s %3d %5d %8.0f %8.3f %8.3f %11s\n", name, c, r, rps, p50, p99, (cpu > 0 && n > 0) ? sprintf("%.1f", cpu * 10000 / n) : "-"}' <<<"$out"
			done
		done
	done
	exit 0
fi
"$dir/kvmesh" bench --overhead --model bench --direct "$rep" \
	--group "kvmesh=http://$HOST:$((BASE_PORT + 1))" --group "haproxy=http://$HOST:$((BASE_PORT + 3))" --group "go-stdproxy=http://$HOST:$((BASE_PORT + 4))" \
	--group "go-tcp-relay=http://$HOST:$((BASE_PORT + 5))" "${before[@]}" \
	--pid "kvmesh=$router_pid" --pid "haproxy=$haproxy_pid" --pid "go-stdproxy=$std_pid" --pid "go-tcp-relay=$tcp_pid" --baseline haproxy \
	--rounds "${ROUNDS:-3}" --round "${ROUND:-3s}" --streams "${STREAMS:-200}" "$@"
