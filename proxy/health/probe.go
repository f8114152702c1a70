package health

import "time"

// probeGap is the least time between two of a replica's load scrapes that
// ProbeLoad asks: a tenth of a second, so that a router sending an engine
// of unknown slots a burst of requests reads it a few times a second at
// most, and only until it learns the slots.
const probeGap = 100 * time.Millisecond

// ProbeLoad is told that this router now has inFlight requests at replica
// id, which it owns. When that is more than the engine is known to run at
// once (mayRunMoreLocked: its slots unknown, or learnt and perhaps
// understated), its load is scraped at once rather than at the next
// LoadInterval: if it queues them, its slots are learnt at that first
// queue (the only moment they can be, and one a scrape a second mostly
// misses), and if it runs them, a learnt count rises. Engines that
// publish their slots, or publish no running and waiting counts, are not
// probed. It does not block.
func (h *Checker) ProbeLoad(id string, inFlight int) {
	h.mu.Lock()
	s := h.state[id]
	ask := s != nil && s.kick != nil && s.healthy && s.metrics.HasLoad && h.mayRunMoreLocked(s, inFlight)
	h.mu.Unlock()
	if ask {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// loadAge is how long ago replica s's load was last scraped.
func (h *Checker) loadAge(s *replicaHealth) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Since(s.lastLoad)
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
