package mesh

import (
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

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

// LoadHeard reports when this router last heard the load (in flight,
// pending prefill) of a replica another router owns, as Candidates gives
// it: requests this router sent there since are not in it yet. ok is
// false for a replica this router owns, or knows no state of.
func (m *Mesh) LoadHeard(id string) (at time.Time, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r := m.replicas[id]
	if r == nil || r.owned || !r.hasState {
		return time.Time{}, false
	}
	return r.loadAt, true
}

// HearLoad applies the load of replica id (c's InFlight,
// PendingPrefillBlocks, Running, Waiting and Slots) that its owner
// reported on a hop's dispatch 103 (proxy.HeaderLoad), as the owner
// counted it at time at: fresher than the owner's last gossiped state
// when at is later than that state came. It is ignored for a replica
// this router owns or has no state of, or when a state came since at.
func (m *Mesh) HearLoad(id string, c route.Candidate, at time.Time) {
	m.mu.Lock()
	defer m.unlockAndRun()
	r := m.replicas[id]
	if r == nil || r.owned || !r.hasState || r.owner == "" || r.owner != r.st.Origin || !at.After(r.loadAt) {
		return
	}
	if !r.hopLoaded {
		r.gossiped, r.hopLoaded = r.st.load(), true
	}
	clamp := func(v int) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }
	r.st.InFlight, r.st.Pending = clamp(c.InFlight), max(c.PendingPrefillBlocks, 0)
	r.st.Running, r.st.Waiting, r.st.Slots = clamp(c.Running), clamp(c.Waiting), clamp(c.Slots)
	r.loadAt = at
	m.touchLocked(r)
}

// stateLoad is the load part of a state.
type stateLoad struct {
	inFlight, running, waiting, slots uint32
	pending                           float64
}

func (s *stateMsg) load() stateLoad {
	return stateLoad{s.InFlight, s.Running, s.Waiting, s.Slots, s.Pending}
}

func (s *stateMsg) setLoad(l stateLoad) {
	s.InFlight, s.Running, s.Waiting, s.Slots, s.Pending = l.inFlight, l.running, l.waiting, l.slots, l.pending
}
