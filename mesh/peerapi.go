package mesh

import "slices"

// PeerAPIs lists the API base URLs of the other routers alive in the
// mesh, sorted. The proxy asks them what only the router that served a
// request knows (the replica of a stored response).
func (m *Mesh) PeerAPIs() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []string
	for name, mb := range m.members {
		if name != m.cfg.Name && mb.alive && mb.meta.API != "" {
			out = append(out, mb.meta.API)
		}
	}
	slices.Sort(out)
	return out
}
