package health

import "time"

// Ejection reasons (the reason label of kvmesh_replica_ejections_total).
const (
	// ReasonFailedChecks: FailThreshold consecutive failures, of checks
	// or on the request path.
	ReasonFailedChecks = "failed_checks"
	// ReasonStalled: requests in flight there got no byte for the
	// router's stall window past the prefill it expected of them, and
	// the engine's progress counters, when it publishes them, did not
	// move meanwhile (Stall).
	ReasonStalled = "stalled"
)

// Stall is told by the request path that replica id has requests in
// flight of which none got a response byte, nor ended, since quiet, for
// longer than the prefill the router expected of them and its stall
// window; streamed says whether one of them is a stream. It reports
// whether the replica counts as stalled, and ejects it if it was healthy
// (logged and counted with reason "stalled"); it is then re-admitted
// like any other ejected replica, after PassThreshold passes, once its
// engine shows progress (noteProgressLocked).
//
// The engine's progress counters (engine.Uptime.Progress: tokens
// generated, prompt tokens prefilled, forward passes), when it publishes
// them, have the last word: a replica whose counters moved since quiet is
// working (a long non-streamed answer sends no byte until it is whole),
// and one whose counters stand still, or whose /metrics no longer
// answer, is not. Without counters, only a stream's silence is evidence:
// an engine sends a stream's tokens as they come, so a stream with no
// byte while no other request there progressed is an engine that does
// not progress; a non-streamed request's silence alone is a long answer
// as much as a stall.
func (h *Checker) Stall(id string, quiet time.Time, streamed bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if s == nil {
		return false
	}
	if s.progressKnown {
		if s.progressMoved.After(quiet) {
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

// noteProgressLocked follows the engine's progress counters, scraped at
// r.now. A change is dated at the scrape before it, the earliest the
// engine can have done that work: dated at the scrape that saw it, work
// done before a freeze and seen by the scrape after it would read as
// progress after the freeze, for good. h.mu is held.
func (h *Checker) noteProgressLocked(s *replicaHealth, r pollResult) {
	if !r.scraped {
		return
	}
	v, ok := r.uptime.Progress()
	if !ok {
		return
	}
	if s.progressKnown && v != s.progress {
		s.progressMoved = s.progressAt
	}
	s.progress, s.progressKnown, s.progressAt = v, true, r.now
}

// progressedLocked reports whether a replica ejected as stalled may count
// a passed check towards its re-admission: its engine's progress counters
// moved since the ejection, or it runs nothing (the requests it was stuck
// on are gone, and a new one will tell), or it publishes neither counters
// nor load (the passes alone decide, and a replica still stuck is ejected
// again after one window, its requests retried). h.mu is held.
func (h *Checker) progressedLocked(s *replicaHealth) bool {
	if !s.stalled {
		return true
	}
	l := s.metrics.EngineLoad
	switch {
	case s.progressKnown && s.progressMoved.After(s.stalledAt):
	case l.HasLoad && l.Running == 0 && l.Waiting == 0:
	case !s.progressKnown && !l.HasLoad:
	default:
		return false
	}
	return true
}
