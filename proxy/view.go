package proxy

import (
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// View is what the proxy reads from the mesh and tells it. The mesh
// package implements it; tests use fakes, which implement all of it, so
// that every test runs the proxy the router runs.
type View interface {
	Replicas
	Ledger
	Peers
}

// Replicas is the mesh's replicas as a decision reads them.
type Replicas interface {
	// PooledCandidates returns the healthy replicas that serve model,
	// local and remote, with their summaries, loads and network costs,
	// sorted by ID, in storage lent from a pool: at a thousand replicas
	// they are about 200 KB a request would otherwise allocate. release
	// returns the storage; the proxy calls it once, when the request no
	// longer reads the candidates.
	PooledCandidates(model string) (cands []route.Candidate, release func())
	// Locate says how to reach a replica. local reports that this router
	// owns it (forward straight to its URL, which is its ID); otherwise
	// ownerAPI is the base URL ("http://host:port") of the router that does.
	Locate(replicaID string) (ownerAPI string, local bool, ok bool)
	// Models lists the models served anywhere in the mesh, sorted.
	Models() []string
}

// Ledger is what the proxy tells the mesh of its owned replicas.
type Ledger interface {
	// Record tells the replica's summary that the replica now holds these
	// blocks. Only the owner's call has an effect.
	Record(replicaID string, hashes []uint64)
	// Forget tells the replica's summary that the replica does not hold
	// these blocks (its engine reported fewer cached tokens than the
	// summary predicted). Only the owner's call has an effect.
	Forget(replicaID string, hashes []uint64)
	// Begin accounts a request dispatched to an owned replica: one more in
	// flight and prefillBlocks more pending prefill. firstByte ends the
	// pending prefill; done ends the request. Both are idempotent.
	Begin(replicaID string, prefillBlocks float64) (firstByte, done func())
}

// Peers is what the proxy reads of the other routers.
type Peers interface {
	// LoadHeard reports when the load of a replica another router owns
	// was last heard from its owner (ok false: never). The proxy adds
	// its own requests sent there since (hop.Book), and prefers owners
	// heard since a failed hop began (hop.go).
	LoadHeard(replicaID string) (at time.Time, ok bool)
	// WatchGone calls gone with the API base URL of every router that
	// left or failed, until stop is called; gone must not block. The
	// proxy ends the hops to such an owner that do not answer
	// (hop.Owners).
	WatchGone(gone func(api string)) (stop func())
}
