package summary

import "errors"

// Since and Apply replay the log entry by entry, in order, as raw 64-bit
// entries: the simulator's exact model of dissemination uses them (it
// counts messages, not bytes). Routers use the coded deltas of delta.go.

// ErrDiverged names a copy that diverged from its owner, for callers that
// check Apply's errors alongside ErrGap. Apply itself does not return it:
// a divergence versions cannot show is a digest mismatch, which the mesh
// detects and repairs with a full copy.
var ErrDiverged = errors.New("summary: copy diverged from its owner")

// Since returns the log entries applied after version v, in order, if the
// summary still remembers them; ok is false when v is too old (send a full
// copy) or in the future. The entries are opaque: pass them to Apply.
func (s *Summary) Since(v uint64) (entries []uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if v < s.logStart || v > s.version {
		return nil, false
	}
	return append([]uint64(nil), s.log[v-s.logStart:]...), true
}

// Apply replays log entries from Since on a copy: those that took the
// owner's summary of this epoch from version from to from+len(entries).
// Entries the copy already has are skipped; entries beyond the copy's
// version return ErrGap.
func (s *Summary) Apply(epoch, from uint64, entries []uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.storeHeld()
	if epoch != s.epoch || from > s.version {
		return ErrGap
	}
	skip := s.version - from
	if skip >= uint64(len(entries)) {
		return nil
	}
	u := s.geo.universe()
	for _, e := range entries[skip:] {
		if e&opMask != opRotate && e&^opMask >= u {
			return ErrBadDelta
		}
	}
	for _, e := range entries[skip:] {
		switch key := e &^ opMask; e & opMask {
		case opAdd:
			s.applyAdd(key)
			s.curCount++
		case opForget:
			if len(s.neg) < maxNegOf(s.geo) {
				s.applyForget(key)
			}
		case opRotate:
			s.rotate()
		default:
			return ErrBadDelta
		}
		s.version++
		s.record(e)
	}
	return nil
}
