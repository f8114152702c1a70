package summary

// Evict forgets blocks the engine itself reported evicted (its KV-cache
// events, related to text blocks by the owner): as Forget, and unlike
// Correct it cuts nothing, since an eviction says nothing of the
// summary's other claims. It reports false when the negative record
// refused some of them or is three quarters full: the owner should
// Rebase on what it knows is held, before forgets are refused and
// evicted blocks stay claimed until their generation ages out.
func (s *Summary) Evict(hashes []uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, refused := s.forgetLocked(hashes)
	return refused == 0 && 4*len(s.neg) < 3*maxNegOf(s.geo)
}

// Rebase makes the summary claim exactly held: both generations are cut
// (two rotation entries, which also empty the negative record) and held
// is added, in one write section, so a reader never sees the summary
// empty in between, and in the log, so copies do the same at the same
// versions. Held blocks beyond a generation rotate as adds always do.
func (s *Summary) Rebase(held []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cutLocked(CutBoth)
	s.addLocked(held)
}
