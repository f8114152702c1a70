// Package route makes kvmesh's routing decision: which replica should serve
// a request, given what the deciding router knows of every replica's cache
// and load. It is pure: the same request and the same view give the same
// choice on every router, with ties broken by rendezvous hashing, never by
// map order or chance. It imports no network code; the mesh fills in the
// view, the simulator fills in a simulated one.
//
// The decision, in order:
//
//  0. A request for a LoRA adapter (Candidate.LoRA: the engine serves the
//     model as an adapter on top of its base model) is decided among the
//     replicas the LoRA scorer keeps (pickLoRA, lora.go): those running
//     the adapter while one can start it, else those and the one replica
//     to load it on (by rendezvous hashing of the adapter, among those
//     with room under the engine's limit), and so on down; the steps
//     below then decide among them.
//  1. Every candidate with a summary that counts is asked for its prefix
//     match. The common prefix is the longest match that at least half of
//     them (and two) hold (a global system prompt, or a hot prompt); only a
//     match beyond it says anything about where the request should go.
//  2. If no summary counts, or no candidate holds more than the common
//     prefix, the request is cold: it goes by consistent hashing with
//     bounded loads (rendezvous order over the key, the first replica that
//     can start it with queued prefill within LoadFactor times the mean),
//     keyed by the client's routing key or the first KeyBlocks blocks after
//     the common prefix; holders of a long common prefix go first, and
//     when none of them can take it, it is copied only to an idle replica
//     (else it queues at the holder with the shortest wait). With
//     every summary fresh it takes the shortest wait among them; among
//     equal waits, the one of the key's first two choices with fewer
//     requests in flight (fewer arrivals queue behind its prefill). In a
//     burst onto an idle cluster (every engine last reported idle, with
//     counts it publishes: HasLoad) whose key's first choice is busy, it
//     takes the replica with the fewest of this router's own requests
//     (Detail.Own) instead: each
//     router sees the others' part of the burst only at its own replicas,
//     and routers that each spread their own share spread the sum.
//     Requests that will share a prefix share the key, so
//     they land together, and routers that cannot talk still agree.
//  3. Otherwise every candidate is scored by an estimate of time to first
//     token plus the recompute a move costs the cluster: network + prefill
//     queued ahead + wait for a sequence slot (from the engine's running,
//     waiting and slots, with the router's in-flight count as the fast
//     signal, dated by the age of the oldest request in flight where the
//     router knows it) + RecomputeWeight × the prefill of the blocks it lacks. The
//     holder keeps the request while it can start it at once; it moves only
//     when the wait it would impose beats the weighted recompute, and then
//     to the next holder first, and off the holders to a replica this
//     router owns (whose load it sees exactly) before one whose free
//     slot it knows only from gossip, while one it owns can start the
//     request; when all it owns are full, a remote one its view shows
//     idle competes on cost. A stem other
//     requests fork from (Request.ForkBlocks: a hot template or document,
//     not a conversation's history) costs only its prefill to copy when
//     its holders are full and at least half the replicas could start
//     it: the copy serves the stem's other requests too. So does a
//     prefix more requests want at once than replicas hold it
//     (Request.Concurrent) when no holder is idle: queued prefill makes
//     a request wait as a full engine does. A copy is that
//     cheap only on an idle replica (a free slot, no prefill queued);
//     on a busy one it delays the requests queued there. When every
//     holder's slots are taken, a copy on an idle replica weighs its
//     prefill once plus the rest of RecomputeWeight times the share of
//     the cluster's slots in use: what it costs the others grows with
//     how much they compete for the slots. The wait at a full engine is
//     priced by its owner's estimate of when a running request ends
//     (Detail.FreeMs, from the slot times it has seen: with heavy-tailed
//     answers one running past the mean is a long one).
//
// The hot-spot guard (consistent hashing with bounded loads, Mirrokni,
// Thorup, Zadimoghaddam 2018, applied to the queue for slots, and to
// in-flight requests when slots are unknown) spills a request from a
// holder that queues far more than the mean, so a hot prefix spreads to a
// second holder instead of collapsing onto one. A holder that can start
// the request at once is never held to it, and a spill never copies the
// prefix onto a busy replica (no free slot, or prefill queued): that only
// moves the queue and adds the copy's prefill to it.
//
// Another router's decision for one of this router's replicas is checked
// with KeepHint against the exact view and taken again among its own
// replicas when the replica can no longer start the request.
package route

import (
	"math"

	"github.com/kvmesh/kvmesh/summary"
)

// Matcher tells how many leading blocks of a request a replica probably
// holds. *summary.Summary implements it; the simulator's oracle implements
// it over the replica's real cache.
type Matcher interface {
	Match(probes []summary.Probe) int
}

// Reason says why a replica was picked; it is a metric label.
type Reason string

// The reasons of a decision.
const (
	ReasonPrefix        Reason = "prefix"         // cheapest estimated TTFT, using a prefix match
	ReasonSpill         Reason = "spill"          // the cheapest was over the load bound
	ReasonFallbackCold  Reason = "fallback-cold"  // no replica holds more than the common prefix
	ReasonFallbackStale Reason = "fallback-stale" // no summary counts (stale, suspect, missing)
	ReasonWarmUp        Reason = "warm-up"        // cold, and a warming replica's share (warmup.go)
	ReasonNone          Reason = "none"           // no candidate
)

// Reasons lists every reason, for metric initialisation.
var Reasons = []Reason{ReasonPrefix, ReasonSpill, ReasonFallbackCold, ReasonFallbackStale, ReasonWarmUp, ReasonNone}

// Decision is the outcome of Pick.
type Decision struct {
	// Index of the chosen candidate, -1 when there was none.
	Index int
	// Reason the candidate was chosen.
	Reason Reason
	// Match is the chosen replica's predicted prefix match in blocks.
	Match int
	// BestMatch is the longest match of any candidate.
	BestMatch int
	// CommonMatch is the common prefix (held by at least half, and two).
	CommonMatch int
	// Key is the consistent-hashing key of the request.
	Key uint64
	// LoRA is where a LoRA adapter's request went (pickLoRA); empty for
	// a base model's.
	LoRA LoRAPlacement
}

// Pick chooses a replica for req among cands. It writes only the
// candidates' private fields, so callers may reuse the slice.
func (p Policy) Pick(req Request, cands []Candidate) Decision {
	if len(cands) >= pruneMin && len(cands) <= pruneMax {
		// The candidates' matches side by side, so that the warm pass
		// can find the few worth pricing without reading every
		// candidate again (warm.go).
		var ms [pruneMax]int32
		return p.loraAfter(p.pick(req, cands, ms[:len(cands)]), req, cands)
	}
	return p.loraAfter(p.pick(req, cands, nil), req, cands)
}

// loraAfter is d, unless the request is a LoRA adapter's (its replicas
// say the model is one, the first and the chosen asked): the scorer then
// keeps the replicas it may go to and the decision is made again among
// those. Asked after the decision, so that a base model's costs two
// reads, not one per candidate (an OR in the first pass cost 4% of a
// cold decision over 1,024 candidates); an adapter's pays the first
// decision in vain.
func (p Policy) loraAfter(d Decision, req Request, cands []Candidate) Decision {
	if !req.loraPlaced && d.Index >= 0 && (cands[0].LoRA|cands[d.Index].LoRA)&LoRAAdapter != 0 {
		return p.pickLoRA(req, cands)
	}
	return d
}

// pick is Pick with ms, when not nil, the storage for every candidate's
// match (len(cands) of it); without it the warm pass prices every
// candidate.
func (p Policy) pick(req Request, cands []Candidate, ms []int32) Decision {
	if len(cands) == 0 {
		return Decision{Index: -1, Reason: ReasonNone}
	}
	n := len(req.Probes)
	fresh, stale, best, inFlight, queued, known := 0, 0, 0, 0, 0, 0
	pending := 0.0
	var hist [65]int32 // matches capped for the common-prefix vote
	var histOver []int32
	// What the later passes would otherwise each read every candidate
	// for: the nearest tier and how many of those that count could start
	// a request at once. The bounds warmPricing prunes with are a warm
	// decision's only (pruneBounds).
	tier := cands[0].Tier
	canKnown := 0
	defBm := p.DefaultBlockMs
	// The answers of the batch the last candidate's cell was of (Batch):
	// read here rather than through a call per candidate.
	var batch *Batch
	var batchRes []int
	// Two loops, the loads' and the matches', the first and the usual
	// part of the second without a call (a call in a loop makes the
	// compiler keep its running sums on the stack, a store and a load
	// each per candidate).
	for i := range cands {
		c := &cands[i]
		tier = min(tier, c.Tier)
		can := canStart(c)
		// A stale candidate's load is as unknown as its cache: it neither
		// counts towards the mean nor is held to the bound (a router that
		// cannot talk to the owner must place requests as if it knew
		// nothing, exactly as consistent hashing does).
		if c.Stale {
			stale++
		} else {
			inFlight += int(c.InFlight)
			queued += queuedAt(c)
			pending += c.PendingPrefillBlocks
			known++
			if can {
				canKnown++
			}
		}
	}
	// The matches of the candidates whose summary is a cell of the batch
	// the first summary's is (the mesh's candidates), read without a call
	// until one is not, or its match is past hist; the rest, in the
	// general loop below.
	i0 := 0
	if n > 0 {
		for i := range cands {
			if s := cands[i].Summary; s != nil {
				if bc, ok := s.(*BatchCell); ok {
					batch, batchRes = bc.b, bc.b.answer(req.Probes)
				}
				break
			}
		}
	}
	for ; i0 < len(cands); i0++ {
		c := &cands[i0]
		m := 0
		if s := c.Summary; s == nil {
			c.match = 0
			if ms != nil {
				ms[i0] = 0
			}
			continue
		} else if n > 0 {
			bc, ok := s.(*BatchCell)
			if !ok || bc.b != batch {
				break
			}
			if m = batchRes[bc.i]; m >= len(hist) {
				break
			}
		}
		c.match = int32(m)
		if ms != nil {
			ms[i0] = int32(m)
		}
		fresh++
		best = max(best, m)
		if m != 0 {
			hist[m]++
		}
	}
	for i := i0; i < len(cands); i++ {
		c := &cands[i]
		c.match = 0
		if ms != nil {
			ms[i] = 0
		}
		if c.Summary == nil {
			continue
		}
		m := 0
		if n > 0 {
			if bc, ok := c.Summary.(*BatchCell); ok {
				if bc.b != batch {
					batch, batchRes = bc.b, bc.b.answer(req.Probes)
				}
				m = batchRes[bc.i]
			} else {
				m = c.Summary.Match(req.Probes)
			}
		}
		c.match = int32(m)
		if ms != nil {
			ms[i] = int32(m)
		}
		fresh++
		best = max(best, m)
		// commonPrefix never reads hist[0]; counting the many zeros of a
		// thousand candidates into one slot would chain every iteration
		// through it.
		if m == 0 {
			continue
		}
		if m < len(hist) {
			hist[m]++
		} else {
			if histOver == nil {
				histOver = make([]int32, n+1)
			}
			histOver[m]++
		}
	}
	common := commonPrefix(hist[:], histOver, fresh)
	counted := known
	if canKnown < counted || stale > 0 {
		// Some candidate may have no free slot: its wait will be priced
		// (slotWaitMs), by the slot time pooled over the candidates.
		p.seqMs = pooledSeqMs(cands)
	}
	known = max(known, 1)
	lim := limits{inFlight: p.inFlightBound(inFlight, known), queued: p.queueBound(queued, known), work: math.Inf(1), blocks: n}
	cold := lim
	cold.work = p.LoadFactor * pending / float64(known)
	if fresh < len(cands) || req.ClientKey != 0 {
		// The next turn cannot count on summaries to find where this
		// one went (or the client's key promises that every router
		// places its requests alike): keep placement close to what every
		// router computes alone, allowing a queue of the request's own
		// size.
		cold.work += float64(max(1, n-common))
	}
	cold.cold = true
	d := Decision{BestMatch: best, CommonMatch: common, Key: p.key(req, common)}

	// Cold, or the replica consistent hashing names is one this router
	// cannot see (its owner is partitioned away or suspect): place it by
	// consistent hashing.
	//
	// A client key promises that every router places the client's
	// requests alike; one block of excess is what a single false positive
	// of one summary produces (a new prompt of one or two blocks then
	// looks warm at one router and cold at another), so it takes two to
	// override the key. The key keeps a conversation together anyway.
	minExcess := max(1, p.MinExcessBlocks)
	if req.ClientKey != 0 {
		minExcess++
	}
	isCold := fresh == 0 || best-common < minExcess
	if isCold && p.inWarmShare(d.Key) {
		if i := p.warmUp(cands, coldFilter{lim: cold, tier: int(tier), common: common, hot: common > 1}, d.Key); i >= 0 {
			d.Index, d.Match, d.Reason = i, int(cands[i].match), ReasonWarmUp
			return d
		}
	}
	home := -1
	if isCold || stale > 0 { // with no stale candidate the home cannot be stale
		// A client key promises that every router places the client's
		// requests alike; the shortest wait would follow this router's
		// view of the loads, which another router does not share.
		home = p.hashPick(cands, int(tier), d.Key, cold, common, fresh == len(cands) && req.ClientKey == 0, stale == 0)
	}
	if isCold || (home >= 0 && cands[home].Stale) {
		d.Reason = ReasonFallbackCold
		if cands[home].Stale {
			d.Reason = ReasonFallbackStale
		}
		d.Index, d.Match = home, int(cands[home].match)
		return d
	}

	// Warm: the estimated time to first token, plus the recompute a
	// replica lacking part of the prefix would add, weighted. The holder
	// has the least recompute, so it keeps the request while it can start
	// it at once (no wait, no queued prefill) and loses it only when the
	// wait it would impose exceeds RecomputeWeight times the prefill the
	// move adds; a move goes to the next holder first, whose recompute is
	// smallest.
	//
	// A prefix more requests want at once than replicas hold it earns a
	// copy when no holder can start the request at once, whether its
	// slots are full or its prefill lane is busy (idle: a free slot and
	// no prefill queued): the request waits behind queued prefill as it
	// would for a slot, and so do the others. The copy serves them too,
	// so its recompute weighs 1 against the wait at the holders (on an
	// idle replica only: price). A free slot alone is not the test: a
	// prefill-bound engine (256 slots) always has one, so a hot prompt
	// would keep one or two holders while their lanes queued, and more
	// than half the requests would wait (the grid's hot-prompts
	// 0.9/256/1, seeds 1-6: TTFT p50 156-312 ms with that test, 41-46 ms
	// with this one).
	rw := p.RecomputeWeight
	if req.Concurrent > 1 {
		holders, _, idleHolder := holdersOf(cands, ms, best)
		if req.Concurrent > holders && !idleHolder {
			rw = 1
		}
	}
	// A forked stem's copy is not dead weight: the stem's other requests
	// use it too (a conversation's history is used only by its next
	// turn, which follows the copy and orphans the old one). So when no
	// holder can start the request and free slots are not scarce (at
	// least half the replicas could start it at once), the blocks of the
	// stem a replica lacks cost their prefill time, weight 1: the request
	// recomputes the stem where it starts now rather than queue at a full
	// holder longer than that takes. When fewer replicas can start it,
	// the copy would take the last free slots and lengthen the binding
	// resource's work, and the stem weighs RecomputeWeight like any
	// prefix. Here "start" is a free slot, not the idle test of the
	// concurrent rule above: a stem is known to be shared from one
	// earlier request, not from several in flight, and with the idle
	// test the rule copied the conversation trace's stems more (hit
	// ratio -0.3 %) and lost no-shared-head 0.9/4/0.25's hit gate on one
	// seed of six.
	// A copy on an idle replica when no holder can start the request
	// (every holder's slots taken: it would wait for one) weighs its
	// prefill once for this request, and the rest of RecomputeWeight,
	// what it costs the others (the work it adds where they queue, the
	// blocks it evicts that they would hit), only as far as they compete
	// for the slots: times the share of the cluster's slots in use. On a
	// cluster of mostly free slots a request waiting at a full holder
	// behind decodes of unknown length (a one-slot engine running a long
	// answer) then moves for any wait above a few times its prefill;
	// on a busy one the weight stays near RecomputeWeight. It only
	// lowers rw, never below 1.
	_, startable, _ := holdersOf(cands, ms, best)
	if !startable && rw > 1 {
		rw = 1 + (rw-1)*slotsInUse(cands)
	}
	fork, stemWeight := 0, rw
	if req.ForkBlocks > 0 {
		if !startable && counted > 0 && 2*canKnown >= counted {
			fork, stemWeight = min(req.ForkBlocks, n), 1
		}
	}
	w := warmPricing{p: p, cands: cands, lim: lim, key: d.Key, n: n, best: best, fork: fork,
		rw: rw, stemWeight: stemWeight}
	pruned := false
	if ms != nil {
		minNet, minQueued, minBm, finite := pruneBounds(cands, defBm)
		pruned = w.bounded(best, minNet, minQueued, minBm, finite)
	}
	if pruned {
		w.choosePruned(ms, best)
	} else {
		w.chooseAll()
	}
	chosen := w.chosen
	if chosen < 0 { // cannot happen: someone is at or below the mean
		chosen = w.cheapest
	}
	// A spill that would copy the prefix onto a busy replica (no free
	// slot, or prefill queued) only moves the queue and adds the copy's
	// prefill to it: the request stays with the cheapest.
	if cheapest := w.cheapest; chosen != cheapest && int(cands[chosen].match) < int(cands[cheapest].match) && !idle(&cands[chosen]) {
		chosen = cheapest
	}
	d.Index, d.Match, d.Reason = chosen, int(cands[chosen].match), ReasonPrefix
	if chosen != w.cheapest {
		d.Reason = ReasonSpill
	}
	return d
}

// pruneBounds is what warmPricing prunes with, over every candidate: the
// least network cost, queued prefill time and block time, and finite, a
// sum of the float fields a cost reads (the slot wait's only of the
// candidates that would be asked it), so that a NaN or an infinity turns
// pruning off rather than making it guess. Only a warm decision asks it,
// after the first pass: a cold one (most requests of a chat trace are a
// conversation's first turn) does not pay for it.
func pruneBounds(cands []Candidate, defBm float64) (minNet, minQueued, minBm, finite float64) {
	minNet, minQueued, minBm = math.Inf(1), math.Inf(1), math.Inf(1)
	for i := range cands {
		c := &cands[i]
		// blockMs by hand, the default read once (the method on a
		// Policy value copied the policy for every candidate), and
		// comparisons, not min (its care for NaN and -0 costs branches;
		// finite catches a NaN).
		bm := c.BlockMs
		if !(bm > 0) {
			bm = defBm
		}
		if c.NetworkMs < minNet {
			minNet = c.NetworkMs
		}
		if q := bm * c.PendingPrefillBlocks; q < minQueued {
			minQueued = q
		}
		if bm < minBm {
			minBm = bm
		}
		finite += c.NetworkMs + c.PendingPrefillBlocks + c.BlockMs
		if !canStart(c) { // only these are asked their slot wait
			seq, age := seqAndAge(c)
			finite += seq + age
			if c.Detail != nil {
				finite += c.Detail.FreeMs
			}
		}
	}
	return minNet, minQueued, minBm, finite
}

// holdersOf counts the candidates holding best blocks of the request (no
// candidate holds more) and reports whether one of them has a free
// sequence slot (startable) and whether one of them is idle (a free slot
// and no prefill queued: it starts the request at once); ms, when not
// nil, is their matches side by side.
func holdersOf(cands []Candidate, ms []int32, best int) (holders int, startable, idleHolder bool) {
	if ms == nil {
		for i := range cands {
			if c := &cands[i]; int(c.match) >= best {
				holders++
				startable = startable || canStart(c)
				idleHolder = idleHolder || idle(c)
			}
		}
		return holders, startable, idleHolder
	}
	for i, m := range ms {
		if c := &cands[i]; int(m) >= best {
			holders++
			startable = startable || canStart(c)
			idleHolder = idleHolder || idle(c)
		}
	}
	return holders, startable, idleHolder
}

// slotsInUse is the share of the sequence slots taken over the candidates
// whose slots are known and whose load counts (not stale); 1 when none
// is known, so that what it weighs keeps its full weight.
func slotsInUse(cands []Candidate) float64 {
	used, slots := 0, 0
	for i := range cands {
		c := &cands[i]
		if c.Stale || c.Slots <= 0 {
			continue
		}
		used += int(min(c.InFlight, c.Slots))
		slots += int(c.Slots)
	}
	if slots == 0 {
		return 1
	}
	return float64(used) / float64(slots)
}
