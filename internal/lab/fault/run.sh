#!/usr/bin/env bash
# The fault suite: kvmesh routers and simulated replicas in network
# namespaces, faults by signals and nftables. Needs root and Linux.
#   internal/lab/fault/run.sh             run it
#   internal/lab/fault/run.sh --update    also write the table into docs/RELIABILITY.md
# Installs iproute2 and nftables when missing (CI machines start fresh).
set -euo pipefail
cd "$(dirname "$0")/../../.."

if [ "$(id -u)" != 0 ]; then echo "fault suite: needs root" >&2; exit 1; fi
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y "${need[@]}" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi

# One suite per machine: its namespaces (kvf-*) and addresses (10.77.0.0/24)
# are fixed, so a second run would tear down the first's. Wait for it. The
# cleanup trap is set only once the lock is held: a run stopped while it
# waits (Ctrl-C, SIGTERM, a failed flock under set -e) would otherwise tear
# down the namespaces of the run that holds it.
exec 9>/tmp/kvmesh-fault-suite.lock
if ! flock -n 9; then
  echo "fault suite: another run holds /tmp/kvmesh-fault-suite.lock; waiting for it" >&2
  flock 9
fi

# Whatever happens (a go test timeout kills the suite with SIGKILL), leave
# no namespace, process or /etc/netns entry of the suite behind.
cleanup() {
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^kvf-/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}
trap cleanup EXIT INT TERM

if [ "${1:-}" = "--update" ]; then export KVF_DOC=$PWD/docs/RELIABILITY.md; fi
go vet -tags fault ./internal/lab/fault
go test -tags fault -count=1 -timeout 12m -v ./internal/lab/fault
