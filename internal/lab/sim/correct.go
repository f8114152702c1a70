package sim

import "github.com/kvmesh/kvmesh/summary"

// The engine feedback loop: as the proxy does when a response ends
// (proxy/relay.go learn), the router that recorded a request compares
// the engine's cached blocks with its summary's prediction and corrects
// the summary, then records the request again (the engine recomputed
// what it missed, so it holds all of it now).

// recorder is the summary that records router k's dispatches to replica
// j: the owner's under the mesh, the router's own without gossip; nil for
// policies without summaries.
func (w *world) recorder(k, j int) *summary.Summary {
	switch w.policy {
	case PolicySingle:
		return w.routers[0].copies[j]
	case PolicyIsolated:
		return w.routers[k].copies[j]
	case PolicyMesh, PolicyPartitioned:
		return w.routers[w.owner(j)].copies[j]
	}
	return nil
}

// learn corrects the recording summary of job i, done at replica j.
func (w *world) learn(j int, i int32) {
	jb := &w.jobs[i]
	if w.p.cfg.Correction == CorrectionNone || jb.hit >= jb.pred {
		return
	}
	s := w.recorder(int(jb.router), j)
	if s == nil {
		return
	}
	hashes := w.p.reqs[i].req.Hashes
	miss := hashes[jb.hit:min(int(jb.pred), len(hashes))]
	switch w.p.cfg.Correction {
	case CorrectionForget:
		s.Forget(miss)
	case CorrectionCut:
		c := s.Correct(miss)
		w.cuts[c.Cut]++
	}
	w.corrections++
	s.Add(hashes)
}
