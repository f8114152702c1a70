// Package hopload is the rule by which a router counts its own requests
// to a replica another router owns into that owner's last reported load.
// An owner reports its replica's load as of a moment (a gossip tick old
// at best); the requests this router sent there after that moment are
// not in it, and without them two cold requests this router places
// within one tick both see the replica as idle and land on it while
// another is free. So each request sent after the report adds one in
// flight, and its prefill while the prefill is pending.
//
// The router (proxy) and the simulator (internal/lab/sim) both count by Add,
// each with its own clock: time.Time in a router, Millis in the
// simulator. The package is pure: no network, no locks, no clock of its
// own.
package hopload

// Instant is a point on a router's clock.
type Instant[T any] interface {
	// After reports whether the instant is later than u.
	After(u T) bool
}

// Millis is the simulator's clock: milliseconds of simulated time.
type Millis float64

// After reports whether m is later than u.
func (m Millis) After(u Millis) bool { return m > u }

// Sent is one request a router sent to another router's replica, as the
// load counts it.
type Sent[T Instant[T]] struct {
	// At is when the router dispatched it.
	At T
	// Blocks is the prefill it brings (the blocks the replica lacks).
	Blocks float64
	// Prefilled: its first byte came back, so its prefill is done.
	Prefilled bool
}

// Load is a replica's load as a router counts it: requests in flight and
// the prefill blocks queued.
type Load struct {
	InFlight int
	Pending  float64
}

// Add returns told, the owner's load reported as of heard, with the
// requests of q sent after heard added: one in flight each, and the
// blocks of those not yet prefilled. q holds the router's unfinished
// requests to the replica in dispatch order; sent reads one. The walk
// goes back from the newest to the first not after heard, so a decision
// costs the requests sent since the report, not all those in flight
// (long streams); they are then added oldest first.
func Add[E any, T Instant[T]](told Load, heard T, q []E, sent func(E) Sent[T]) Load {
	i := len(q)
	for i > 0 && sent(q[i-1]).At.After(heard) {
		i--
	}
	for _, e := range q[i:] {
		s := sent(e)
		told.InFlight++
		if !s.Prefilled {
			told.Pending += s.Blocks
		}
	}
	return told
}
