package route

import "fmt"

// Policy holds the tunables of the decision. docs/DESIGN.md gives the
// reason for each default and the grid of simulations that checks it
// (docs/SIMULATION.md); DefaultPolicy is the "default" profile.
type Policy struct {
	// LoadFactor is the bound c of consistent hashing with bounded loads,
	// applied to cold placement on queued prefill: a replica takes a cold
	// request only while its queued prefill is within c times the mean
	// plus the request's own work. 1.25 is the value of the original
	// paper's experiments, HAProxy's hash-balance-factor documentation and
	// SMG's prefix hash. Warm requests are not held to it: their score
	// already weighs queued work against the recompute a move would cost.
	LoadFactor float64
	// InFlightFactor bounds in-flight requests at that many times the
	// mean, counting one more request per replica so that a small cluster
	// with a handful of requests never trips it (the bound is
	// ceil(f × (in-flight + replicas) / replicas), 4 with 3 requests on 4
	// replicas). A replica known to have a free sequence slot is never
	// held to it: it can start the request at once (with unknown slots:
	// fewer in flight than it was seen running, EngineLoad.MinSlots). It is a hot-spot guard
	// for engines whose slots are unknown, not a balancer.
	InFlightFactor float64
	// KeyBlocks is the minimum depth, in blocks, of a cold request's key;
	// the key is the block after the common prefix, and at least block
	// KeyBlocks-1. Two blocks skip a one-block system prompt even when the
	// common prefix is unknown (no summaries), so a router that sees
	// nothing keys a conversation where a router that sees everything does.
	KeyBlocks int
	// MinExcessBlocks is how many blocks beyond the common prefix a match
	// must hold to count as a prefix hit. One block is the smallest reuse
	// the hashing can see.
	MinExcessBlocks int
	// DefaultBlockMs is the prefill time per block used when the view has
	// no measured one. Only its ratio to NetworkMs and SeqMs matters; 20 ms
	// is 256 tokens at ~13k tokens/s, a mid-size model on one modern GPU.
	DefaultBlockMs float64
	// RecomputeWeight is what a block the replica lacks costs in the
	// score, in units of its prefill time. Recomputing a prefix that
	// another replica holds costs this request the prefill, and costs the
	// cluster a second copy of the prefix (evicting someone else's blocks)
	// and the queueing of every request behind that work; 1 would count
	// only the first. A warm request moves off its holder only when the
	// wait it saves exceeds RecomputeWeight times the prefill it adds.
	RecomputeWeight float64
	// DefaultSeqMs is how long a request holds a sequence slot when the
	// router has not measured it yet (Candidate.SeqMs is 0). It only
	// prices the wait at an engine whose slots are full before the first
	// request there has finished.
	DefaultSeqMs float64
	// WarmShare is the share of cold requests (by their key) that a
	// warming replica, one holding less than half the mean of its tier's
	// blocks (new, or emptied by a restart), takes while it can start
	// them at once (warmup.go); 0 turns the warm-up off. 1/2: a warming
	// replica gets half the new prompts, at least N/2 times its share of
	// N replicas, so it fills in a fraction of the time the others took,
	// and the other half keeps spreading by the usual rule, so the new
	// conversations that return to it for their next turns stay a
	// bounded part of all.
	WarmShare float64
	// seqMs is the time a request holds a sequence slot, pooled over a
	// decision's candidates (pooledSeqMs); Pick sets it on its own copy
	// when some candidate has no free slot, and a slot wait reads it in
	// place of the candidate's own SeqMs. 0 outside a decision.
	seqMs float64
}

// DefaultPolicy returns the documented defaults, the "default" profile.
func DefaultPolicy() Policy {
	return Policy{LoadFactor: 1.25, InFlightFactor: 2, KeyBlocks: 2, MinExcessBlocks: 1, DefaultBlockMs: 20,
		RecomputeWeight: 16, DefaultSeqMs: 10000, WarmShare: 0.5}
}

// PolicyError is a tunable of Policy out of its range: Field is the
// Policy field's name, so that a caller that binds the tunables to its own
// names (flags, environment) can report the name its user set.
type PolicyError struct {
	Field string
	Value float64
	// Want is the range the field must lie in (">= 1", "> 0").
	Want string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("route: %s %v, want %s", e.Field, e.Value, e.Want)
}

// Validate reports the first tunable of p outside the range the decision
// is defined on, as a *PolicyError: a load or in-flight factor under 1
// would bound a replica below the mean and refuse every cold request, a
// key under one block has no block to key on, a recompute weight under 1
// would price a missing block below its own prefill, and a non-positive
// default time would make an unmeasured replica free.
func (p Policy) Validate() error {
	checks := []struct {
		field string
		v     float64
		ok    bool
		want  string
	}{
		{"LoadFactor", p.LoadFactor, p.LoadFactor >= 1, ">= 1"},
		{"InFlightFactor", p.InFlightFactor, p.InFlightFactor >= 1, ">= 1"},
		{"KeyBlocks", float64(p.KeyBlocks), p.KeyBlocks >= 1, ">= 1"},
		{"DefaultBlockMs", p.DefaultBlockMs, p.DefaultBlockMs > 0, "> 0"},
		{"RecomputeWeight", p.RecomputeWeight, p.RecomputeWeight >= 1, ">= 1"},
		{"DefaultSeqMs", p.DefaultSeqMs, p.DefaultSeqMs > 0, "> 0"},
		{"WarmShare", p.WarmShare, p.WarmShare >= 0 && p.WarmShare <= 1, "in [0, 1]"},
	}
	for _, c := range checks {
		if !c.ok {
			return &PolicyError{Field: c.field, Value: c.v, Want: c.want}
		}
	}
	return nil
}
