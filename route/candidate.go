package route

import (
	"math"

	"github.com/zeebo/xxh3"
)

// Candidate is one replica as the deciding router sees it.
//
// Its layout is the decision's cost: a decision over a thousand replicas
// reads every candidate two or three times, so each byte of the struct is
// a kilobyte per pass. The fields every decision reads of every candidate
// come first and fill 88 bytes (counts as int32, the tier as an int8; the
// times stay float64, as a float32 would change costs and so decisions).
// The engine's fields are one embedded EngineLoad so that a new one
// travels from the adapter to here without a copy at every hop; Go does
// not pack the fields after it into its tail padding (HasLoad's three
// bytes), which costs 8 bytes over the same fields loose, and leaves room
// for a small engine field at no further cost;
// the replica's ID and the slot-timing fields, which only the views and
// the slot wait of a full engine read, are behind the *Detail pointer.
// TestCandidateSize holds the size.
type Candidate struct {
	// Summary answers prefix matches; nil when the router has no summary
	// of the replica that counts.
	Summary Matcher
	// Hash is HashID(ID), precomputed by the view.
	Hash uint64
	// PendingPrefillBlocks is the prefill work queued at the replica, in
	// blocks, that a new request would wait behind.
	PendingPrefillBlocks float64
	// NetworkMs is the cost of reaching the replica from this router.
	NetworkMs float64
	// BlockMs is the replica's prefill time per block; 0 means the
	// policy's default.
	BlockMs float64
	// Detail holds what a decision rarely reads (ID, SeqMs, SlotAgeMs),
	// read through c.ID(), c.SeqMs() and c.SlotAgeMs(), which take nil
	// for the zero Detail: a view (or a test's) that leaves it out costs
	// an empty ID, never a panic on the request path. The view that
	// fills a candidate sets it, to storage of its own: a Candidate
	// copied shares its Detail. Pick reads it only of a candidate with no
	// free slot.
	Detail *Detail
	// InFlight is the number of requests in flight at the replica.
	InFlight int32
	// EngineLoad is the engine's own word on its load (Running, Waiting,
	// Slots, HasLoad), as the engine adapter read it and its owner
	// gossiped it.
	EngineLoad

	// match is filled by Pick. It is an int32 (a prompt of 2^31 blocks is
	// 2 TB of KV) so that it packs with the counts. Pick computes a
	// candidate's slot wait where it needs it instead of storing it, for
	// the same reason.
	match int32
	// Tier groups replicas by network distance (0: this router's region).
	// Cold requests are placed within the nearest tier.
	Tier int8
	// Stale reports that a summary exists but does not count: too old, or
	// its owner is suspect or gone.
	Stale bool
	// LoRA is the replica's word on the request's model as a LoRA
	// adapter (loaded, waiting, room to load it), which the view
	// computes per model from the engine's LoRAs; 0 for a base model.
	// One byte, in what was padding: a decision over base-model
	// candidates reads it once, in its first pass.
	LoRA LoRAFit
	// Role is the part of a request the replica serves (RoleBoth: all
	// of it); a disaggregated request's legs each read it of every
	// candidate, so it sits in the padding too, not in Detail.
	Role Role
	// Held is how many blocks the replica's summary remembers
	// (summary.Summary.Held), alike on every router: a replica that
	// holds far fewer than the others is new or was emptied, and takes
	// a share of the cold requests until it holds more (warmup.go). 0
	// when the view keeps no summary of it. It fills the struct's tail
	// padding, so the warm-up's pass reads it beside the fields the
	// decision's own passes just read, at no cost in size.
	Held int32
}

// Detail is what a decision rarely reads of a candidate.
type Detail struct {
	// ID names the replica the same way on every router (its URL).
	ID string
	// SeqMs is how long a request holds one of those slots on average
	// (prefill and decode), as the router measures on the requests it
	// proxies there; 0 means not measured yet (Policy.DefaultSeqMs).
	// With Slots it turns a full engine's queue into milliseconds: a slot
	// frees every SeqMs/Slots.
	SeqMs float64
	// SlotAgeMs is how long the oldest request in flight at the replica
	// has held it, as the replica's owner knows from the requests it
	// proxies; 0 means unknown. It dates the next free slot: SeqMs after
	// that request began, rather than SeqMs/Slots from now on average —
	// slots that filled in one burst free together, late, and slots held
	// by requests past the mean free soon.
	SlotAgeMs float64
	// FreeMs is the expected time until the first of the requests
	// running at the replica ends, as its owner estimates from how long
	// each has run and the slot times it has seen there
	// (SlotTimes.FreeMs); 0 means unknown (SlotAgeMs then dates the
	// next free slot). It outranks SlotAgeMs: a request running past
	// the mean of heavy-tailed answers is a long one, not one about to
	// end.
	FreeMs float64
	// Own is how many of the requests in flight at the replica this
	// router placed itself (its own dispatches and forwards, not the
	// requests other routers sent to a replica it owns), and Local
	// reports that this router owns the replica. InFlight is exact for
	// the replicas a router owns, with the requests the other routers
	// just sent them, and for the others it is their owner's last state
	// plus this router's own requests since; Own is known alike for
	// every replica. A cold request of a burst onto an idle cluster
	// spreads by it (hashPick).
	Own   int32
	Local bool
	// Bootstrap is a prefill replica's KV bootstrap port (SGLang's
	// disaggregation_bootstrap_port), which a disaggregated request's
	// legs name; 0 when unknown or not a prefill replica.
	Bootstrap uint16
	// Written is how many prefill blocks this router sent the replica
	// over its recent placements (the blocks each placement predicted
	// the replica lacked): what this router added to the replica's cache
	// lately, which pushes older prompts out of it. At equal estimated
	// waits a cold request goes where it is least (scanColdAll). 0 when
	// the view keeps no such record.
	Written float64
}

// Count32 is n as a Candidate's count: saturated at the int32 range
// (a count past two billion is past any engine's).
func Count32(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32))
}

// seqAndAge are c's SeqMs and SlotAgeMs, 0 without a Detail.
func seqAndAge(c *Candidate) (seqMs, slotAgeMs float64) {
	if d := c.Detail; d != nil {
		return d.SeqMs, d.SlotAgeMs
	}
	return 0, 0
}

// ID is the replica's ID ("" without a Detail).
func (c *Candidate) ID() string {
	if c.Detail == nil {
		return ""
	}
	return c.Detail.ID
}

// SeqMs is Detail.SeqMs (0, not measured, without a Detail).
func (c *Candidate) SeqMs() float64 {
	if c.Detail == nil {
		return 0
	}
	return c.Detail.SeqMs
}

// SlotAgeMs is Detail.SlotAgeMs (0, unknown, without a Detail).
func (c *Candidate) SlotAgeMs() float64 {
	if c.Detail == nil {
		return 0
	}
	return c.Detail.SlotAgeMs
}

// HashID returns the rendezvous hash of a replica ID.
func HashID(id string) uint64 { return xxh3.HashString(id) }
