package route

import "math"

// A candidate's load as the decision reads it: the estimated wait to
// start a request (queued prefill and slot wait), the in-flight and
// queue bounds that keep a hot prefix from collapsing onto one replica,
// and the engine's sequence slots learned from its scraped counts.

// blockMs is a candidate's prefill time per block.
func (p *Policy) blockMs(c *Candidate) float64 {
	if c.BlockMs > 0 {
		return c.BlockMs
	}
	return p.DefaultBlockMs
}

// waitMs is a candidate's estimated wait to start a request: its queued
// prefill and its slot wait, in ms.
func (p *Policy) waitMs(c *Candidate) float64 {
	slot := 0.0
	if slotsAhead(c) > 0 {
		slot = p.slotWaitMs(c)
	}
	return p.blockMs(c)*c.PendingPrefillBlocks + slot
}

// slotWaitMs estimates how long a new request would wait at c for a
// sequence slot: nothing while one is free, else the time for enough of
// them to free: the first when the owner expects the first running
// request to end (FreeMs, from the slot times it has seen and how long
// each has run), or without that estimate when the oldest request in
// flight ends (SeqMs after it began) when the router knows its age, the
// rest one every SeqMs/Slots. The router's in-flight count is
// the fast signal of how many requests the engine holds; with unknown
// slots the last scrape's waiting count says whether it queues.
func (p *Policy) slotWaitMs(c *Candidate) float64 {
	ahead := slotsAhead(c)
	if ahead <= 0 {
		return 0
	}
	slots := int(c.Slots)
	if slots <= 0 { // ahead > 0 with unknown slots: the engine queues
		slots = max(int(c.Running), 1)
	}
	seqMs, slotAgeMs := seqAndAge(c)
	if p.seqMs > 0 {
		seqMs = p.seqMs
	}
	seq := seqMs
	if seq <= 0 {
		seq = p.DefaultSeqMs
	}
	per := seq / float64(slots)
	if d := c.Detail; d != nil && d.FreeMs > 0 {
		return d.FreeMs + float64(ahead-1)*per
	}
	if slotAgeMs > 0 && seqMs > 0 {
		// The first slot frees when the oldest request ends, the rest
		// one every SeqMs/Slots after it.
		return max(seq-slotAgeMs, 0) + float64(ahead-1)*per
	}
	return float64(ahead) * per
}

// poolSample bounds the candidates pooledSeqMs reads: a decision over
// a thousand candidates reads 64 Details, not all of them (the mean of
// 64 running means varies an eighth as much as one).
const poolSample = 64

// pooledSeqMs is the mean SeqMs of the candidates that have one and
// whose view counts (not stale), at most poolSample of them taken at an
// even stride; 0 when none has one.
//
// Why pooled: how long a request holds a slot is set by the requests
// (their answers' lengths, at a decode-bound engine), which the same
// routers send to every replica alike, not by the replica. A replica's
// own SeqMs is a running mean of weight 1/16 over heavy-tailed times:
// one long answer lifts it for the next dozen, and between long ones
// it sits below the mean. Priced each by its own, two full replicas'
// queues compare by that noise (a queue of 160 priced below one of 112
// at another replica whose last answers were longer), and so does a
// holder's queue against the recompute of a move. The mean over the
// candidates estimates the same expected slot time with a fraction of
// the variance, alike for every replica in one decision; the running
// requests' ages (FreeMs, SlotAgeMs) stay the replica's own. It
// assumes the replicas decode at about one speed: a replica twice as
// slow is priced as the others.
func pooledSeqMs(cands []Candidate) float64 {
	sum, k := 0.0, 0
	stride := max(1, len(cands)/poolSample)
	for i := 0; i < len(cands) && k < poolSample; i += stride {
		c := &cands[i]
		if d := c.Detail; d != nil && !c.Stale && d.SeqMs > 0 && !math.IsInf(d.SeqMs, 1) {
			sum += d.SeqMs
			k++
		}
	}
	if k == 0 {
		return 0
	}
	return sum / float64(k)
}

// slotsAhead is how many sequence slots must free before c starts a new
// request: its in-flight count past its slots, or with unknown slots the
// last scrape's waiting count and this request; 0 or less when one is
// free (or none is known to be taken). It inlines where slotWaitMs does
// not: a decision asks each of a thousand candidates, most of which have
// a free slot, and calls slotWaitMs only for the others.
func slotsAhead(c *Candidate) int {
	switch {
	case c.Slots > 0:
		return int(c.InFlight) + 1 - int(c.Slots)
	case c.Waiting > 0:
		return int(c.Waiting) + 1
	}
	return 0
}

// InFlightBound is the most requests a candidate may have in flight for
// Pick to admit one more, unless it can start it at once: the
// hot-spot guard over cands, stale ones not counted. A router serving a
// forwarded hint uses it to tell "full" from the decider's snapshot noise.
func (p Policy) InFlightBound(cands []Candidate) int {
	inFlight, known := 0, 0
	for i := range cands {
		if !cands[i].Stale {
			inFlight += int(cands[i].InFlight)
			known++
		}
	}
	return p.inFlightBound(inFlight, max(known, 1))
}

// KeepHint is the owner's check of a decision another router made for
// one of its replicas, cands[i], with the owner's exact view of its own
// replicas (the decider's view of them is up to a gossip interval old, and
// blind to the other routers' dispatches since): it keeps the hint while
// the replica can start the request at once (a free sequence slot, nothing
// waiting), its queued prefill is within LoadFactor times the mean, and
// it is under twice the in-flight bound. Otherwise the owner decides again
// among its own replicas with Pick. Requests that
// several routers sent in the same instant then spread at the owner
// instead of piling on the replica that looked idle to all of them.
func (p Policy) KeepHint(cands []Candidate, i int) bool {
	c := &cands[i]
	if !canStart(c) {
		return false
	}
	inFlight, known, pending := 0, 0, 0.0
	for j := range cands {
		if !cands[j].Stale {
			inFlight += int(cands[j].InFlight)
			pending += cands[j].PendingPrefillBlocks
			known++
		}
	}
	known = max(known, 1)
	if !idle(c) && int(c.InFlight)+1 > 2*p.inFlightBound(inFlight, known) {
		return false
	}
	return c.PendingPrefillBlocks <= p.LoadFactor*pending/float64(known)
}

// queueBound is the most requests an engine may queue for slots for Pick
// to add one more: InFlightFactor times the mean queue with one more
// request per replica, so that with little queueing anywhere a holder may
// queue a few before its requests spill.
func (p Policy) queueBound(queued, known int) int {
	return int(math.Ceil(p.InFlightFactor * float64(queued+known) / float64(known)))
}

func (p Policy) inFlightBound(inFlight, known int) int {
	return int(math.Ceil(p.InFlightFactor * float64(inFlight+1) / float64(known)))
}

// limits are the bounded-load limits of one decision.
type limits struct {
	inFlight int     // for engines of unknown slots
	queued   int     // requests waiting for a slot
	work     float64 // queued prefill, for cold placement
	cold     bool    // placement by hashing: also skip replicas that would queue it
	blocks   int     // the request's blocks
}

// admits is the hot-spot guard. An engine that holds at least half of the
// request and can start it at once (a free slot, nothing waiting) with
// less prefill queued than the blocks it holds — so it is still the
// quickest place for the request, and no prefill hot spot — always admits
// it: a conversation's next turn stays. Any other admits it while its
// queue for slots stays within the bound on queued requests
// (InFlightFactor times the mean queue, plus one per replica) — a hot
// prefix whose holder queues far more than the others spills to the next
// holder, which then holds it too — and, when its slots are unknown, while
// its in-flight count stays within InFlightFactor times the mean or below
// the most it has been seen running with nothing waiting (seenFree).
func (l limits) admits(c *Candidate) bool {
	if c.Stale {
		return true
	}
	if l.cold && (c.PendingPrefillBlocks > l.work || !canStart(c)) {
		return false
	}
	if !l.cold && canStart(c) && 2*int(c.match) >= l.blocks && c.PendingPrefillBlocks <= float64(c.match) {
		return true
	}
	q := queuedAt(c)
	if q > 0 && q+1 > l.queued {
		return false
	}
	// With known slots the queue says all; otherwise the in-flight count
	// stands in for it.
	return c.Slots > 0 || seenFree(c) || int(c.InFlight)+1 <= l.inFlight
}

// PoolSlots gives each candidate whose sequence slots are unknown the
// count that the candidates knowing theirs share, when they all agree and
// the unknown one has not been seen running more (MinSlots, Running).
// An engine that publishes no slot count (vLLM) has it learnt only at
// its first queue (SlotEstimate), one replica at a time: at low load a
// replica can go minutes without queueing, and until then a request sent
// to its busy holder is priced as starting at once, to wait there for a
// whole answer. The replicas of one model are nearly always one
// deployment configured alike, so the count learnt at one is the best
// guess at the others. Where the known counts differ (a mixed fleet, or
// an estimate learnt too low from a token-budget wait) it guesses
// nothing. Stale candidates neither give nor take. It rewrites cands in
// place: a caller building candidates calls it once they are filled.
func PoolSlots(cands []Candidate) {
	var known int32
	unknown := false
	for i := range cands {
		c := &cands[i]
		switch {
		case c.Stale:
		case c.Slots <= 0:
			unknown = true
		case known == 0:
			known = c.Slots
		case c.Slots != known:
			return
		}
	}
	if known == 0 || !unknown {
		return
	}
	for i := range cands {
		if c := &cands[i]; c.Slots <= 0 && !c.Stale && int32(c.MinSlots) <= known && c.Running <= known {
			c.Slots = known
		}
	}
}

// seenFree reports that c's slots are unknown and it has fewer requests
// in flight than it has been seen running with nothing waiting
// (MinSlots): it has a slot for one more. The in-flight bound guesses a
// replica's capacity from the cluster's mean (twice the mean, one more
// request in all), which with fewer requests in flight than replicas is
// a single request: it would move a conversation's next turn off its
// holder whenever the previous turn is still finishing there. An engine
// known to run more than that at once is not a hot spot; one that
// queues (Waiting > 0) no longer has unknown slots once its owner has
// seen it (SlotEstimate), and until then canStart refuses it.
func seenFree(c *Candidate) bool {
	return c.Slots <= 0 && int(c.InFlight) < int(c.MinSlots)
}

// admitsCold is admits for cold limits (l.cold: hashPick's), in few enough lines
// to inline: a candidate that can start the request has nobody queued
// for a slot (queuedAt is 0), so only the work and in-flight bounds are
// left to check. TestAdmitsCold holds it to admits.
func (l limits) admitsCold(c *Candidate) bool {
	return c.Stale || !(c.PendingPrefillBlocks > l.work) && canStart(c) && (c.Slots > 0 || seenFree(c) || int(c.InFlight)+1 <= l.inFlight)
}

// idle reports that c can start a request at once: a sequence slot known
// to be free and no prefill queued. (With unknown slots an empty waiting
// queue says too little: the guard applies.)
func idle(c *Candidate) bool {
	return canStart(c) && c.PendingPrefillBlocks < 1
}

// CanStart reports that c would not queue a new request for a sequence
// slot, as far as the router knows: work that may wait for a free slot
// (a prefill-only warm request) asks it.
func (c *Candidate) CanStart() bool { return canStart(c) }

// queuedAt is how many requests c's engine holds waiting for a slot, as far
// as the router knows: its in-flight count over its slots, or with
// unknown slots the last scrape's waiting count.
func queuedAt(c *Candidate) int {
	if c.Slots > 0 {
		return max(0, int(c.InFlight)-int(c.Slots))
	}
	return int(c.Waiting)
}

// canStart reports that c would not queue a new request for a sequence
// slot, as far as the router knows.
func canStart(c *Candidate) bool {
	if c.Slots > 0 {
		return c.InFlight < c.Slots
	}
	return c.Waiting == 0
}

// SlotEstimate learns an engine's sequence slots (max-num-seqs) from its
// scraped running and waiting counts when the engine does not publish
// them: an engine that queues while running k sequences has k slots; one
// that runs more than the estimate has at least that many. Until it has
// queued once, the estimate is 0 (unknown). It is a value: the owner of
// the scrape keeps it and puts Slots in the candidate.
type SlotEstimate struct {
	// Slots is the estimate; 0 until the engine has been seen queueing.
	Slots int
}

// Observe returns the estimate updated with one scrape.
func (e SlotEstimate) Observe(running, waiting int) SlotEstimate {
	switch {
	case waiting > 0 && running > 0:
		e.Slots = running
	case e.Slots > 0 && running > e.Slots:
		e.Slots = running
	}
	return e
}
