package health

import "time"

// probeGap is the least time between two of a replica's load scrapes that
// ProbeLoad asks: a tenth of a second, so that a router sending an engine
// of unknown slots a burst of requests reads it a few times a second at
// most, and only until it learns the slots.
const probeGap = 100 * time.Millisecond

// ProbeLoad is told that this router now has inFlight requests at replica
// id, which it owns. While the engine's slots are unknown (it publishes
// its running and waiting counts but no slots, and has not been seen
// queueing), and inFlight is more than the engine has been seen running
// with nothing waiting, its load is scraped at once rather than at the
// next LoadInterval: if it queues them, its slots are learnt at that
// first queue (the only moment they can be, and one a scrape a second
// mostly misses), and every decision after knows which of its replicas
// can start a request. It does not block.
func (h *Checker) ProbeLoad(id string, inFlight int) {
	h.mu.Lock()
	s := h.state[id]
	ask := s != nil && s.kick != nil && s.healthy && s.metrics.HasLoad && int32(inFlight) > s.ranFree && h.statusLocked(s).Load.Slots == 0
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
