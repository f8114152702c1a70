// Package fault is kvmesh's fault suite: real `kvmesh router` processes and
// simulated replicas, each in its own Linux network namespace, joined by
// veth pairs to a bridge, with faults injected by signals and nftables.
//
// The suite is behind the build tag fault and needs root:
//
//	go test -tags fault -v ./internal/lab/fault
//	internal/lab/fault/run.sh            (installs iproute2 and nftables first)
//
// See docs/RELIABILITY.md for the scenarios, their bounds and the last
// measured table.
package fault
