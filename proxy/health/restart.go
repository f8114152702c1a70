package health

import "github.com/kvmesh/kvmesh/internal/engine"

// Restarts. An engine that restarted holds nothing in its cache, and the
// summary of what it held must go with it (the mesh cuts it when
// ReplicaStatus.Restarts grows). The evidence, best first: the process
// start time its /metrics publishes changed, or its counters were set
// back (engine.Uptime); only an engine whose metrics tell neither is taken
// for restarted whenever it was ejected and re-admitted, since it cannot
// be told from one that was only unreachable for a while.

// noteUptimeLocked compares one scrape's uptime evidence with the last
// one that had any; h.mu is held.
func (h *Checker) noteUptimeLocked(id string, s *replicaHealth, u engine.Uptime) {
	if !u.Known() {
		return
	}
	if s.uptime.Known() && u.RestartedSince(s.uptime) {
		h.restartedLocked(id, s, "its metrics show a new process")
	}
	s.uptime = u
}

// readmittedLocked is told of an ejected replica's re-admission; h.mu is
// held.
func (h *Checker) readmittedLocked(id string, s *replicaHealth) {
	if !s.uptime.Known() {
		h.restartedLocked(id, s, "ejected and re-admitted, and its metrics cannot tell a restart")
	}
}

func (h *Checker) restartedLocked(id string, s *replicaHealth, why string) {
	s.restarts++
	h.log.Info("replica restarted: its cache is taken for empty", "replica", id, "evidence", why)
}
