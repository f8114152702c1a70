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
