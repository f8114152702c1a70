package health

import "time"

// Ejection reasons (the reason label of kvmesh_replica_ejections_total).
const (
	// ReasonFailedChecks: FailThreshold consecutive failures, of checks
	// or on the request path.
	ReasonFailedChecks = "failed_checks"
	// ReasonStalled: requests in flight there got no byte for the
	// router's stall window, and the engine's generated-token counter,
	// when it publishes one, did not move meanwhile (Stall).
	ReasonStalled = "stalled"
)

// Stall is told by the request path that replica id has requests in
// flight of which none got a response byte, nor ended, since quiet;
// streamed says whether one of them is a stream. It reports whether the
// replica counts as stalled, and ejects it if it was healthy (logged and
// counted with reason "stalled"); it is then re-admitted like any other
// ejected replica, after PassThreshold passes, once its engine shows
// progress (noteTokensLocked).
//
// The engine's generated-token counter, when it publishes one, has the
// last word: a replica whose counter moved since quiet is generating (a
// long non-streamed answer sends no byte until it is whole), and one
// whose counter is still, or whose /metrics no longer answer, is not.
// Without a counter, only a stream's silence is evidence: an engine
// sends a stream's headers at once and its tokens as they come, so a
// stream with no byte for the window while no other request there
// progressed is an engine that does not progress; a non-streamed
// request's silence alone is a long answer as much as a stall.
func (h *Checker) Stall(id string, quiet time.Time, streamed bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if s == nil {
		return false
	}
	if s.tokensKnown {
		if s.tokensMoved.After(quiet) {
			return false
		}
	} else if !streamed {
		return false
	}
	if s.healthy {
		s.healthy, s.ejected, s.stalled = false, true, true
		s.passes, s.stalledAt = 0, time.Now()
		h.ejections.WithLabelValues(ReasonStalled).Inc()
		h.log.Warn("replica ejected", "replica", id, "reason", ReasonStalled, "quiet", time.Since(quiet).Round(time.Millisecond))
		h.notify(id, s)
	}
	return true
}

// noteTokensLocked follows the engine's generated-token counter, scraped
// at now; h.mu is held.
func (h *Checker) noteTokensLocked(s *replicaHealth, r pollResult) {
	if !r.scraped {
		return
	}
	v, ok := r.uptime.GeneratedTokens()
	if !ok {
		return
	}
	if s.tokensKnown && v != s.tokens {
		s.tokensMoved = r.now
	}
	s.tokens, s.tokensKnown = v, true
}

// progressedLocked reports whether a replica ejected as stalled may count
// a passed check towards its re-admission: its engine generated since the
// ejection, or runs nothing (the requests it was stuck on are gone, and
// a new one will tell), or it publishes neither counter nor load (the
// passes alone decide, and a replica still stuck is ejected again after
// one window, its requests retried). h.mu is held.
func (h *Checker) progressedLocked(s *replicaHealth) bool {
	if !s.stalled {
		return true
	}
	l := s.metrics.EngineLoad
	switch {
	case s.tokensKnown && s.tokensMoved.After(s.stalledAt):
	case l.HasLoad && l.Running == 0 && l.Waiting == 0:
	case !s.tokensKnown && !l.HasLoad:
	default:
		return false
	}
	return true
}
