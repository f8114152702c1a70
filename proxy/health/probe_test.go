package health

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestProbeLoadLearnsSlotsAtTheFirstQueue: scheduled scrapes are an hour
// apart, so only ProbeLoad can make the checker see the engine queue.
// Told of no more requests than the engine was seen running, it reads
// nothing; told of more, it scrapes (at once, or once probeGap has passed
// since the last scrape) and learns the slots from the queue it finds;
// a learnt count it reads again when told of more than that.
func TestProbeLoadLearnsSlotsAtTheFirstQueue(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	e.set(2, 0)
	rep := newReplica(t, e.serve)
	h, got, _ := runHourly(t, rep.URL)
	waitFor(t, "the first check", func() bool { c, _ := got.last(rep.URL); return h.Ready() && c.Load.MinSlots == 2 })

	h.mu.Lock()
	kick := h.state[rep.URL].kick
	h.mu.Unlock()
	h.ProbeLoad(rep.URL, 2)
	if len(kick) != 0 {
		t.Fatal("probed with no more in flight than the engine was seen running")
	}
	h.ProbeLoad("http://unknown.invalid", 9) // not a replica: nothing

	e.set(2, 1)             // the third request queues
	h.ProbeLoad(rep.URL, 3) // likely within probeGap of the first scrape: it waits for the gap
	waitFor(t, "the slots learnt from the probe", func() bool { c, _ := got.last(rep.URL); return c.Load.Slots == 2 })

	// A learnt count is confirmed while the engine queues: no probe.
	reads := rep.count()
	h.ProbeLoad(rep.URL, 3)
	if len(kick) != 0 {
		t.Fatal("probed an engine seen queueing at its learnt slots")
	}
	// Once a scrape shows nothing waiting, the count is a floor: told of
	// more, the checker reads the engine again, and what it runs raises
	// the count.
	e.set(2, 0)
	h.round(t.Context())
	if rep.count() == reads {
		t.Fatal("round read nothing")
	}
	e.set(3, 0)
	h.ProbeLoad(rep.URL, 3)
	waitFor(t, "the learnt slots raised", func() bool { c, _ := got.last(rep.URL); return c.Load.Slots == 3 })
	if !h.SlotsLearned(rep.URL) {
		t.Error("SlotsLearned false for slots learnt from the queue")
	}
}

// An engine that publishes its slots is never probed, nor are its slots
// learned.
func TestProbeLoadSkipsPublishedSlots(t *testing.T) {
	l, rep := newLlamaCpp(t, 2)
	l.set(2, 0)
	var got reports
	h := New(Config{}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	h.round(t.Context())
	h.mu.Lock()
	s := h.state[rep.URL]
	s.kick = make(chan struct{}, 1) // as Run makes it
	h.mu.Unlock()
	h.ProbeLoad(rep.URL, 9)
	if len(s.kick) != 0 {
		t.Error("probed an engine that publishes its slots")
	}
	if h.SlotsLearned(rep.URL) {
		t.Error("SlotsLearned true for published slots")
	}
}

// A scrape every interval is due at the tick that comes a hair before
// the interval has passed since the last one began (which began a little
// after its own tick), not a whole tick later; and a scrape done off the
// ticks (a probe's) defers the next only while the tick would come more
// than half a tick early.
func TestDueAtTheTickNearestTheInterval(t *testing.T) {
	const s = time.Second
	tests := []struct {
		elapsed, interval, tick time.Duration
		want                    bool
	}{
		{999 * time.Millisecond, s, s, true}, // the last poll began 1 ms after its tick
		{s, s, s, true},
		{600 * time.Millisecond, s, s, true}, // a probe 400 ms after a tick: the next tick scrapes
		{400 * time.Millisecond, s, s, false},
		{1999 * time.Millisecond, 2 * s, s, true}, // health every 2 s on a 1 s tick
		{1400 * time.Millisecond, 2 * s, s, false},
		{29500 * time.Millisecond, 30 * s, s, true}, // info
		{28 * s, 30 * s, s, false},
		{time.Since(time.Time{}), 30 * s, s, true}, // never done: Since saturates
	}
	for _, tc := range tests {
		if got := due(tc.elapsed, tc.interval, tc.tick); got != tc.want {
			t.Errorf("due(%v, every %v, tick %v) = %v, want %v", tc.elapsed, tc.interval, tc.tick, got, tc.want)
		}
	}
}

// The replica's loop, not a forced round, reads the engine's info at its
// first poll: llama.cpp's slots come only from /props, and a loop whose
// schedule never found the info due (work never done) left them unknown.
func TestLoopReadsInfoAtTheFirstPoll(t *testing.T) {
	e, rep := newLlamaCpp(t, 4)
	e.set(1, 0)
	var got reports
	h := New(Config{Interval: time.Second, LoadInterval: time.Second}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the slots published in /props", func() bool { c, _ := got.last(rep.URL); return c.Load.Slots == 4 })
}

// laggingEngine is a fake vLLM whose /metrics counts change only at its
// steps, as vLLM's do (when an engine step ends): each read of /metrics
// takes the next of its scripted counts, and the last stays.
type laggingEngine struct {
	engineReplica
	smu   sync.Mutex
	steps [][2]int
	reads int // reads of /metrics
}

func (l *laggingEngine) script(steps ...[2]int) {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.steps = steps
}

func (l *laggingEngine) metricReads() int {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.reads
}

func (l *laggingEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		l.smu.Lock()
		l.reads++
		if len(l.steps) > 0 {
			l.set(l.steps[0][0], l.steps[0][1])
			if len(l.steps) > 1 {
				l.steps = l.steps[1:]
			}
		}
		l.smu.Unlock()
	}
	l.engineReplica.serve(w, r)
}

// runHourly runs a checker over one replica whose scheduled checks and
// scrapes are an hour apart, so that only probes read the engine; stop
// ends the checker's loops (t.Cleanup does too).
func runHourly(t *testing.T, url string) (h *Checker, got *reports, stop func()) {
	t.Helper()
	got = &reports{}
	h = New(Config{Interval: time.Hour, LoadInterval: time.Hour}, []string{url}, nil, got.add, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return h, got, stop
}

// newLagging starts a checker's loop (scheduled scrapes an hour apart:
// only probes read the load) over a lagging engine seen running 1 with
// nothing waiting.
func newLagging(t *testing.T) (*laggingEngine, *replicaServer, *Checker, *reports) {
	t.Helper()
	e := &laggingEngine{engineReplica: engineReplica{metrics: vllmMetrics}}
	e.set(1, 0)
	rep := newReplica(t, e.serve)
	h, got, _ := runHourly(t, rep.URL)
	waitFor(t, "the first check", func() bool { c, _ := got.last(rep.URL); return h.Ready() && c.Load.MinSlots == 1 })
	return e, rep, h, got
}

func (h *Checker) probingNow(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state[id].probing
}

// TestProbeReadsAgainWhileTheCountsLag: vLLM counts a request only when
// an engine step ends, so the probe's first reads find the requests sent
// not yet counted. It reads again, backing off, until the counts account
// for them, and learns the slots from the queue it then finds; with one
// read, the slots stayed unknown.
func TestProbeReadsAgainWhileTheCountsLag(t *testing.T) {
	e, rep, h, got := newLagging(t)
	e.script([2]int{1, 0}, [2]int{1, 0}, [2]int{1, 0}, [2]int{2, 1}) // three reads behind
	h.ProbeLoad(rep.URL, 3)
	waitFor(t, "the slots learnt once the counts caught up", func() bool { c, _ := got.last(rep.URL); return c.Load.Slots == 2 })
	// The queue is read through (a token-budget wait is gone at the next
	// step), and the probe ends within its bound.
	waitFor(t, "the probe's end", func() bool { return !h.probingNow(rep.URL) })
	if n := e.metricReads(); n > 1+probeReads {
		t.Errorf("%d reads of /metrics, want at most the first check's and %d", n, probeReads)
	}
}

// A probe whose engine never counts what the router sent stops after
// probeReads reads; while one is under way, ProbeLoad asks no other.
func TestProbeReadsAreBounded(t *testing.T) {
	e, rep, h, _ := newLagging(t)
	reads := e.metricReads()
	h.ProbeLoad(rep.URL, 3) // the engine goes on showing 1 running
	waitFor(t, "the probe's reads", func() bool { return e.metricReads() == reads+probeReads })
	waitFor(t, "the probe's end", func() bool { return !h.probingNow(rep.URL) })
	if n := e.metricReads() - reads; n != probeReads {
		t.Errorf("the probe read /metrics %d times, want %d", n, probeReads)
	}

	h.mu.Lock()
	s := h.state[rep.URL]
	s.probing = true // as the loop has it while a read is pending
	h.mu.Unlock()
	h.ProbeLoad(rep.URL, 3)
	if len(s.kick) != 0 {
		t.Error("ProbeLoad asked a second probe while one was under way")
	}
}

// TestProbeReadsThroughATokenBudgetWait: a queue the engine's token
// budget made (the step's prompts took it all) looks like a slot queue
// at 3, but at the next step the engine runs all 6. The probe, reading
// through the queue, learns 6; stopping once the counts accounted for
// the requests (3 running + 3 waiting), it learnt 3 and no more.
func TestProbeReadsThroughATokenBudgetWait(t *testing.T) {
	e, rep, h, got := newLagging(t)
	e.script([2]int{3, 3}, [2]int{6, 0})
	h.ProbeLoad(rep.URL, 6)
	waitFor(t, "the slots raised at the next step", func() bool { c, _ := got.last(rep.URL); return c.Load.Slots == 6 })
	waitFor(t, "the probe's end", func() bool { return !h.probingNow(rep.URL) })
}

// A probe's pending read ends with the loop that would have done it: a
// loop started again (Run again) is not left believing one is pending,
// which would stop ProbeLoad from asking.
func TestProbePendingEndsWithTheLoop(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	e.set(1, 0)
	rep := newReplica(t, e.serve)
	h, _, stop := runHourly(t, rep.URL)
	waitFor(t, "the first check", func() bool { return h.Ready() })
	h.mu.Lock()
	h.state[rep.URL].probing = true // as the loop has it while a read is pending
	h.mu.Unlock()
	stop()
	if h.probingNow(rep.URL) {
		t.Error("a probe's read still pending after the loop stopped")
	}
}
