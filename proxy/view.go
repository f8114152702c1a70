package proxy

import "github.com/kvmesh/kvmesh/route"

// View is what the proxy reads from the mesh and tells it. The mesh
// package implements it; tests use fakes.
type View interface {
	// Candidates appends to dst the healthy replicas that serve model,
	// local and remote, with their summaries, loads and network costs.
	Candidates(model string, dst []route.Candidate) []route.Candidate
	// Locate says how to reach a replica. local reports that this router
	// owns it (forward straight to its URL, which is its ID); otherwise
	// ownerAPI is the base URL ("http://host:port") of the router that does.
	Locate(replicaID string) (ownerAPI string, local bool, ok bool)
	// Models lists the models served anywhere in the mesh, sorted.
	Models() []string
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

// pooledView is a View that lends a request's candidates from a pool
// (the mesh does): at a thousand replicas they are about 200 KB a
// request would otherwise allocate. release returns the storage; the
// proxy calls it when the request no longer reads the candidates.
type pooledView interface {
	PooledCandidates(model string) (cands []route.Candidate, release func())
}
