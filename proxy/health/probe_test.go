package health

import (
	"context"
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
	var got reports
	h := New(Config{Interval: time.Hour, LoadInterval: time.Hour}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
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
