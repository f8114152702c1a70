package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// DefaultStallWindow is how long an owned replica with requests in flight
// may send no byte of any of their responses (and end none) before the
// health checker is asked to judge it stalled (Config.Stalled), when the
// proxy is given a judge and no window. A replica that accepts
// connections and answers its health endpoint but whose engine is wedged
// holds every request sent to it until the response header timeout
// (minutes); this window, with a check every eighth of it, ejects it
// within 9 s. It must exceed the longest prefill: an engine prefilling
// sends no byte and moves no generated-token counter either (llama.cpp
// on 2 loaded CPU cores took 10-25 s for 2k-token prompts and was
// ejected at 8 s), which is why `kvmesh router` leaves it off unless
// --stall-window is set.
const DefaultStallWindow = 8 * time.Second

// stallBook keeps the requests in flight at each owned replica and when
// each last heard from it, and cuts them all when the replica is judged
// stalled: before the response's headers the attempt's cancellation
// (the attempt then retries elsewhere, as nothing reached the client),
// after them the relay's idle watch (the client gets an error event).
// Its loop is the Proxy's, ended by close.
type stallBook struct {
	window time.Duration
	judge  func(id string, quiet time.Time, streamed bool) bool
	now    func() time.Time
	cut    func(id string, n int) // told of each replica's requests cut
	mu     sync.Mutex
	runs   map[string]map[*stallMark]struct{}
	// progress: replica -> when a request there last ended, or its
	// requests in flight began (the first of them was sent): the
	// router's sending more is no progress of the replica's.
	progress map[string]time.Time
	stop     chan struct{}
	done     chan struct{}
}

// stallMark is one attempt in flight at an owned replica.
type stallMark struct {
	id       string
	streamed bool
	cancel   func()                             // ends the attempt before its headers
	idle     atomic.Pointer[upstream.IdleWatch] // its relay's watch, once the headers came
	heard    atomic.Bool                        // headers came (with no watch: not judged)
	stalled  atomic.Bool
}

// newStallBook starts the loop that checks every window/8 (a stall is
// caught within 9/8 of the window: 9 s by default, under the 10 s of the
// retry budget, so a request cut before its answer is retried); nil (a
// no-op book) when window <= 0 or judge is nil.
func newStallBook(window time.Duration, judge func(string, time.Time, bool) bool, now func() time.Time, cut func(string, int)) *stallBook {
	if window <= 0 || judge == nil {
		return nil
	}
	b := &stallBook{window: window, judge: judge, now: now, cut: cut, runs: map[string]map[*stallMark]struct{}{},
		progress: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go b.loop(max(window/8, time.Millisecond))
	return b
}

func (b *stallBook) loop(every time.Duration) {
	defer close(b.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.check()
		}
	}
}

// close stops the loop and waits for it.
func (b *stallBook) close() {
	if b == nil {
		return
	}
	close(b.stop)
	<-b.done
}

// add marks an attempt sent to owned replica id; cancel ends it before
// its headers. The caller removes it when the attempt ends.
func (b *stallBook) add(id string, streamed bool, cancel func()) *stallMark {
	if b == nil {
		return nil
	}
	m := &stallMark{id: id, streamed: streamed, cancel: cancel}
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.runs[id]
	if set == nil {
		if len(b.runs) >= maxSeqReplicas {
			return nil
		}
		set = map[*stallMark]struct{}{}
		b.runs[id] = set
		b.progress[id] = b.now()
	}
	set[m] = struct{}{}
	return m
}

// remove ends m; an attempt that ended on its own is its replica's
// progress.
func (b *stallBook) remove(m *stallMark) {
	if b == nil || m == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.runs[m.id]
	delete(set, m)
	if len(set) == 0 {
		delete(b.runs, m.id)
	}
	switch {
	case len(set) == 0:
		delete(b.progress, m.id)
	case !m.stalled.Load():
		b.progress[m.id] = b.now()
	}
}

// headers records that m's response headers came, with w the relay's
// idle watch (nil: no idle timeout, and m is no longer judged: nothing
// would measure nor end its silence).
func (m *stallMark) headers(w *upstream.IdleWatch) {
	if m == nil {
		return
	}
	m.idle.Store(w)
	m.heard.Store(true)
}

// wasStalled reports whether m was cut as its replica stalled.
func (m *stallMark) wasStalled() bool { return m != nil && m.stalled.Load() }

// quiet is since when m heard nothing (the zero time: never, the
// replica's progress decides); ok is false when it is not judged (its
// relay is busy writing, or it has no watch).
func (m *stallMark) quiet() (time.Time, bool) {
	if !m.heard.Load() {
		return time.Time{}, true
	}
	if w := m.idle.Load(); w != nil {
		return w.Quiet()
	}
	return time.Time{}, false
}

// check judges each replica with requests in flight, all quiet for the
// window since its last progress, and cuts them when it is stalled.
func (b *stallBook) check() {
	now := b.now()
	type quietReplica struct {
		id       string
		since    time.Time
		streamed bool
	}
	var quiet []quietReplica
	b.mu.Lock()
	for id, set := range b.runs {
		since, streamed, judged := b.progress[id], false, true
		for m := range set {
			t, ok := m.quiet()
			if !ok {
				judged = false
				break
			}
			since = later(since, t)
			streamed = streamed || m.streamed
		}
		if judged && now.Sub(since) >= b.window {
			quiet = append(quiet, quietReplica{id, since, streamed})
		}
	}
	b.mu.Unlock()
	for _, q := range quiet {
		if b.judge(q.id, q.since, q.streamed) {
			b.cutAll(q.id)
		}
	}
}

// cutAll ends every request in flight at replica id.
func (b *stallBook) cutAll(id string) {
	b.mu.Lock()
	marks := make([]*stallMark, 0, len(b.runs[id]))
	for m := range b.runs[id] {
		marks = append(marks, m)
		m.stalled.Store(true)
	}
	b.mu.Unlock()
	for _, m := range marks {
		if w := m.idle.Load(); w != nil {
			w.Fire()
		} else if m.cancel != nil {
			m.cancel()
		}
	}
	b.cut(id, len(marks))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
