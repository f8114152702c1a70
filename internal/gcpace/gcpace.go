// Package gcpace sets the garbage collector's percent (GOGC) of a process
// whose live heap is small: the router's is a few megabytes, under which
// GOGC=100 collects every few megabytes allocated (every few hundred
// proxied requests), each cycle at a fixed cost and emptying the pools of
// request buffers (sync.Pool keeps them for one cycle). A higher percent collects less often for a
// bounded price: the heap may grow past the default GOGC's by at most
// the headroom, since the percent falls back towards 100 as the live
// heap grows (docs/history/benchmarks.md, branch s17-reqcpu). A memory limit
// (GOMEMLIMIT) still applies on top, as the runtime applies it.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Percent is the GC percent for a live heap of live bytes: the largest
// percent up to max whose heap goal, live × (1 + percent/100), exceeds
// GOGC=100's (2 × live) by at most headroom bytes; never under 100.
func Percent(live, headroom uint64, max int) int {
	if max <= 100 {
		return 100
	}
	if live == 0 {
		return max
	}
	p := 100 + headroom*100/live
	if p > uint64(max) {
		return max
	}
	return int(p)
}

// Pacer adjusts the process's GC percent while it runs.
type Pacer struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	prev   int
}

// Start sets the GC percent for the live heap now and again every
// interval, until Stop. It is for a process's main (the percent is the
// process's); with GOGC set in the environment the caller should not
// start it, so that the operator's setting stands.
func Start(headroom uint64, max int, every time.Duration) *Pacer {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pacer{cancel: cancel}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	percent := func() int {
		metrics.Read(sample)
		var live uint64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = sample[0].Value.Uint64()
		}
		return Percent(live, headroom, max)
	}
	last := percent()
	p.prev = debug.SetGCPercent(last)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if pct := percent(); pct != last {
					debug.SetGCPercent(pct)
					last = pct
				}
			}
		}
	}()
	return p
}

// Stop stops adjusting and gives the percent back that was set before.
func (p *Pacer) Stop() {
	p.cancel()
	p.wg.Wait()
	debug.SetGCPercent(p.prev)
}
