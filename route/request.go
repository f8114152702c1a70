package route

import (
	"github.com/kvmesh/kvmesh/summary"
)

// Request is a request as the router sees it: its chained block hashes.
type Request struct {
	// Hashes are the chained block hashes of the prompt.
	Hashes []uint64
	// Probes are summary.MakeProbes(nil, Hashes).
	Probes []summary.Probe
	// Root is the chain root (model scope).
	Root uint64
	// Whole is the hash of a prompt shorter than one block (no Hashes):
	// its whole text, chained from Root (summary.Contract.ShortKey).
	// It is such a prompt's cold key and heat key, so that short
	// distinct prompts spread by rendezvous hashing while identical ones
	// still meet; 0 means unknown, and Root stands in for it.
	Whole uint64
	// Model is ModelKey of the requested model's name: when the model is
	// a LoRA adapter (Candidate.LoRA), the rendezvous key of its loads,
	// so that every router loads an adapter loaded nowhere on the same
	// replica. 0 means Root stands in for it.
	Model uint64
	// ClientKey is the hash of a routing key the client sent
	// (prompt_cache_key, a session header, bootstrap_room); 0 when none.
	// When set it is the cold-placement key, so every router places the
	// client's requests alike whatever their prompts; prefix summaries still
	// decide warm requests.
	ClientKey uint64
	// Concurrent is how many requests sharing this request's HeatKey the
	// router has in flight, this one included; 0 means unknown (as 1). A
	// prefix many requests want at once is worth a second copy: the
	// recompute of a move is shared by the requests that copy will serve,
	// so when they outnumber the prefix's holders and no holder can start
	// the request at once (a free slot and no prefill queued), a move's
	// recompute weighs 1 instead of RecomputeWeight.
	Concurrent int
	// ForkBlocks is the depth, in blocks, of a stem this request shares
	// with the last request of its heat key without extending it
	// (Stem.Fork): a template, a document or a few-shot prompt that
	// requests leave by different continuations, whose copies serve
	// other requests, rather than a conversation's history, which only
	// its next turn extends. 0 when none is known.
	ForkBlocks int

	// loraPlaced: the LoRA scorer chose the candidates (pickLoRA), and
	// the decision among them is the usual one.
	loraPlaced bool
}

// Stem is what a router remembers of the last request it decided under a
// heat key, to tell a stem many requests fork from (a hot template or
// document) from a conversation's history: that request's length in
// blocks, its best match when it was decided (the prefix some replica
// held) and the chained hash of that prefix. The zero value knows nothing.
// It is a value: the router keeps one per heat key, in a bounded map.
type Stem struct {
	Len, Depth int
	Hash       uint64
}

// Fork is the stem depth req shares with the request s remembers: the
// prefix that request matched, when req holds it too and is no longer than
// that request (so it does not extend it: a conversation's next turn
// holds its previous turn and is longer), else 0.
func (s Stem) Fork(req Request) int {
	d := s.Depth
	if d <= 0 || d > len(req.Hashes) || len(req.Hashes) > s.Len || req.Hashes[d-1] != s.Hash {
		return 0
	}
	return d
}

// StemOf is the record a router keeps of req, decided with best match
// match (Decision.BestMatch), for the next request of its heat key.
func StemOf(req Request, match int) Stem {
	if match <= 0 || match > len(req.Hashes) {
		return Stem{Len: len(req.Hashes)}
	}
	return Stem{Len: len(req.Hashes), Depth: match, Hash: req.Hashes[match-1]}
}

// HeatKey is the key a router counts in-flight requests by for
// Request.Concurrent: the chained hash of block KeyBlocks-1 (the prompt's
// head, past a one-block system prompt), or a shorter prompt's Whole hash.
// A hot prompt's requests share it; a conversation's turns share it but
// arrive one at a time.
func (p Policy) HeatKey(req Request) uint64 {
	if len(req.Hashes) == 0 {
		return req.shortKey()
	}
	return req.Hashes[min(len(req.Hashes)-1, max(p.KeyBlocks-1, 0))]
}

// shortKey is the key of a prompt shorter than one block: its Whole
// hash, else its Root.
func (r Request) shortKey() uint64 {
	if r.Whole != 0 {
		return r.Whole
	}
	return r.Root
}
