package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// DefaultStallWindow is how long an owned replica with requests in flight
// may show no progress, beyond the prefill the router expects of it,
// before the health checker is asked to judge it stalled (Config.Stalled):
// a replica that accepts connections and answers its health endpoint
// but whose engine is wedged would otherwise hold every request sent to
// it until the response header timeout (minutes). Checked every eighth
// of the window, a stall is caught within 9/8 of it: 9 s, inside the
// 10 s retry budget (DefaultRetryBudget), so the stalled replica's
// unanswered requests are retried while their clients still wait. The
// window only has to cover what the prefill estimate does not: an
// engine step that ends no prefill (a decode step of a full batch, a
// preemption's recompute, a garbage-collection pause: seconds at most)
// and the load scrape that reads the engine's counters (every second,
// with a one-second timeout).
const DefaultStallWindow = 8 * time.Second

// prefillSlack multiplies the prefill the router expects of a quiet
// replica: its learned rate is a mean of samples that vary with the
// machine's load (a CPU engine sharing its cores took twice as long in
// CI's loaded runs) and with prompt length (attention grows faster than
// the prompt).
const prefillSlack = 2

// unmeasuredPrefill is the prefill allowed to requests at a replica whose
// prefill this router has never timed, and no other replica's either: it
// has no rate to expect one by, so it allows what it allows any
// replica's silence once it has spoken (the default upstream idle
// timeout, DefaultUpstreamIdleTimeout). The first answer gives the rate.
const unmeasuredPrefill = 60 * time.Second

// rateEWMADiv is the weight of the newest sample in a replica's prefill
// rate, 1/4: a few prefills set it, and it follows a machine whose load
// changes within a few requests.
const rateEWMADiv = 4

// Outcomes of a stretch of silence past the window (the outcome label of
// kvmesh_stall_checks_total), each counted once per stretch.
const (
	// stallPrefilling: quiet past the window but within the prefill the
	// router expects of the requests that were waiting for their first
	// byte when the silence began; not judged.
	stallPrefilling = "prefilling"
	// stallProgressing: judged, and the engine's progress counters moved
	// since the silence began (health.Checker.Stall).
	stallProgressing = "progressing"
	// stallStalled: judged stalled; the replica was ejected and its
	// requests ended.
	stallStalled = "stalled"
)

// stallBook keeps the requests in flight at each owned replica and when
// the replica last showed progress, and cuts them all when the replica is
// judged stalled: before the response's headers the attempt's
// cancellation (the attempt then retries elsewhere, as nothing reached
// the client), after them the relay's idle watch (the client gets an
// error event). Its loop is the Proxy's, ended by close.
//
// Progress is what the router sees the engine do: a body byte of any of
// its responses, or one of its requests ending. A request sent is not
// (steady arrivals would hide a stall), and neither are response headers
// without a body byte (vLLM's server sends a stream's headers when it
// accepts the request, before the engine schedules it). A silence is
// allowed the window plus, at the replica's learned prefill rate and
// times prefillSlack, the prefill of the requests waiting for their
// first byte (their uncached blocks; those sent after the silence had
// lasted a window add nothing, expectedLocked) and one block for the
// engine step under way. The blocks are the decision's prediction: a
// request whose cached prefix the engine evicted since brings more,
// which the engine's progress counters, the judge's word, have to cover.
// The rate is
// learned from the same silences: each first byte of a request of at
// least a block ends one, which took that request's blocks at most
// (others may have been prefilled in the same stretch, so the rate errs
// long, the safe side). Until a replica's first such answer it borrows
// the slowest rate of the router's other replicas, and with none allows
// unmeasuredPrefill.
type stallBook struct {
	window time.Duration
	judge  func(id string, quiet time.Time, streamed bool) bool
	now    func() time.Time
	cut    func(id string, n int)                        // told of each replica's requests cut
	note   func(id, outcome string, quiet time.Duration) // told of each silence's outcome, once (nil: not counted)
	mu     sync.Mutex
	runs   map[string]map[*stallMark]struct{}
	// progress: replica -> when a request there last ended, or its
	// requests in flight began (the first of them was sent).
	progress map[string]time.Time
	// rates: replica -> its learned prefill time per block of work, ms.
	rates map[string]float64
	// noted: replica -> the silence (its start) and outcome last noted.
	noted map[string]notedSilence
	// unmeasured is the prefill allowed where no rate is known
	// (unmeasuredPrefill; tests set it).
	unmeasured time.Duration
	stop       chan struct{}
	done       chan struct{}
}

// notedSilence is a silence whose outcome was counted.
type notedSilence struct {
	since   time.Time
	outcome string
}

// stallMark is one attempt in flight at an owned replica.
type stallMark struct {
	id       string
	streamed bool
	// work is the prefill the request brings, in blocks: the full blocks
	// the decision expected the replica to lack.
	work     float64
	sent     time.Time
	answered bool                               // its first body byte came; under the book's mu
	cancel   func()                             // ends the attempt before its headers
	idle     atomic.Pointer[upstream.IdleWatch] // its relay's watch, once the headers came
	heard    atomic.Bool                        // headers came (with no watch: not judged)
	stalled  atomic.Bool
}

// newStallBook starts the loop that checks every window/8; nil (a no-op
// book) when window <= 0 or judge is nil.
func newStallBook(window time.Duration, judge func(string, time.Time, bool) bool, now func() time.Time, cut func(string, int), note func(string, string, time.Duration)) *stallBook {
	if window <= 0 || judge == nil {
		return nil
	}
	b := &stallBook{window: window, judge: judge, now: now, cut: cut, note: note, runs: map[string]map[*stallMark]struct{}{},
		progress: map[string]time.Time{}, rates: map[string]float64{}, noted: map[string]notedSilence{},
		unmeasured: unmeasuredPrefill, stop: make(chan struct{}), done: make(chan struct{})}
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

// add marks an attempt sent to owned replica id, bringing blocks of
// prefill the replica lacks; cancel ends it before its headers. The
// caller removes it when the attempt ends.
func (b *stallBook) add(id string, streamed bool, blocks float64, cancel func()) *stallMark {
	if b == nil {
		return nil
	}
	now := b.now()
	m := &stallMark{id: id, streamed: streamed, work: max(blocks, 0), sent: now, cancel: cancel}
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.runs[id]
	if set == nil {
		if len(b.runs) >= maxSeqReplicas {
			return nil
		}
		set = map[*stallMark]struct{}{}
		b.runs[id] = set
		b.progress[id] = now
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
	switch {
	case len(set) == 0:
		delete(b.runs, m.id)
		delete(b.progress, m.id)
		delete(b.noted, m.id)
	case !m.stalled.Load():
		b.progress[m.id] = b.now()
	}
}

// answer records m's first body byte, and learns from the silence it
// ended how long the replica takes to prefill a block.
func (b *stallBook) answer(m *stallMark) {
	if b == nil || m == nil {
		return
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.runs[m.id]
	if _, ok := set[m]; !ok || m.answered {
		return
	}
	m.answered = true
	if m.work < 1 {
		// Less than a block to prefill: the time is the engine's fixed
		// cost per request (template, scheduling, the first token),
		// which says nothing of its time per block.
		return
	}
	since, _, judged := b.quietLocked(m.id, set, m)
	if !judged {
		return // a relay was writing: the replica was not silent
	}
	gap := now.Sub(later(since, m.sent))
	if gap <= 0 {
		return
	}
	sample := float64(gap) / float64(time.Millisecond) / m.work
	r, ok := b.rates[m.id]
	switch {
	case ok:
		b.rates[m.id] = r + (sample-r)/rateEWMADiv
	case len(b.rates) < maxSeqReplicas:
		b.rates[m.id] = sample
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

// quiet is since when m heard nothing of the engine (the zero time:
// never, the replica's progress decides); ok is false when it is not
// judged (its relay is busy writing, or it has no watch).
func (m *stallMark) quiet() (time.Time, bool) {
	if !m.heard.Load() {
		return time.Time{}, true
	}
	w := m.idle.Load()
	switch {
	case w == nil:
		return time.Time{}, false
	case !w.Spoke():
		return time.Time{}, true // headers alone are the server's, not the engine's
	}
	return w.Quiet()
}

// quietLocked is since when replica id, with requests set in flight, has
// shown no progress (except's own bytes not counted), whether one of them
// is a stream, and whether it is judged at all (false while a relay
// writes to its client). b.mu is held.
func (b *stallBook) quietLocked(id string, set map[*stallMark]struct{}, except *stallMark) (since time.Time, streamed, judged bool) {
	since = b.progress[id]
	for m := range set {
		if m == except {
			continue
		}
		t, ok := m.quiet()
		if !ok {
			return since, streamed, false
		}
		since = later(since, t)
		streamed = streamed || m.streamed
	}
	return since, streamed, true
}

// expectedLocked is the silence replica id may keep past the window
// when it has been quiet since since, with prefillSlack: the prefill it
// owes the requests of set waiting for their first byte that were sent
// before the silence had lasted a window (a request of less than a block
// counts one, its fixed cost), and one block more for the engine step
// under way, whatever it is (a decode step, which reads the model once
// for every running sequence, costs less than prefilling a block, which
// computes it for each of its tokens: on an engine slowed tenfold by a
// loaded machine the steps slow alike). A request sent later is queued
// behind the step that keeps the engine silent: it does not delay the
// next progress, and a stall that keeps receiving requests must not be
// allowed more with each. b.mu is held.
func (b *stallBook) expectedLocked(id string, set map[*stallMark]struct{}, since time.Time) time.Duration {
	var work float64
	horizon := since.Add(b.window)
	for m := range set {
		if !m.answered && !m.sent.After(horizon) {
			work += max(m.work, 1)
		}
	}
	rate, ok := b.rates[id]
	if !ok {
		// Not timed here yet: the router's other replicas run the same
		// engines, most likely on the same hardware; the slowest of them.
		for _, r := range b.rates {
			rate, ok = max(rate, r), true
		}
	}
	switch {
	case !ok && work == 0:
		return 0
	case !ok:
		return b.unmeasured
	}
	return time.Duration(prefillSlack * rate * (work + 1) * float64(time.Millisecond))
}

// rate is replica id's learned prefill time per block in ms (ok false:
// none yet).
func (b *stallBook) rate(id string) (ms float64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ms, ok = b.rates[id]
	return ms, ok
}

// noteLocked counts the outcome of replica id's silence since since, once
// per silence and outcome. b.mu is held.
func (b *stallBook) noteLocked(id string, since time.Time, outcome string) {
	n := notedSilence{since: since, outcome: outcome}
	if b.noted[id] == n {
		return
	}
	b.noted[id] = n
	if b.note != nil {
		b.note(id, outcome, b.now().Sub(since))
	}
}

// check judges each replica quiet for the window past the prefill it
// owes, and cuts its requests when it is stalled.
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
		since, streamed, judged := b.quietLocked(id, set, nil)
		if !judged || now.Sub(since) < b.window {
			continue
		}
		if now.Sub(since) < b.window+b.expectedLocked(id, set, since) {
			b.noteLocked(id, since, stallPrefilling)
			continue
		}
		quiet = append(quiet, quietReplica{id, since, streamed})
	}
	b.mu.Unlock()
	for _, q := range quiet {
		stalled := b.judge(q.id, q.since, q.streamed)
		outcome := stallProgressing
		if stalled {
			outcome = stallStalled
		}
		b.mu.Lock()
		if _, ok := b.runs[q.id]; ok {
			b.noteLocked(q.id, q.since, outcome)
		}
		b.mu.Unlock()
		if stalled {
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
