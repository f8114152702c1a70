package route

import "math"

// The cold path: a request no fresh summary holds beyond the common
// prefix is placed by its key (the prompt past the common prefix) with
// rendezvous hashing under the load limits, so every router, and the
// next turn of a conversation, can retrace the placement; plus the
// burst rule that spreads a cold burst over an idle cluster.

// commonPrefix returns the longest match held by at least half of the
// fresh candidates, and by at least two: with two replicas, the one
// holding a conversation must not make it "common". (A strict majority
// would do that too, but then a system prompt held by half the replicas
// while a mesh warms up draws every request to them.)
func commonPrefix(hist, over []int32, fresh int) int {
	if fresh == 0 {
		return 0
	}
	need := int32(max(2, (fresh+1)/2))
	var atLeast int32
	for m := len(over) - 1; m >= len(hist); m-- {
		atLeast += over[m]
		if atLeast >= need {
			return m
		}
	}
	for m := len(hist) - 1; m > 0; m-- {
		atLeast += hist[m]
		if atLeast >= need {
			return m
		}
	}
	return 0
}

// key is the consistent-hashing key: the client's routing key when it
// sent one, else the chained hash of the block KeyBlocks past the common
// prefix (or the last full block of a shorter prompt), which covers
// everything before it; a prompt of no full block is keyed by its whole
// text (Request.Whole).
func (p Policy) key(req Request, common int) uint64 {
	if req.ClientKey != 0 {
		return req.ClientKey
	}
	idx := min(len(req.Hashes)-1, max(common, p.KeyBlocks-1))
	if idx < 0 {
		return req.shortKey()
	}
	return req.Hashes[idx]
}

// hashPick is rendezvous hashing with bounded loads over the nearest tier
// (tier, the least of the candidates' tiers):
// the candidate with the highest weight for key among those under the
// limits (a slot to start it, queued prefill, the hot-spot guard). With
// leastWait it takes the shortest estimated wait among them instead, ties
// in rendezvous order (join-the-shortest-queue; an idle cluster still
// places by the key), which cuts the queueing of cold requests — most
// requests of a chat trace are a conversation's first turn. That is only
// safe when every candidate's summary counts: the next turn then finds
// the prefix by summary wherever it went. Without that (startup, a
// partition, no summaries) placement must be the one every router
// computes alone: the first choice. When no candidate is under the
// limits, the one with the shortest wait takes it. Candidates whose
// summary holds a common prefix longer than one block (a hot prompt, not
// a system prompt still spreading) go first: recomputing it costs. lim
// are cold limits (lim.cold).
//
// noStale reports that no candidate is stale: every one admitted can
// then start the request (admitsCold), so none has a slot wait.
func (p Policy) hashPick(cands []Candidate, tier int, key uint64, lim limits, common int, leastWait, noStale bool) int {
	// First among the holders of the common prefix, then among all. A
	// copy of a common prefix longer than one block (a hot prompt) goes
	// only to an idle replica (a free slot, no prefill queued): on a busy
	// one its prefill delays the requests queued there, and the request
	// queues at the holder with the shortest wait instead.
	hot := common > 1
	// A thousand candidates are asked the limits and their wait: both by
	// hand here (admitsCold, waitMs's own lines), not through calls, which
	// the compiler does not inline.
	defBm := p.DefaultBlockMs
	for pass := 0; pass < 2; pass++ {
		f := coldFilter{lim: lim, tier: tier, common: common, hot: hot, holdersOnly: pass == 0}
		var first, shortest, second int
		if !hot && noStale {
			// The usual cold decision (no hot prompt, no stale
			// candidate): one scan without the filter's other terms or
			// a slot wait, in a loop of its own; the second pass would
			// be the same scan.
			first, shortest, second = scanCold(cands, tier, key, lim.work, lim.inFlight, int32(common), defBm)
			if first < 0 {
				break
			}
		} else {
			first, shortest, second = p.scanColdAll(cands, f, key, defBm)
		}
		switch {
		case first < 0:
			continue
		case leastWait && !idle(&cands[first]) && burst(cands, tier):
			// The key's first choice is busy, so the shortest wait would
			// move the request off it too and the next turn will not
			// retrace it by the key anyway (it finds it by summary),
			// and the engines last reported idle:
			// the load in view is a burst sent since, and the view of
			// it is lopsided. This router sees the requests the other
			// routers just sent to the replicas it owns, but theirs at
			// the other replicas only with their owners' next states.
			// Routers that each place their burst by such a view push
			// it onto the replicas they do not own, all onto the same
			// ones (five cold turns on one replica of four slots in
			// issue 7's chat). What a router knows alike of every
			// replica is its own share of the load: spreading its own
			// requests evenly spreads the sum evenly, whatever the
			// others do at the same instant. The bound on queued
			// prefill is left out for the same reason: it is the mean
			// of those lopsided loads (a replica this router owns
			// exceeds it with the requests the others just sent there).
			// The spread still takes only a replica that can start the
			// request, and the shorter wait among equal shares.
			f.lim.work = math.Inf(1)
			return p.spread(cands, key, f)
		case leastWait:
			// Of the first two choices at the shortest wait (fewest
			// written, then the key's order), the one with fewer
			// requests in flight: a cold prefill delays every request
			// that arrives behind it, and a replica's arrivals follow
			// its requests in flight (Little's law). Two choices, not
			// the least loaded of all, so that routers deciding on the
			// same snapshot do not herd.
			if second >= 0 && cands[second].InFlight < cands[shortest].InFlight {
				return second
			}
			return shortest
		}
		return first
	}
	// Over the limits everywhere: the shortest wait among the holders of
	// a hot prompt, or among all when no candidate of the tier holds it
	// (its holders are stale or in another tier).
	for _, skipLacking := range [...]bool{hot, false} {
		fallback := -1
		var fallbackW uint64
		var fallbackWait float64
		for i := range cands {
			c := &cands[i]
			if int(c.Tier) != tier || (skipLacking && lacks(c, common)) {
				continue
			}
			w := weight(key, c.Hash)
			if wait := p.waitMs(c); fallback < 0 || wait < fallbackWait || (wait == fallbackWait && w > fallbackW) {
				fallback, fallbackW, fallbackWait = i, w, wait
			}
		}
		if fallback >= 0 {
			return fallback
		}
	}
	return -1 // no candidate in the tier: cannot happen, tier is the least of theirs
}

// scanColdAll is one pass of hashPick over cands: among the candidates
// f admits (f.eligible), first has the highest rendezvous weight for
// key, shortest the shortest estimated wait, ties to the fewest blocks
// this router wrote there recently (Detail.Written), then to a summary
// holding nothing beyond the common prefix, then in rendezvous order,
// and second the runner-up in that order at the same wait (fewest
// written, empty, then rendezvous); -1 for none. The runner-up is the
// two choices' second (hashPick takes it when it has fewer requests in
// flight): with writes that differ everywhere, a runner-up only among
// equal writes would leave the least written replica the only choice
// however many requests it runs, and a burst of new prompts would queue
// at its slots while the next least written sat idle. At equal waits (an idle cluster's zeros)
// the key alone piles new prompts onto whichever replicas their keys
// happen to name (16 prompts over 8 replicas put four on one in
// inference-perf's shared_prefix runs, whose cache then evicted what
// their follow-ups needed); the replica written least takes the next
// new prompt, so a router's new prompts spread their cache footprint,
// and routers that each spread theirs spread the sum. At equal writes a
// replica whose summary holds nothing beyond the common prefix
// (Candidate.Held) goes first: Written is this router's alone, and with
// many routers each placing few new prompts it is zero everywhere, so
// the key alone would name one replica for two groups (62% of the time
// for 3 keys on 4 replicas) while another sits empty; Held is alike at
// every router. Only empty counts, not the least held: held counts
// differ everywhere once the caches fill, and every router would send
// every new prompt to the one holding least. The ranking is scanCold's, written out in both: a shared
// ranker would be a struct of seven fields, which the compiler keeps
// in memory, not registers (scanCold's point).
func (p Policy) scanColdAll(cands []Candidate, f coldFilter, key uint64, defBm float64) (first, shortest, second int) {
	first, shortest, second = -1, -1, -1
	var firstW, shortestW, secondW uint64
	var shortestWait, shortestWr, secondWr float64
	var shortestFull, secondFull bool
	common := int32(f.common)
	for i := range cands {
		c := &cands[i]
		if !f.eligible(c) {
			continue
		}
		w := weight(key, c.Hash)
		if first < 0 || w > firstW {
			first, firstW = i, w
		}
		slot, bm := 0.0, c.BlockMs
		if slotsAhead(c) > 0 {
			slot = p.slotWaitMs(c)
		}
		if !(bm > 0) { // blockMs
			bm = defBm
		}
		wait := bm*c.PendingPrefillBlocks + slot
		if shortest >= 0 && !(wait <= shortestWait) { // NaN too
			continue
		}
		wr, full := written(c), c.Held > common
		switch {
		case shortest < 0 || wait < shortestWait:
			shortest, shortestW, shortestWait, shortestWr, shortestFull, second = i, w, wait, wr, full, -1
		case wr < shortestWr || (wr == shortestWr && (shortestFull && !full || (full == shortestFull && w > shortestW))):
			second, secondW, secondWr, secondFull = shortest, shortestW, shortestWr, shortestFull
			shortest, shortestW, shortestWr, shortestFull = i, w, wr, full
		case second < 0 || wr < secondWr || (wr == secondWr && (secondFull && !full || (full == secondFull && w > secondW))):
			second, secondW, secondWr, secondFull = i, w, wr, full
		}
	}
	return first, shortest, second
}

// scanCold is scanColdAll when no candidate is stale and the prompt is
// not hot (cold limits of work and inFlight): the filter is the tier and
// admitsCold without its stale term, and the wait has no slot wait (a
// candidate admitted can start the request). It makes no call, so that
// its running bests stay in registers: scanColdAll's call of slotWaitMs
// spilled them to the stack on every candidate, the cold decision's
// largest cost after the weight itself. TestScanCold holds it to
// scanColdAll.
func scanCold(cands []Candidate, tier int, key uint64, work float64, inFlight int, common int32, defBm float64) (first, shortest, second int) {
	first, shortest, second = -1, -1, -1
	var firstW, shortestW, secondW uint64
	var shortestWait, shortestWr, secondWr float64
	var shortestFull, secondFull bool
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != tier || c.PendingPrefillBlocks > work || !canStart(c) || (c.Slots <= 0 && int(c.InFlight) >= int(c.MinSlots) && int(c.InFlight)+1 > inFlight) {
			continue
		}
		w := weight(key, c.Hash)
		if first < 0 || w > firstW {
			first, firstW = i, w
		}
		bm := c.BlockMs
		if !(bm > 0) { // blockMs
			bm = defBm
		}
		wait := bm * c.PendingPrefillBlocks
		if shortest >= 0 && !(wait <= shortestWait) { // NaN too
			continue
		}
		var wr float64 // written(c), by hand: no call in this loop
		if d := c.Detail; d != nil {
			wr = d.Written
		}
		full := c.Held > common
		switch {
		case shortest < 0 || wait < shortestWait:
			shortest, shortestW, shortestWait, shortestWr, shortestFull, second = i, w, wait, wr, full, -1
		case wr < shortestWr || (wr == shortestWr && (shortestFull && !full || (full == shortestFull && w > shortestW))):
			second, secondW, secondWr, secondFull = shortest, shortestW, shortestWr, shortestFull
			shortest, shortestW, shortestWr, shortestFull = i, w, wr, full
		case second < 0 || wr < secondWr || (wr == secondWr && (secondFull && !full || (full == secondFull && w > secondW))):
			second, secondW, secondWr, secondFull = i, w, wr, full
		}
	}
	return first, shortest, second
}

// coldFilter is which candidates one pass of hashPick places among.
type coldFilter struct {
	lim    limits
	tier   int
	common int
	// hot: the common prefix is longer than one block (a hot prompt).
	// holdersOnly: the first pass, among the holders of a hot prompt;
	// the second admits a replica lacking it only when idle.
	hot, holdersOnly bool
}

// eligible reports that c is in the nearest tier, under the limits, and
// holds a hot common prefix or (second pass) is idle to copy it, with
// room in its KV cache for the copy.
func (f coldFilter) eligible(c *Candidate) bool {
	if int(c.Tier) != f.tier || !f.lim.admitsCold(c) {
		return false
	}
	if !f.hot || !lacks(c, f.common) {
		return true
	}
	return !f.holdersOnly && idle(c) && c.KVUsage < kvWatermark
}

// kvWatermark is the KV usage at which an engine admits no new sequence
// without evicting or preempting one: vLLM keeps 1% of its blocks free
// (the block manager's watermark). A hot prompt's copy there would push
// out the blocks of sequences it runs, whatever its free slots say.
const kvWatermark = KVFull * 99 / 100

// burst reports that the candidates of tier mix replicas this router
// owns with others and that every engine among them last reported
// nothing running or waiting: whatever is in flight was sent since, a
// burst onto an idle cluster, of which this router sees the other
// routers' part only at its own replicas. An engine whose counts are
// unknown (HasLoad false) is no evidence of an idle cluster: its zeros
// would make every busy first choice spread, which costs the key's
// placement for nothing (tried: it lost grid cells).
func burst(cands []Candidate, tier int) bool {
	local, remote := false, false
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != tier || c.Stale {
			continue
		}
		if !c.HasLoad || c.Running > 0 || c.Waiting > 0 {
			return false
		}
		if d := c.Detail; d != nil && d.Local {
			local = true
		} else {
			remote = true
		}
	}
	return local && remote
}

// spread is the eligible candidate with the fewest of this router's own
// requests in flight (Detail.Own), ties to the shortest estimated wait,
// then in rendezvous order for key.
func (p Policy) spread(cands []Candidate, key uint64, f coldFilter) int {
	best := -1
	var bestOwn int32
	var bestWait float64
	var bestW uint64
	for i := range cands {
		c := &cands[i]
		if !f.eligible(c) {
			continue
		}
		var own int32
		if d := c.Detail; d != nil {
			own = d.Own
		}
		wait, w := p.waitMs(c), weight(key, c.Hash)
		if best < 0 || own < bestOwn || (own == bestOwn && (wait < bestWait || (wait == bestWait && w > bestW))) {
			best, bestOwn, bestWait, bestW = i, own, wait, w
		}
	}
	return best
}

// written is c's Detail.Written (0 without a Detail).
func written(c *Candidate) float64 {
	if d := c.Detail; d != nil {
		return d.Written
	}
	return 0
}

// lacks reports that c's summary counts and lacks the common prefix.
func lacks(c *Candidate, common int) bool {
	return c.Summary != nil && int(c.match) < common
}

// weight is the rendezvous weight of a replica for a key.
func weight(key, replica uint64) uint64 {
	z := key ^ replica
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
