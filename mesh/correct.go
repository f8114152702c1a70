package mesh

import "github.com/kvmesh/kvmesh/summary"

// correct applies the owner's correction for a miss to an owned replica's
// summary: summary.Correct forgets the blocks the engine did not have and,
// when the miss shows the summary remembers further back than the engine
// holds, cuts generations and lowers the rotation threshold. Cuts are
// rotation entries in the summary's log, so they reach every copy in the
// next delta, in order, and copies stay bit-identical.
func (m *Mesh) correct(s *summary.Summary, hashes []uint64) {
	c := s.Correct(hashes)
	if c.Cut != summary.CutNone {
		m.met.cuts.WithLabelValues(c.Cut.String()).Inc()
	}
}

// restartedLocked cuts both generations of an owned replica's summary: its
// engine restarted, and holds none of what the summary remembers. Every
// follow-up would otherwise be sent to a cache that lost it, and each
// would correct only its own prefix. The cut is two rotation entries in
// the summary's log, so the copies drop the same in the next delta, in
// the same epoch. m.tab.mu is held.
func (m *Mesh) restartedLocked(r *replica) {
	if r.sum == nil {
		return
	}
	r.sum.Cut(summary.CutBoth)
	m.met.cuts.WithLabelValues(summary.CutBoth.String()).Inc()
	m.log.Info("replica's engine restarted: its summary is cut", "replica", r.id, "epoch", r.sum.Epoch(), "version", r.sum.Version())
}

// Evicted forgets text blocks an owned replica's engine evicted, as its
// KV events tell (internal/kvtrack relates them): exact, so no cut
// (summary.Correct would cut on a usage miss). It reports false when the
// summary's negative record refused some or is three quarters full: the
// caller then rebases, before evicted blocks stay claimed until their
// generation ages out. Elsewhere it is a no-op and reports true.
func (m *Mesh) Evicted(replicaID string, hashes []uint64) bool {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	r := m.tab.replicas[replicaID]
	if r == nil || !r.owned || r.sum == nil {
		return true
	}
	r.sum.Forget(hashes)
	st := r.sum.Stats()
	return 4*st.Forgotten < 3*st.ForgetLimit
}

// Rebase makes an owned replica's summary claim exactly held (what its
// engine's events say it holds): both generations are cut (two rotation
// entries, which also empty the negative record) and held added. Under
// the table's write lock, so the owner's tick cuts no delta in between and
// copies go from the old content to the new in one step; a decision here
// may see the summary empty for the time of the adds.
func (m *Mesh) Rebase(replicaID string, held []uint64) {
	m.tab.mu.Lock()
	defer m.tab.unlock()
	r := m.tab.replicas[replicaID]
	if r == nil || !r.owned || r.sum == nil {
		return
	}
	r.sum.Cut(summary.CutBoth)
	r.sum.Add(held)
	m.met.cuts.WithLabelValues("rebase").Inc()
}
