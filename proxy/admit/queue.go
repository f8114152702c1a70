package admit

import (
	"container/heap"
	"math"
	"time"
)

// waiter is one queued request.
type waiter struct {
	req    Request
	finish float64 // virtual finish time (weighted fair queueing)
	seq    uint64  // arrival order, ties and "newest"
	idx    int     // index in its class's heap, -1 when out
	enq    time.Time
	// ready is closed when the waiter leaves the queue for any reason but
	// its own (granted, shed by another's arrival, the Admitter closed);
	// verdict says which.
	ready   chan struct{}
	granted bool
	verdict Verdict
}

// waiters is a class's queue as a heap by virtual finish time, then
// arrival.
type waiters []*waiter

func (h waiters) Len() int { return len(h) }
func (h waiters) Less(i, j int) bool {
	if h[i].finish != h[j].finish {
		return h[i].finish < h[j].finish
	}
	return h[i].seq < h[j].seq
}
func (h waiters) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *waiters) Push(x any) {
	w := x.(*waiter)
	w.idx = len(*h)
	*h = append(*h, w)
}
func (h *waiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.idx = -1
	return w
}

// tenantQ is a tenant's state in one class, kept while it has requests
// queued there: a tenant that empties its queue starts again at the
// class's virtual time, as weighted fair queueing has it.
type tenantQ struct {
	last float64 // the virtual finish of its newest queued request
	n    int
}

// classQ is one class's queue of a model.
type classQ struct {
	items   waiters
	vtime   float64 // the virtual finish of the request served last
	tenants map[uint64]*tenantQ
}

func (q *classQ) push(w *waiter) {
	if q.tenants == nil {
		q.tenants = map[uint64]*tenantQ{}
	}
	t := q.tenants[w.req.Tenant]
	if t == nil {
		t = &tenantQ{last: q.vtime}
		q.tenants[w.req.Tenant] = t
	}
	w.finish = max(q.vtime, t.last) + max(w.req.Cost, 1)
	t.last = w.finish
	t.n++
	heap.Push(&q.items, w)
}

// left updates a tenant's count for a waiter out of the queue.
func (q *classQ) left(w *waiter) {
	if t := q.tenants[w.req.Tenant]; t != nil {
		if t.n--; t.n <= 0 {
			delete(q.tenants, w.req.Tenant)
		}
	}
}

func (q *classQ) pop() *waiter {
	w := heap.Pop(&q.items).(*waiter)
	q.vtime = max(q.vtime, w.finish)
	q.left(w)
	return w
}

func (q *classQ) remove(w *waiter) {
	heap.Remove(&q.items, w.idx)
	q.left(w)
}

// queued is how many of the tenant's requests wait in the class.
func (q *classQ) queued(tenant uint64) int {
	if t := q.tenants[tenant]; t != nil {
		return t.n
	}
	return 0
}

// newestOfLargest is the newest request of the tenant with the most
// requests queued in the class (ties: the newest request among them).
func (q *classQ) newestOfLargest() *waiter {
	most := 0
	for _, t := range q.tenants {
		most = max(most, t.n)
	}
	var v *waiter
	for _, w := range q.items {
		if q.tenants[w.req.Tenant].n == most && (v == nil || w.seq > v.seq) {
			v = w
		}
	}
	return v
}

// modelQ is the admission state of one model.
type modelQ struct {
	held    int // admitted and not ended
	queued  int
	classes [NumClasses]classQ
	rate    rateMeter
	// heldBy is held by class, peak each class's most held at once over
	// the last peakWindow seconds.
	heldBy [NumClasses]int
	peak   [NumClasses]peakMeter
}

// take counts an admitted request of class c.
func (m *modelQ) take(c Class, now time.Time) {
	m.held++
	m.heldBy[c.idx()]++
	m.peak[c.idx()].observe(now, m.heldBy[c.idx()])
}

// give counts the end of an admitted request of class c.
func (m *modelQ) give(c Class) {
	m.held--
	m.heldBy[c.idx()]--
}

// free is how many requests of class c may start now, given room.
//
// Requests this router admitted that the candidates' counts do not show
// yet (admitted, not yet dispatched: held beyond Visible) take room too.
//
// An engine runs a request to its end once started: a high request
// that finds every slot taken by lower ones waits for one to finish, a
// whole sequence's time, which no queue order can shorten. So a class
// leaves free, of the slots, what the classes above it held at their
// peak over the last peakWindow seconds, and a margin, and do not hold
// now: a class
// with traffic above it starts only into a slot, never into an engine's
// queue, and the low class never into an engine's queue either, so that
// a higher request finds no lower one ahead of it in an engine's
// first-come queue. A model served in one class reserves nothing.
func (m *modelQ) free(r Room, c Class, now time.Time) int {
	if r.Open {
		return math.MaxInt
	}
	reserve := 0
	for h := range c.idx() {
		if p := m.peak[h].max(now); p > 0 {
			reserve += max(p+margin(p)-m.heldBy[h], 0)
		}
	}
	pending := max(m.held-r.Visible, 0)
	if c >= Low || reserve > 0 {
		return r.FreeSlots - reserve - pending
	}
	return r.Free - pending
}

func (m *modelQ) push(w *waiter) {
	m.classes[w.req.Class.idx()].push(w)
	m.queued++
}

// queuedFrom reports whether requests of class c or higher are queued.
func (m *modelQ) queuedFrom(c Class) bool {
	for i := range c.idx() + 1 {
		if len(m.classes[i].items) > 0 {
			return true
		}
	}
	return false
}

// next is the class of the request pop would take (ok false: none).
func (m *modelQ) next() (c Class, ok bool) {
	for i := range m.classes {
		if len(m.classes[i].items) > 0 {
			return classAt(i), true
		}
	}
	return 0, false
}

// pop takes the next request to start: the highest class's smallest
// virtual finish.
func (m *modelQ) pop() *waiter {
	for c := range m.classes {
		if q := &m.classes[c]; len(q.items) > 0 {
			m.queued--
			return q.pop()
		}
	}
	return nil
}

func (m *modelQ) remove(w *waiter) {
	m.classes[w.req.Class.idx()].remove(w)
	m.queued--
}

// ahead estimates how many queued requests start before a new request
// of class c from tenant: every request of a higher class, and within
// its class, about one round of the active tenants per request the
// tenant already has queued there.
func (m *modelQ) ahead(c Class, tenant uint64) int {
	n := 0
	for h := range c.idx() {
		n += len(m.classes[h].items)
	}
	q := &m.classes[c.idx()]
	active := len(q.tenants)
	if q.tenants[tenant] == nil {
		active++
	}
	return n + min(len(q.items), (q.queued(tenant)+1)*active)
}

// lowest is the lowest class with requests queued (ok false: none).
func (m *modelQ) lowest() (c Class, ok bool) {
	for i := NumClasses - 1; i >= 0; i-- {
		if len(m.classes[i].items) > 0 {
			return classAt(i), true
		}
	}
	return 0, false
}

// margin is what a class's reserve keeps beyond its peak p: its
// arrivals are random, and the peak of the last window is exceeded at
// the next; the excess of a Poisson count over its mean grows as its
// square root (square-root staffing), so the margin is √p, rounded up.
func margin(p int) int {
	return int(math.Ceil(math.Sqrt(float64(p))))
}

// peakMeter is the most of a count over the last peakWindow seconds,
// by whole seconds.
type peakMeter struct {
	secs [peakWindow]int64
	most [peakWindow]int
}

const peakWindow = 10

func (p *peakMeter) observe(now time.Time, n int) {
	s := now.Unix()
	i := s % peakWindow
	if p.secs[i] != s {
		p.secs[i], p.most[i] = s, 0
	}
	p.most[i] = max(p.most[i], n)
}

func (p *peakMeter) max(now time.Time) int {
	s := now.Unix()
	most := 0
	for i := range p.secs {
		if p.secs[i] > s-peakWindow && p.secs[i] <= s {
			most = max(most, p.most[i])
		}
	}
	return most
}

// rateMeter measures a model's completions per second over the last
// rateWindow seconds, for the waits it estimates.
type rateMeter struct {
	secs  [rateWindow]int64
	count [rateWindow]int
	first int64 // the second of the first completion counted (0: none)
}

const rateWindow = 10

func (r *rateMeter) add(now time.Time) {
	s := now.Unix()
	if r.first == 0 {
		r.first = s
	}
	i := s % rateWindow
	if r.secs[i] != s {
		r.secs[i], r.count[i] = s, 0
	}
	r.count[i]++
}

// perSec is the rate over the window (or since the first completion, if
// later); 0 when nothing completed in it.
func (r *rateMeter) perSec(now time.Time) float64 {
	s := now.Unix()
	n := 0
	for i := range r.secs {
		if r.secs[i] > s-rateWindow && r.secs[i] <= s {
			n += r.count[i]
		}
	}
	if n == 0 {
		return 0
	}
	span := min(s-r.first+1, rateWindow)
	return float64(n) / float64(span)
}
