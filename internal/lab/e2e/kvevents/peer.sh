#!/usr/bin/env bash
# peer.sh: how soon a peer router's view reflects an engine's eviction.
# Runs TestKVEventEvictionReachesThePeer (a replica-sim publishing KV
# events behind router a with --kv-events auto, router b joined by gossip)
# RUNS times with each gossip timing profile, test (state every 50 ms,
# gossip every 20 ms) and lan (the default: memberlist's LAN timings, state
# every 200 ms), and prints each logged latency (the engine publishing the
# BlockRemoved to b's copy of the summary dropping the evicted blocks) and
# their median and maximum. The unit test asserts only that the eviction
# arrives; the latency is measured here. Env: RUNS [5].
# With KVMESH_VLLM_URL (a real vLLM server publishing KV events, its cache
# small enough that a few 1,400-token prompts evict: ../vllm/run.sh's
# peer phase starts one) it runs TestKVEventEvictionReachesThePeerOnVLLM
# instead, timed from vLLM's own timestamp on the batch with the first
# BlockRemoved. KVMESH_TEST_BIN: a test binary built beforehand with
# `go test -c ./cmd/kvmesh` (else go test builds one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
cd "$repo"
test='^TestKVEventEvictionReachesThePeer$'
if [ -n "${KVMESH_VLLM_URL:-}" ]; then test='^TestKVEventEvictionReachesThePeerOnVLLM$'; fi
for profile in test lan; do
echo "gossip profile $profile:"
if [ -n "${KVMESH_TEST_BIN:-}" ]; then # a prebuilt `go test -c ./cmd/kvmesh`
  run=(env KVMESH_TEST_GOSSIP=$profile "$KVMESH_TEST_BIN" -test.run "$test" -test.count "${RUNS:-5}" -test.v)
else
  run=(env KVMESH_TEST_GOSSIP=$profile go test . -run "$test" -count "${RUNS:-5}" -v)
fi
(cd "$repo/cmd/kvmesh" && "${run[@]}") 2>&1 | tee -a "${PEER_LOG:-/dev/null}" |
  grep -o 'peer eviction latency [0-9.]*[mµn]*s' | awk '{print $4}' |
  python3 -c '
import re, sys
unit = {"s": 1000, "ms": 1, "µs": 1e-3, "us": 1e-3, "ns": 1e-6}
v = []
for line in sys.stdin:
    m = re.fullmatch(r"([0-9.]+)([a-zµ]+)", line.strip())
    if m:
        v.append(float(m.group(1)) * unit[m.group(2)])
if not v:
    sys.exit("no latency logged (did the test fail?)")
v.sort()
print("peer eviction latency (ms):", " ".join(f"{x:.0f}" for x in v))
print(f"runs {len(v)}, median {v[len(v) // 2]:.0f} ms, max {v[-1]:.0f} ms")
'
done
