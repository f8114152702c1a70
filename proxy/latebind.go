package proxy

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Late binding (Config.LateBind): the router keeps the queues of the
// replicas it owns. A request decided for an owned replica whose known
// slots are all taken is held here, booked at that replica as an
// engine-queued one is (so every decision and every peer's view still
// sees the load), instead of being sent to wait in that engine's queue.
// When a request at one of the router's replicas ends, the oldest held
// request is decided again among the router's own replicas and sent if
// its choice can start it; if not, it waits on and passes the wake to
// the next. Why: with heavy-tailed answers an engine's queue waits behind
// the long answer at its head while another replica's slot frees first;
// one queue in front of all of them takes the first slot that frees
// (docs/SIMULATION.md, "Queues at the router": at three routers a fifth
// fewer drawn cells lost, p99 3-5 % lower). Engines of unknown slots are
// never held for: nothing tells when they are full.

// lateRecheck is how often a held request decides again without a wake:
// a replica ejected, or slots learnt anew, end no request here.
const lateRecheck = 250 * time.Millisecond

// lateBinder is the router's held requests, oldest first, and how many
// are held for each replica.
type lateBinder struct {
	mu    sync.Mutex
	seq   uint64
	held  map[string]int
	q     []*lateWaiter
	holds prometheus.Counter // kvmesh_late_bind_holds_total
	// learned reports that an owned replica's slots were learnt from
	// its queue, not published (nil: all published).
	learned func(id string) bool
}

// lateWaiter is one held request: seq orders it (kept when it is held
// again), wake is closed to wake it.
type lateWaiter struct {
	seq  uint64
	wake chan struct{}
}

func newLateBinder(reg prometheus.Registerer, learned func(id string) bool) *lateBinder {
	b := &lateBinder{held: map[string]int{}, learned: learned}
	f := promauto.With(reg)
	b.holds = f.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_late_bind_holds_total",
		Help: "Requests this router held (--late-bind) because the owned replica they were decided for had every known slot taken; each counted once.",
	})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvmesh_late_bind_held",
		Help: "Requests this router holds now (--late-bind) for an owned replica's slot.",
	}, func() float64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		n := 0
		for _, v := range b.held {
			n += v
		}
		return float64(n)
	})
	return b
}

// heldAt is how many requests are held for replica id.
func (b *lateBinder) heldAt(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[id]
}

// hold queues w for replica id, in its order (a new waiter goes last).
func (b *lateBinder) hold(id string, w *lateWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.seq == 0 {
		b.seq++
		w.seq = b.seq
		b.holds.Inc()
	}
	w.wake = make(chan struct{})
	i, _ := slices.BinarySearchFunc(b.q, w.seq, func(x *lateWaiter, s uint64) int { return cmp.Compare(x.seq, s) })
	b.q = slices.Insert(b.q, i, w)
	b.held[id]++
}

// unhold ends w's hold for replica id (it may have been woken already).
func (b *lateBinder) unhold(id string, w *lateWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.q, w); i >= 0 {
		b.q = slices.Delete(b.q, i, i+1)
	}
	if n := b.held[id] - 1; n > 0 {
		b.held[id] = n
	} else {
		delete(b.held, id)
	}
}

// poke wakes the oldest held request behind after (0: the oldest of all).
func (b *lateBinder) poke(after uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i, _ := slices.BinarySearchFunc(b.q, after+1, func(x *lateWaiter, s uint64) int { return cmp.Compare(x.seq, s) })
	if i < len(b.q) {
		close(b.q[i].wake)
		b.q = slices.Delete(b.q, i, i+1)
	}
}

// freed tells that a request sent to an owned replica (local) ended: a
// slot is free there, and the oldest held request decides again.
func (b *lateBinder) freed(local bool) {
	if b != nil && local {
		b.poke(0)
	}
}

// engineFull reports whether the owned replica of c has every known slot
// taken by requests sent to it (not those held for it).
//
// A count learnt from the engine's queue is a floor, not a cap: an
// engine short of KV cache queues while running fewer than its slots,
// and one held to that count would never run more, so the count would
// never rise. So while its last scrape showed nothing waiting, such an
// engine is sent one request past the count: it either runs it (the next
// scrape, which the health checks make at once, raises the count) or
// queues it (the next scrape shows it full).
func (b *lateBinder) engineFull(c *route.Candidate) bool {
	if !local(c) || c.Slots <= 0 {
		return false
	}
	room := int(c.Slots)
	if c.Waiting == 0 && b.learned != nil && b.learned(c.ID()) {
		room++
	}
	return int(c.InFlight)-b.heldAt(c.ID()) >= room
}

// pools reports whether this router owns more than one of cands: an
// owner of one would hold a queue that is its engine's again, for
// nothing.
func pools(cands []route.Candidate) bool {
	n := 0
	for i := range cands {
		if local(&cands[i]) {
			if n++; n > 1 {
				return true
			}
		}
	}
	return false
}

// bindLate holds st while the owned replica it was decided and booked
// for (d, bk) cannot start it, deciding again among the router's own
// replicas at each wake; it returns the decision and booking to attempt.
// ok is false when st was answered instead (a hop past its entry's
// dispatch deadline, an entry or a client gone): bk is then ended.
//
// A held hop announces its dispatch first: it is this router's now, and
// its entry must neither give it up after the hop dispatch timeout nor
// retry it elsewhere.
func bindLate(st *reqState, d route.Decision, bk booking) (route.Decision, booking, bool) {
	p, b := st.p, st.p.late
	if b == nil || st.leg != hop.LegNone || st.ep.byLoad || !pools(st.cands) {
		return d, bk, true
	}
	var w lateWaiter
	var t *time.Timer
	for b.engineFull(&st.cands[d.Index]) {
		id := st.cands[d.Index].ID()
		if !st.announceDispatch(id) {
			bk.end()
			return d, bk, false
		}
		b.hold(id, &w)
		if t == nil {
			t = time.NewTimer(lateRecheck)
			defer t.Stop()
		} else {
			t.Reset(lateRecheck)
		}
		woken := false
		select {
		case <-w.wake:
			woken = true
		case <-t.C:
		case <-st.r.Context().Done():
		}
		b.unhold(id, &w)
		bk.end()
		if st.r.Context().Err() != nil {
			// Gone while held: nothing was sent, and nothing is.
			st.code = statusClientGone
			return d, booking{}, false
		}
		st.readLoads()
		st.hinted = -1
		own, _ := ownCandidates(p.cfg.Policy, st.cands, "", false)
		if len(own) == 0 {
			// No replica of its own left: decided among all, as a new
			// request would be (a hop's are its owner's alone).
			st.readLoads()
			st.hinted = -1
			if len(st.cands) == 0 {
				st.code = st.noCandidate()
				return d, booking{}, false
			}
			d, bk = st.commit(st.decide(), true)
			return d, bk, true
		}
		st.cands = own
		d, bk = st.commit(st.decide(), true)
		if woken && b.engineFull(&st.cands[d.Index]) {
			b.poke(w.seq) // its choice is still full: the slot may be another's
		}
	}
	return d, bk, true
}
