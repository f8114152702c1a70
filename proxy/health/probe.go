package health

import (
	"context"
	"math"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/panics"
)

// probeGap is the least time between two of a replica's load scrapes that
// ProbeLoad asks: a tenth of a second, so that a router sending an engine
// of unknown slots a burst of requests reads it a few times a second at
// most, and only until it learns the slots. It is also the first of a
// probe's backoff delays (replicaHealth.probeAgain).
const probeGap = 100 * time.Millisecond

// probeReads bounds the reads of one probe: its first and up to four
// more, probeGap apart and doubling (100, 200, 400, 800 ms; each at most
// the LoadInterval), about a second and a half in all, after which the
// scheduled scrapes read the engine anyway. vLLM updates its running and
// waiting counts only when an engine step ends, which took 0.4–2.8 s on a
// CPU: the probe's one read at once saw a request sent 0.16 s before it
// not yet counted (docs/BENCHMARKS.md, "Real vLLM with the slot probe").
const probeReads = 5

// ProbeLoad is told that this router now has inFlight requests at replica
// id, which it owns. When that is more than the engine is known to run at
// once (mayRunMoreLocked: its slots unknown, or learnt and perhaps
// understated), its load is scraped at once rather than at the next
// LoadInterval: if it queues them, its slots are learnt at that first
// queue (the only moment they can be, and one a scrape a second mostly
// misses), and if it runs them, a learnt count rises. The probe reads
// again, backing off, while the engine's counts lag (replicaHealth.probeAgain).
// Engines that publish their slots, or publish no running and waiting
// counts, are not probed. It does not block.
func (h *Checker) ProbeLoad(id string, inFlight int) {
	h.mu.Lock()
	s := h.state[id]
	ask := s != nil && s.kick != nil && s.healthy && s.metrics.HasLoad && !s.probing && h.mayRunMoreLocked(s, inFlight)
	if s != nil {
		s.probeWant = int32(min(inFlight, math.MaxInt32))
	}
	h.mu.Unlock()
	if ask {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// loop checks replica id until ctx is done: a poll at every tick (each
// doing what is due), at a probe's kick, and at a probe's next read.
// The one timer of a probe's reads is the loop's, stopped when it ends.
func (h *Checker) loop(ctx context.Context, id string, s *replicaHealth, kick <-chan struct{}) {
	t := time.NewTicker(min(h.cfg.LoadInterval, h.cfg.Interval))
	defer t.Stop()
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	var againC <-chan time.Time // non-nil while a probe's next read is pending
	// A loop started again (Run again) may be asked for a probe anew.
	defer func() {
		h.mu.Lock()
		s.probing = false
		h.mu.Unlock()
	}()
	kicked, reads := false, 0
	for {
		// One poll is the unit a panic costs: poll holds no lock
		// while it reads the replica, and apply's is deferred.
		h.cfg.Panics.Guard(panics.HealthCheck, func() { h.poll(ctx, id, s, false, kicked) })
		if kicked {
			reads++
			againC = nil
			h.mu.Lock()
			d, more := s.probeAgain(reads, h.cfg.LoadInterval)
			h.mu.Unlock()
			if more {
				again.Reset(d)
				againC = again.C
			} else {
				reads = 0
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			kicked = false
		case <-againC:
			kicked = true
		case <-kick:
			// A probe asked within probeGap of the last scrape waits
			// for the gap to pass rather than being dropped: the
			// request that queues comes after the one that asked.
			kicked = true
			h.mu.Lock()
			d := probeGap - time.Since(s.lastLoad)
			h.mu.Unlock()
			if d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
		}
	}
}

// probeAgain reports whether a probe that has read replica s reads times
// reads it again, and after how long (backing off from probeGap, at most
// the load interval): while its counts (running plus waiting) do not yet
// account for the requests the router last said it has in flight there
// (the engine has not counted them yet), and while it shows requests
// waiting. A queue can be a wait for the engine's
// token budget (the prompts of this step took it all), which looks like a
// slot queue but is gone at the next step, vLLM's /metrics telling the
// two apart by nothing (vllm:num_requests_waiting_by_reason counts both
// as "capacity"): a read after that step sees the engine run more, and
// the count learnt from it rises. An engine that publishes its slots,
// or whose counts are gone, is not read again; nor is one read
// probeReads times. The checker's mu is held.
func (s *replicaHealth) probeAgain(reads int, interval time.Duration) (time.Duration, bool) {
	m := s.metrics
	s.probing = reads < probeReads && s.healthy && m.HasLoad && m.Merge(s.info).Slots == 0 &&
		(m.Running+m.Waiting < s.probeWant || m.Waiting > 0)
	if !s.probing {
		return 0, false
	}
	return min(probeGap<<(reads-1), max(interval, probeGap)), true
}

// learn learns from replica id's last scrape what it shows of the
// engine's slots: the most sequences seen running while requests wait
// (or, once learnt, seen running at all) and the most seen running with
// nothing waiting. The checker's mu is held.
func (s *replicaHealth) learn(id string, log hclog.Logger) {
	m := s.metrics
	if !m.HasLoad {
		return
	}
	if (m.Waiting > 0 || s.learnedSlots > 0) && m.Running > s.learnedSlots {
		if m.Merge(s.info).Slots == 0 {
			log.Info("engine slots learnt", "replica", id, "slots", m.Running, "was", s.learnedSlots, "waiting", m.Waiting)
		}
		s.learnedSlots = m.Running
	}
	if m.Waiting == 0 {
		s.ranFree = max(s.ranFree, m.Running)
	}
}

// mayRunMoreLocked reports that inFlight is more than the engine of s is
// known to run at once: more than it was seen running with nothing
// waiting while its slots are unknown, or, while its last scrape showed
// nothing waiting, more than the slots learnt from its queue (which an
// engine short of KV cache at that moment understates; one seen queueing
// since has confirmed them, and is not read more often for it). A
// published count is known. h.mu is held.
func (h *Checker) mayRunMoreLocked(s *replicaHealth, inFlight int) bool {
	switch published := s.metrics.Merge(s.info).Slots; {
	case published > 0:
		return false
	case s.learnedSlots > 0:
		return s.metrics.Waiting == 0 && int32(inFlight) > s.learnedSlots
	}
	return int32(inFlight) > s.ranFree
}

// SlotsLearned reports that replica id's slots were learnt from its
// queue (SlotEstimate), not published by the engine.
func (h *Checker) SlotsLearned(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	return s != nil && s.learnedSlots > 0 && s.metrics.Merge(s.info).Slots == 0
}

// due reports whether work done every interval, last done elapsed ago,
// is due at a tick of the loop, which comes every tick: when the next
// tick would find it more than half a tick late. Elapsed is measured
// from when the last poll began, a little after its tick, or off the
// ticks altogether (a probe's scrape, ProbeLoad), so "elapsed >=
// interval" would skip the tick that comes a hair early and do the work
// a whole tick late (scrapes at a 1 s interval were seen 2 s apart a
// third of the time on real vLLM). Never done is a saturated elapsed
// (time.Time.Sub of the zero time), which must not overflow.
func due(elapsed, interval, tick time.Duration) bool {
	return elapsed >= interval-tick/2
}
