package route

import "math"

// The warm pass prices candidates and keeps the cheapest. Over a thousand
// replicas most of them lack the request's prefix, and a candidate's cost
// is at least the recompute of the blocks it lacks: so the pass prices the
// holders of the longest match first, and then only the candidates whose
// match leaves a lower bound on their cost that could still win. The
// choice is the one pricing every candidate in order would make (lower
// cost, then higher rendezvous weight, then lower index):
// TestPickSkipsOnlyWhatCannotWin compares the two.

// pruneMin and pruneMax bound the candidate counts Pick prunes for: below
// pruneMin pricing all is as cheap as the bookkeeping; above pruneMax the
// matches side by side would not fit the array Pick keeps on its stack
// (4 KB), and it prices all.
const (
	pruneMin = 64
	pruneMax = 1024
)

// boundSlack is the relative margin by which a lower bound must exceed the
// best cost for a candidate to be skipped: the bound and the cost are the
// same sums over smaller operands, so rounding keeps the bound at or below
// the cost, unless the compiler fuses a multiply and an add in one of
// them and not the other (which Go permits); a few ulps cover that.
const boundSlack = 1e-9

// farMs is added to the cost of a far candidate (warmPricing.far): more
// than any cost of a near one (about 30 years), so that it ranks after
// all of them and is taken only when the hot-spot guard admits no near
// candidate. A finite offset, not an exclusion: the lower bounds the pass
// prunes with stay bounds, and the guard keeps its last resort.
const farMs = 1e12

// warmPricing is one warm pass: the cheapest candidate the limits admit
// (chosen) and the cheapest of all (cheapest, which tells a spill).
type warmPricing struct {
	p     Policy
	cands []Candidate
	lim   limits
	key   uint64
	n     int // the request's blocks
	best  int // the longest match of any candidate
	fork  int // blocks of a forked stem priced at stemWeight, else 0
	// rw and stemWeight weigh a candidate's missing blocks and missing
	// stem blocks.
	rw, stemWeight float64
	// owns: what this router owns of the candidates (Detail.Local),
	// asked only when a remote candidate lacking part of the prefix is
	// priced (far): 0 not asked yet, 1 one that can start the request at
	// once, 2 none, 3 only ones that would queue it for a slot.
	owns int8

	chosen, cheapest         int
	chosenCost, cheapestCost float64
	chosenW, cheapestW       uint64
	chosenHasW, cheapestHasW bool
	nan                      bool // a cost was NaN: no order to prune by

	// The lower bound of a candidate holding m blocks is
	// base + missBm×(n-m-stem) + stemBm×stem (bound).
	base, missBm, stemBm float64
}

// bounded readies the lower bound from the least network cost, queued
// prefill time and block time over the candidates, and reports whether
// pruning is sound: every term of a cost non-negative, so that the bound
// of a longer match is never higher (the pass relies on it), and every
// input finite (finite is a sum of all of them).
func (w *warmPricing) bounded(best int, minNet, minQueued, minBm, finite float64) bool {
	p := w.p
	rw := p.RecomputeWeight
	if best > w.n || !(minNet >= 0 && minQueued >= 0 && minBm >= 0 && w.rw >= 0 && w.stemWeight >= 0 && rw >= 0 && p.DefaultSeqMs >= 0) {
		return false
	}
	for _, f := range [...]float64{finite, p.DefaultBlockMs, p.DefaultSeqMs, w.rw, rw} {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return false
		}
	}
	// A busy candidate's missing blocks weigh RecomputeWeight, an idle
	// one's rw and stemWeight (price): the bound takes the lesser.
	w.base, w.missBm, w.stemBm = minNet+minQueued, min(w.rw, rw)*minBm, min(w.stemWeight, rw)*minBm
	return true
}

// bound is a lower bound on the cost of a candidate holding m blocks: its
// cost with the least network cost, queued prefill and block time of all
// candidates and no slot wait.
func (w *warmPricing) bound(m int) float64 {
	stem := max(0, w.fork-m)
	return w.base + w.missBm*float64(w.n-m-stem) + w.stemBm*float64(stem)
}

// cannotWin reports that a candidate whose cost is at least lb can be
// neither chosen nor the cheapest: the chosen one is already cheaper, by
// more than rounding.
func (w *warmPricing) cannotWin(lb float64) bool {
	return w.chosen >= 0 && lb-w.chosenCost > boundSlack*(lb+w.chosenCost)
}

// chooseAll prices every candidate, in order.
func (w *warmPricing) chooseAll() {
	w.chosen, w.cheapest, w.nan = -1, -1, false
	for i := range w.cands {
		w.price(i)
	}
}

// choosePruned prices the holders of the longest match (best), then the
// other candidates whose match leaves a bound that can still win; ms are
// the candidates' matches. Since a longer match never has a higher bound,
// those are the candidates holding at least some floor, which rises as
// the chosen cost falls. A NaN cost leaves no order to prune by: it
// prices every candidate instead.
func (w *warmPricing) choosePruned(ms []int32, best int) {
	w.chosen, w.cheapest, w.nan = -1, -1, false
	b := int32(best)
	for i, m := range ms {
		if m == b {
			w.price(i)
		}
	}
	floor := w.raise(0, best)
	if floor < best {
		for i, m := range ms {
			if m != b && int(m) >= floor {
				if w.price(i) {
					floor = w.raise(floor, best)
				}
			}
		}
	}
	if w.nan {
		w.chooseAll()
	}
}

// raise returns the least match, from floor up to best, whose bound can
// still win.
func (w *warmPricing) raise(floor, best int) int {
	for floor < best && w.cannotWin(w.bound(floor)) {
		floor++
	}
	return floor
}

// price prices candidate i and keeps it if it is the cheapest so far, of
// all or of those the limits admit; it reports whether it became the
// chosen one. Its block time and slot wait are computed once, its
// rendezvous weight only when its cost ties the best so far (the weight
// of a best found by cost alone is computed when a tie first needs it):
// the lower cost wins, a tie goes to the higher weight and then to the
// lower index, as if every weight were computed and the candidates
// priced in order. The slot wait is asked only of a candidate with no
// free slot.
func (w *warmPricing) price(i int) bool {
	p, c := &w.p, &w.cands[i]
	m := int(c.match)
	bm := p.blockMs(c)
	stem := max(0, w.fork-m) // stem blocks c lacks, of its n-m
	// A copy's cheap weights (rw or stemWeight below RecomputeWeight)
	// hold only on an idle candidate (a free slot, no prefill queued):
	// there the copy uses capacity nobody waits for. On a busy one its
	// prefill delays every request queued behind it there, as any
	// recompute does.
	slot, rw, sw := 0.0, w.rw, w.stemWeight
	if slotsAhead(c) > 0 {
		slot, rw, sw = p.slotWaitMs(c), p.RecomputeWeight, p.RecomputeWeight
	} else if c.PendingPrefillBlocks >= 1 {
		rw, sw = p.RecomputeWeight, p.RecomputeWeight
	}
	cost := c.NetworkMs + bm*c.PendingPrefillBlocks + slot +
		rw*bm*float64(w.n-m-stem) + sw*bm*float64(stem)
	if m < w.best && w.owns != 2 && w.far(c) {
		cost += farMs
	}
	if cost != cost {
		w.nan = true
	}
	var wt uint64
	hasW := false
	if w.cheapest < 0 || cost < w.cheapestCost {
		w.cheapest, w.cheapestCost, w.cheapestHasW = i, cost, false
	} else if cost == w.cheapestCost {
		wt, hasW = weight(w.key, c.Hash), true
		if !w.cheapestHasW {
			w.cheapestW, w.cheapestHasW = weight(w.key, w.cands[w.cheapest].Hash), true
		}
		if wt > w.cheapestW || (wt == w.cheapestW && i < w.cheapest) {
			w.cheapest, w.cheapestW = i, wt
		}
	}
	if !w.lim.admits(c) {
		return false
	}
	if w.chosen < 0 || cost < w.chosenCost {
		w.chosen, w.chosenCost, w.chosenHasW = i, cost, false
		return true
	}
	if cost == w.chosenCost {
		if !hasW {
			wt = weight(w.key, c.Hash)
		}
		if !w.chosenHasW {
			w.chosenW, w.chosenHasW = weight(w.key, w.cands[w.chosen].Hash), true
		}
		if wt > w.chosenW || (wt == w.chosenW && i < w.chosen) {
			w.chosen, w.chosenW = i, wt
			return true
		}
	}
	return false
}

// far reports that a move to c, a candidate lacking part of the prefix,
// would go by a view of its load a gossip interval old: another router
// owns it (Detail.Local false) while this one owns some candidate, whose
// load it sees exactly. A free slot in that old view is one the other
// routers see too, and in a burst they fill it before the owner's next
// state (issue 7's grid: 9% of such views showed a free slot the engine
// lacked); the request has then given up its prefix to queue at the
// owner's choice. A move off the holders therefore goes to a replica
// this router owns, or to another holder, first. A router that owns no
// candidate (or a view without Details) has no exact view to prefer.
//
// That trade holds while this router owns a candidate that can start
// the request at once: a free slot it knows against one it may lose.
// When every candidate it owns is full, the near choice is a certain
// wait for a slot, and a remote candidate its view shows idle (a free
// slot, no prefill queued) is at worst taken when the request reaches
// its owner, which then decides again among its own replicas on its
// exact view (KeepHint): such a candidate is not far. A remote one that
// is not idle stays far: its wait is a gossiped count's, against the
// owner's exact pricing of its own full replicas.
//
// What the router owns is asked once per decision, and first: a router
// that owns none reads no candidate's Detail again.
func (w *warmPricing) far(c *Candidate) bool {
	if w.owns == 0 {
		w.owns = 2
		for i := range w.cands {
			if d := w.cands[i].Detail; d != nil && d.Local {
				if canStart(&w.cands[i]) {
					w.owns = 1
					break
				}
				w.owns = 3
			}
		}
	}
	if w.owns == 2 {
		return false
	}
	d := c.Detail
	return d != nil && !d.Local && (w.owns == 1 || !idle(c))
}
