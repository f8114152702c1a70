package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// Bounds of the router's own load records. A heat key is a prompt head
// in flight; more distinct heads in flight than this is not a hot
// prefix, and a request whose key finds no room counts as unknown (as
// one). Replicas are few, but their IDs come from the mesh, so the
// per-replica means are bounded too.
const (
	maxHeatKeys    = 1 << 16
	maxSeqReplicas = 1 << 12
	// seqEWMADiv is the weight of the newest duration in the running
	// mean, 1/16, as the simulator's owner keeps it (internal/lab/sim): a
	// few dozen requests set it, one outlier moves it little.
	seqEWMADiv = 16
)

// loadBook keeps what route's rule needs of this router's own traffic
// that no engine publishes: how many of its requests share a heat key
// (route.Request.Concurrent), the last one it decided under each heat key
// (route.Stem, for route.Request.ForkBlocks) and how long a request holds
// a sequence slot at each replica (route.Candidate.SeqMs). It is safe for
// concurrent use.
type loadBook struct {
	mu    sync.Mutex
	heat  map[uint64]int              // heat key -> requests in flight
	stems map[uint64]route.Stem       // heat key -> the last request decided under it, as it ended
	seq   map[string]float64          // replica ID -> mean slot time, ms
	times map[string]*route.SlotTimes // replica ID -> the slot times seen (route.Detail.FreeMs)
	runs  map[string][]*dispatchMark  // owned replica ID -> its requests in flight, oldest first
	// mine counts, per owned replica, the requests in runs this router
	// decided itself (not forwarded to it by another router's decision):
	// its share of the load there, route.Detail.Own.
	mine map[string]int
	now  func() time.Time
}

// dispatchMark is one request this router sent to an owned replica.
type dispatchMark struct {
	at    time.Time
	ended bool // under book.mu
	mine  bool // decided by this router (counted in book.mine)
	book  *loadBook
	id    string
}

func newLoadBook() *loadBook {
	return &loadBook{heat: map[uint64]int{}, stems: map[uint64]route.Stem{}, seq: map[string]float64{},
		times: map[string]*route.SlotTimes{}, runs: map[string][]*dispatchMark{}, mine: map[string]int{}, now: time.Now}
}

// dispatch marks a request sent to owned replica id now, decided by this
// router (mine) or by another that forwarded it, and returns the
// function that ends it. Every request to an owned replica passes through
// its owner, so the oldest mark is the sequence that has held its slot
// longest (its age counts its wait in the engine's queue too, so the
// slot it frees is dated early, never late: route then waits rather than
// moves).
func (b *loadBook) dispatch(id string, mine bool) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.runs[id]
	if !ok && len(b.runs) >= maxSeqReplicas {
		return func() {}
	}
	m := &dispatchMark{at: b.now(), book: b, id: id, mine: mine}
	b.runs[id] = append(q, m)
	if mine {
		b.mine[id]++
	}
	return m.end
}

// running is how many requests this router has in flight at owned
// replica id.
func (b *loadBook) running(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, m := range b.runs[id] {
		if !m.ended {
			n++
		}
	}
	return n
}

// end ends the request of m (once: a second call finds it ended).
func (m *dispatchMark) end() {
	b := m.book
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.ended {
		return
	}
	m.ended = true
	if m.mine {
		if n := b.mine[m.id] - 1; n > 0 {
			b.mine[m.id] = n
		} else {
			delete(b.mine, m.id)
		}
	}
	q := b.runs[m.id]
	for len(q) > 0 && q[0].ended {
		q[0] = nil
		q = q[1:]
	}
	if len(q) == 0 {
		delete(b.runs, m.id)
	} else {
		b.runs[m.id] = q
	}
}

// begin counts one more request in flight under key and returns the
// count (this request included) and the function that ends it, to be
// called once when the request ends however it ends. When the map is
// full and key is new the request is not counted: 0 (unknown) and a
// no-op end.
func (b *loadBook) begin(key uint64) (int, func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, ok := b.heat[key]
	if !ok && len(b.heat) >= maxHeatKeys {
		return 0, func() {}
	}
	n++
	b.heat[key] = n
	h := &heatMark{book: b, key: key}
	return n, h.end
}

// heatMark is one request counted by begin.
type heatMark struct {
	book  *loadBook
	key   uint64
	ended atomic.Bool
}

func (h *heatMark) end() {
	if h.ended.CompareAndSwap(false, true) {
		h.book.end(h.key)
	}
}

func (b *loadBook) end(key uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.heat[key] - 1; n > 0 {
		b.heat[key] = n
	} else {
		delete(b.heat, key)
	}
}

// stem is the record kept under heat key key (the zero Stem when none).
func (b *loadBook) stem(key uint64) route.Stem {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stems[key]
}

// setStem keeps s under key; when the map is full a new key is not kept
// (its requests then show no fork: route weighs them as any prefix).
func (b *loadBook) setStem(key uint64, s route.Stem) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.stems[key]; ok || len(b.stems) < maxHeatKeys {
		b.stems[key] = s
	}
}

// inFlight is the count under key (for tests and debugging).
func (b *loadBook) inFlight(key uint64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.heat[key]
}

// observe folds one request's slot time at a replica into its mean.
func (b *loadBook) observe(id string, ms float64) {
	if ms <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.seq[id]
	switch {
	case ok:
		b.seq[id] = old + (ms-old)/seqEWMADiv
		b.times[id].Observe(ms)
	case len(b.seq) < maxSeqReplicas:
		b.seq[id] = ms
		t := &route.SlotTimes{}
		t.Observe(ms)
		b.times[id] = t
	}
}

// fill sets SeqMs, and for owned replicas with requests in flight
// SlotAgeMs, on the candidates the view left without them, and Own for
// the owned replicas (hop.Book.Fill sets it for the others).
func (b *loadBook) fill(cands []route.Candidate) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	for i := range cands {
		d := cands[i].Detail
		if d == nil {
			continue // no ID to look up, nowhere to write: the zero Detail
		}
		if d.SeqMs <= 0 {
			d.SeqMs = b.seq[d.ID]
		}
		if q := b.runs[d.ID]; d.SlotAgeMs <= 0 && len(q) > 0 {
			d.SlotAgeMs = max(float64(now.Sub(q[0].at))/float64(time.Millisecond), 1e-3)
			if c := &cands[i]; d.FreeMs <= 0 && full(c) {
				d.FreeMs = b.freeMs(d.ID, q, int(c.Slots), now)
			}
		}
		if n, ok := b.mine[d.ID]; ok {
			d.Own = route.Count32(n)
		}
	}
}

// full reports that route would ask c's slot wait: its slots known to be
// taken, or with unknown slots the engine queueing.
func full(c *route.Candidate) bool {
	if c.Slots > 0 {
		return c.InFlight >= c.Slots
	}
	return c.Waiting > 0
}

// freeMs is the expected time until the first of the requests running at
// owned replica id ends (route.SlotTimes.FreeMs): the oldest marks of q,
// as many as the engine's slots (all of them with slots unknown), are the
// requests it runs; 0 when no slot time was seen there. Under b.mu.
func (b *loadBook) freeMs(id string, q []*dispatchMark, slots int, now time.Time) float64 {
	t := b.times[id]
	if t == nil {
		return 0
	}
	if slots > 0 && slots < len(q) {
		q = q[:slots]
	}
	ages := make([]float64, 0, len(q))
	for _, m := range q {
		if !m.ended {
			ages = append(ages, float64(now.Sub(m.at))/float64(time.Millisecond))
		}
	}
	return t.FreeMs(ages)
}

// slotMs is how long a request held a sequence slot, as a router can
// tell: from its first byte to its last (decode), plus the prefill of the
// blocks the replica lacked at the candidate's prefill rate (the time
// before the first byte also holds the queue wait, which is not a slot's).
func slotMs(first, last time.Time, missBlocks int, blockMs float64) float64 {
	if first.IsZero() || last.Before(first) {
		return 0
	}
	return float64(last.Sub(first))/float64(time.Millisecond) + float64(max(missBlocks, 0))*blockMs
}

// countHeat counts req under its heat key for the decision
// (route.Request.Concurrent) and returns the function that ends the
// count. Requests placed by load are not counted: they hold no prefix.
// Nor are requests another router forwarded: the count is of the
// requests this router decides, as in the simulator (counting the
// forwarded ones at the owner too raised copies of conversations'
// prefixes and cost hit ratio on no-shared-head at 4 slots,
// docs/history/simulation.md).
func (st *reqState) countHeat() func() {
	p, req := st.p, &st.req
	if st.byLoad || st.hop {
		return func() {}
	}
	key := p.cfg.Policy.HeatKey(*req)
	n, end := p.load.begin(key)
	req.Concurrent = n
	req.ForkBlocks = p.load.stem(key).Fork(*req)
	return end
}

// blockMsOf is a candidate's prefill time per block, as route prices it.
func blockMsOf(pol route.Policy, c *route.Candidate) float64 {
	if c.BlockMs > 0 {
		return c.BlockMs
	}
	return pol.DefaultBlockMs
}
