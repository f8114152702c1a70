package mesh

import "time"

// PeerAPIs lists the API base URLs of the other routers alive in the
// mesh, sorted. The proxy asks them what only the router that served a
// request knows (the replica of a stored response).
func (m *Mesh) PeerAPIs() []string { return m.mem.peerAPIs() }

// LoadHeard reports when this router last heard the load (in flight,
// pending prefill) of a replica another router owns, as Candidates gives
// it: requests this router sent there since are not in it yet. ok is
// false for a replica this router owns, or knows no state of.
func (m *Mesh) LoadHeard(id string) (at time.Time, ok bool) {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	r := m.tab.replicas[id]
	if r == nil || r.owned || !r.hasState {
		return time.Time{}, false
	}
	_, _, at = r.remoteLoad()
	return at, true
}
