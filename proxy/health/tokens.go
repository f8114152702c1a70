package health

// DefaultBytesPerToken is the bytes of canonical text per engine token
// assumed until Config.BytesPerToken knows better: the English average.
const DefaultBytesPerToken = 4.0

// ratioBand is how far (a fraction) a replica's learned bytes per token
// may move from the ratio its reported capacity is in before the capacity
// follows. A capacity the mesh is told starts the replica's summary anew
// (another size, another epoch), so it follows a ratio that changed, as
// the first learned one does from the default, and not the average's
// drift from one answer to the next.
const ratioBand = 0.2

// ratioLocked updates the ratio s's capacity is in; h.mu is held.
func (h *Checker) ratioLocked(id string, s *replicaHealth) {
	r := h.cfg.BytesPerToken(id)
	if r <= 0 {
		r = DefaultBytesPerToken
	}
	if old := s.bytesPerToken; old <= 0 || r > old*(1+ratioBand) || r < old*(1-ratioBand) {
		s.bytesPerToken = r
	}
}
