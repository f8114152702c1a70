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
// once they are known, it reads nothing more.
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

	e.set(3, 1)
	h.ProbeLoad(rep.URL, 4)
	if len(kick) != 0 {
		t.Fatal("probed an engine whose slots are known")
	}
}
