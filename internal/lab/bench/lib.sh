# lib.sh: what the benchmark scripts of this folder share (sourced, not
# run): a scratch directory, the processes they start (stopped in reverse
# order on exit), kvmesh built from this tree and, with BEFORE_REV, from a
# revision, and a wait for a front end to answer a chat request.
#
#   source "$here/lib.sh"; bench_init NAME
#
# sets repo, dir, pids; bench_build builds $dir/kvmesh and, with
# BEFORE_REV set, $dir/kvmesh-before; wait_ok URL waits (30 s at most)
# for a 200 from URL's /v1/chat/completions (model "bench"); it fails
# (status 1) if none came, which ends a script under set -e.

bench_init() {
	bench_name=$1
	repo=$(cd "$here/../../.." && pwd)
	dir=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-$bench_name.XXXXXX")
	while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^KVMESH_' || true)
	pids=()
	trap bench_cleanup EXIT
	trap 'exit 130' INT TERM
}

bench_cleanup() {
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do wait "${pids[i]}" 2>/dev/null || true; done
	rm -rf "$dir"
}

bench_build() {
	(cd "$repo" && go build -o "$dir/kvmesh" ./cmd/kvmesh)
	if [[ -n ${BEFORE_REV:-} ]]; then
		mkdir "$dir/before"
		(cd "$repo" && git archive "$BEFORE_REV") | tar -x -C "$dir/before"
		(cd "$dir/before" && go build -o "$dir/kvmesh-before" ./cmd/kvmesh)
	fi
}

wait_ok() {
	local tries=0
	until [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H 'Content-Type: application/json' \
		-d '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' "$1/v1/chat/completions" || true) == 200 ]]; do
		((++tries > 300)) && { echo "$bench_name: $1 not ready" >&2; return 1; }
		sleep 0.1
	done
}
