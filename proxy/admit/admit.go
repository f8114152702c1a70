package admit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config (the router's flags start from these).
const (
	// DefaultMaxWaiting is the requests a replica may queue beyond its
	// slots before it counts as saturated: enough that a freed slot is
	// refilled from the engine's own queue within its step, not after a
	// round trip through the router, and that an engine's slot estimate
	// (route.SlotEstimate, learned while it queues) can still grow; few
	// enough that a high-class request finds at most that many requests
	// ahead of it in the engine's first-come queue, where the router's
	// priorities no longer apply.
	DefaultMaxWaiting = 2
	// DefaultMaxQueue bounds the requests one model's queue holds.
	DefaultMaxQueue = 1024
	// DefaultTimeout is how long a request may wait in the queue before
	// it is shed with 503: long enough to ride out a burst, short enough
	// that an SDK's retry with Retry-After is the better answer.
	DefaultTimeout = 10 * time.Second
	// DefaultPoll is how often a model with requests queued has its room
	// read again when none of this router's requests ends (room freed by
	// other routers' requests, or a scrape that lowered a waiting count).
	DefaultPoll = 50 * time.Millisecond
)

// Config configures an Admitter.
type Config struct {
	// MaxWaiting is the requests a replica may queue beyond its slots
	// (RoomOf); default DefaultMaxWaiting.
	MaxWaiting int
	// MaxKVUsage, when positive, is the KV cache share (0 to 1) at which
	// a replica has no room (RoomOf); 0: not read.
	MaxKVUsage float64
	// MaxQueue bounds each model's queue (default DefaultMaxQueue).
	MaxQueue int
	// Timeout bounds a request's wait in the queue (default
	// DefaultTimeout); a request may ask for less.
	Timeout time.Duration
	// Poll is how often a model with requests queued has its room read
	// again between ends (default DefaultPoll).
	Poll time.Duration
	// Room reads a model's headroom now (required): the dispatcher calls
	// it, without the Admitter's lock, for each model with requests
	// queued.
	Room func(model string) Room
	// Registerer registers the metrics (nil: none).
	Registerer prometheus.Registerer
	// Now is the clock of the rate estimates (default time.Now).
	Now func() time.Time
}

// Request is what admission knows of a request.
type Request struct {
	Model string
	Class Class
	// Tenant identifies who shares fairly (a hash of the API key, a
	// tenant header or the client's address).
	Tenant uint64
	// Cost is the request's estimated tokens, the unit of fairness
	// between tenants (at least 1).
	Cost float64
	// Timeout, when positive and shorter than Config.Timeout, bounds
	// this request's wait instead.
	Timeout time.Duration
}

// Reasons a request is shed (the metric's reason label).
const (
	ReasonQueueFull   = "queue_full"
	ReasonTenantShare = "tenant_share"
	ReasonPreempted   = "preempted"
	ReasonDeadline    = "deadline"
	ReasonClosed      = "closed"
)

// Verdict is Admit's answer for a request.
type Verdict struct {
	// Status is 0 for an admitted request, 429 or 503 for a shed one,
	// 499 when its client went away while it waited.
	Status int
	// Reason is why it was shed (the Reason constants).
	Reason string
	// RetryAfter is when the client may try again.
	RetryAfter time.Duration
	// Queued reports that the request waited in the queue, Wait how long.
	Queued bool
	Wait   time.Duration
}

// Admitted reports whether the request may start.
func (v Verdict) Admitted() bool { return v.Status == 0 }

// Message is the error message for a shed request of model.
func (v Verdict) Message(model string) string {
	switch v.Reason {
	case ReasonTenantShare:
		return fmt.Sprintf("the replicas of the model '%s' are saturated and this tenant holds more than its share of the queue; retry later", model)
	case ReasonPreempted:
		return fmt.Sprintf("the replicas of the model '%s' are saturated and the queue is full of requests of higher priority; retry later", model)
	case ReasonDeadline:
		return fmt.Sprintf("the replicas of the model '%s' are saturated and the request could not start within its queue deadline; retry later", model)
	case ReasonClosed:
		return "the router is shutting down"
	}
	return fmt.Sprintf("the replicas of the model '%s' are saturated and the queue is full; retry later", model)
}

// Admitter admits requests per model. It is safe for concurrent use;
// Close stops its dispatcher.
type Admitter struct {
	cfg  Config
	m    *metrics
	mu   sync.Mutex
	q    map[string]*modelQ
	seq  uint64
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	shut bool
}

// New returns an Admitter and starts its dispatcher.
func New(cfg Config) *Admitter {
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Admitter{cfg: cfg, m: newMetrics(cfg.Registerer), q: map[string]*modelQ{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go a.loop()
	return a
}

// Limits are the Config's, for RoomOf.
func (a *Admitter) Limits() Limits {
	return Limits{MaxWaiting: a.cfg.MaxWaiting, MaxKVUsage: a.cfg.MaxKVUsage}
}

// Admit admits req, given room, the model's headroom as the caller read
// it. While the model has room and nothing of it queues, it returns at
// once (as does a request with only lower classes queued: it would be
// first); otherwise it queues the request, calls beforeWait (the caller
// lets go of what a wait should not hold), and waits until the request
// may start, is shed, its deadline passes or ctx ends. release, non-nil
// exactly when the verdict admits, must be called once when the request
// ends.
func (a *Admitter) Admit(ctx context.Context, req Request, room Room, beforeWait func()) (release func(), v Verdict) {
	req.Class = min(max(req.Class, High), Low)
	now := a.cfg.Now()
	a.mu.Lock()
	m := a.q[req.Model]
	if m == nil {
		m = &modelQ{}
		a.q[req.Model] = m
	}
	if !m.queuedFrom(req.Class) && m.free(room, req.Class, now) > 0 {
		m.take(req.Class, now)
		a.mu.Unlock()
		a.m.admit(req.Class, false, 0)
		return a.releaser(req.Model, m, req.Class), Verdict{}
	}
	if a.shut {
		a.gc(req.Model, m)
		a.mu.Unlock()
		return nil, a.shed(req, Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonClosed, RetryAfter: time.Second})
	}
	timeout := a.cfg.Timeout
	if req.Timeout > 0 {
		timeout = min(timeout, req.Timeout)
	}
	if v, ok := a.mustShed(m, req, timeout, now); ok {
		a.gc(req.Model, m)
		a.mu.Unlock()
		return nil, a.shed(req, v)
	}
	a.seq++
	w := &waiter{req: req, seq: a.seq, enq: now, ready: make(chan struct{})}
	m.push(w)
	a.m.depth(req.Class, 1)
	a.mu.Unlock()
	a.poke()
	if beforeWait != nil {
		beforeWait()
	}
	return a.wait(ctx, m, w, timeout)
}

// mustShed decides, under the lock, whether a request that would queue
// is shed instead: its deadline cannot be met at the measured drain
// rate, or the queue is full (in which case it may displace another
// request, shed here, and be queued).
func (a *Admitter) mustShed(m *modelQ, req Request, timeout time.Duration, now time.Time) (Verdict, bool) {
	rate := m.rate.perSec(now)
	if rate > 0 {
		if est := time.Duration(float64(m.ahead(req.Class, req.Tenant)) / rate * float64(time.Second)); est > timeout {
			return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonDeadline, RetryAfter: a.retryAfter(m, now)}, true
		}
	}
	if m.queued < a.cfg.MaxQueue {
		return Verdict{}, false
	}
	low, _ := m.lowest() // the queue is full: some class has requests
	var victim *waiter
	var vv Verdict
	switch {
	case low > req.Class:
		// A lower class gives way.
		victim = m.classes[low.idx()].newestOfLargest()
		vv = Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonPreempted}
	case low == req.Class:
		q := &m.classes[low.idx()]
		active := len(q.tenants)
		if q.tenants[req.Tenant] == nil {
			active++
		}
		if q.queued(req.Tenant)*active >= len(q.items) {
			// At or over its share of its class: the newcomer is the
			// one over.
			return Verdict{Status: http.StatusTooManyRequests, Reason: ReasonTenantShare, RetryAfter: a.retryAfter(m, now)}, true
		}
		victim = q.newestOfLargest()
		vv = Verdict{Status: http.StatusTooManyRequests, Reason: ReasonTenantShare}
	default:
		return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonQueueFull, RetryAfter: a.retryAfter(m, now)}, true
	}
	m.remove(victim)
	vv.RetryAfter = a.retryAfter(m, now)
	a.m.depth(victim.req.Class, -1)
	victim.verdict = vv
	close(victim.ready)
	return Verdict{}, false
}

// retryAfter estimates when the queue will have drained, from the
// measured rate: 1 s when unknown, at most a minute.
func (a *Admitter) retryAfter(m *modelQ, now time.Time) time.Duration {
	rate := m.rate.perSec(now)
	if rate <= 0 {
		return time.Second
	}
	d := time.Duration(float64(m.queued+1) / rate * float64(time.Second))
	return min(max(d, time.Second), time.Minute)
}

// wait waits for w's turn.
func (a *Admitter) wait(ctx context.Context, m *modelQ, w *waiter, timeout time.Duration) (func(), Verdict) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var status int
	var reason string
	select {
	case <-w.ready:
	case <-ctx.Done():
		status = 499
	case <-t.C:
		status, reason = http.StatusServiceUnavailable, ReasonDeadline
	}
	a.mu.Lock()
	if w.idx >= 0 {
		// Still queued: it leaves, by its deadline or its client.
		m.remove(w)
		a.m.depth(w.req.Class, -1)
		w.verdict = Verdict{Status: status, Reason: reason, RetryAfter: a.retryAfter(m, a.cfg.Now())}
		a.gc(w.req.Model, m)
	} else if w.granted && status == 499 {
		// Granted as its client left: the room goes back.
		w.granted = false
		w.verdict = Verdict{Status: 499}
		m.give(w.req.Class)
		a.gc(w.req.Model, m)
		defer a.poke()
	}
	a.mu.Unlock()
	v := w.verdict
	v.Queued, v.Wait = true, a.cfg.Now().Sub(w.enq)
	switch {
	case w.granted:
		a.m.admit(w.req.Class, true, v.Wait)
		return a.releaser(w.req.Model, m, w.req.Class), v
	case v.Status == 499:
		a.m.cancelled(w.req.Class)
		return nil, v
	}
	return nil, a.shed(w.req, v)
}

func (a *Admitter) shed(req Request, v Verdict) Verdict {
	a.m.shed(req.Class, v.Reason)
	return v
}

// releaser is the release of an admitted request of model and class c.
func (a *Admitter) releaser(model string, m *modelQ, c Class) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			m.give(c)
			m.rate.add(a.cfg.Now())
			queued := m.queued > 0
			a.gc(model, m)
			a.mu.Unlock()
			if queued {
				a.poke()
			}
		})
	}
}

// gc forgets a model with nothing held and nothing queued (under the
// lock).
func (a *Admitter) gc(model string, m *modelQ) {
	if m.held <= 0 && m.queued == 0 && a.q[model] == m {
		delete(a.q, model)
	}
}

// poke wakes the dispatcher.
func (a *Admitter) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// loop is the dispatcher: on a poke, and every Poll while anything is
// queued, it reads the room of each model with requests queued and
// starts as many as fit.
func (a *Admitter) loop() {
	defer close(a.done)
	t := time.NewTimer(a.cfg.Poll)
	t.Stop()
	var models []string
	for {
		select {
		case <-a.stop:
			return
		case <-a.kick:
		case <-t.C:
		}
		var queued bool
		models, queued = a.dispatch(models[:0])
		if queued {
			t.Reset(a.cfg.Poll)
		}
	}
}

// dispatch starts what fits of each model's queue; queued reports that
// requests still wait.
func (a *Admitter) dispatch(models []string) (_ []string, queued bool) {
	a.mu.Lock()
	for name, m := range a.q {
		if m.queued > 0 {
			models = append(models, name)
		}
	}
	a.mu.Unlock()
	slices.Sort(models)
	for _, name := range models {
		room := a.cfg.Room(name)
		now := a.cfg.Now()
		a.mu.Lock()
		if m := a.q[name]; m != nil {
			for m.queued > 0 {
				c, _ := m.next()
				if m.free(room, c, now) <= 0 {
					break
				}
				w := m.pop()
				// It takes a place the room read did not count: one less
				// free, and held-Visible, the estimate of those not yet
				// counted, as it was.
				m.take(c, now)
				room.Free, room.FreeSlots, room.Visible = room.Free-1, room.FreeSlots-1, room.Visible+1
				w.granted = true
				a.m.depth(w.req.Class, -1)
				close(w.ready)
			}
			queued = queued || m.queued > 0
		}
		a.mu.Unlock()
	}
	return models, queued
}

// Depth is how many requests of each class are queued, over all models.
func (a *Admitter) Depth() (d [NumClasses]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.q {
		for c := range m.classes {
			d[c] += len(m.classes[c].items)
		}
	}
	return d
}

// Close stops the dispatcher and sheds every queued request with 503
// (ReasonClosed), as every later one that would queue; a request with
// room still starts, and admitted requests are not affected.
func (a *Admitter) Close() {
	a.mu.Lock()
	if a.shut {
		a.mu.Unlock()
		return
	}
	a.shut = true
	for name, m := range a.q {
		for c := range m.classes {
			q := &m.classes[c]
			for len(q.items) > 0 {
				w := q.pop()
				m.queued--
				a.m.depth(w.req.Class, -1)
				w.verdict = Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonClosed, RetryAfter: time.Second}
				close(w.ready)
			}
		}
		a.gc(name, m)
	}
	a.mu.Unlock()
	close(a.stop)
	<-a.done
}
