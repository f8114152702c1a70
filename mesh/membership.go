package mesh

// Membership: the memberlist adapter's configuration and lifecycle
// (joining, re-joining failed peers), which routers declare which
// replicas, and who owns each replica (see owner.go for the pure rule).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/route"
)

func (m *Mesh) memberlistConfig() (*memberlist.Config, error) {
	cfg, t := m.cfg, m.cfg.Timing
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.Logger = cfg.Logger.Named("memberlist").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	mc.GossipInterval, mc.PushPullInterval = t.GossipInterval, t.PushPullInterval
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult, mc.TCPTimeout = t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult, t.TCPTimeout
	mc.GossipToTheDeadTime = 30 * t.ProbeInterval
	mc.DeadNodeReclaimTime = 30 * t.ProbeInterval // a restarted router may come back on another address
	mc.UDPBufferSize = udpBufferSize
	// The mesh's payloads are Rice-coded deltas and Bloom bits, which LZW
	// does not shrink; compressing every stream cost more CPU than the
	// batches themselves.
	mc.EnableCompression = false
	// The wire version (wire.go's wireVersion): the maximum says what
	// this router decodes; the minimum and current stay wireBase, which
	// every router speaks, or memberlist would refuse the routers from
	// before versioning, which advertise 0, 0, 0.
	mc.DelegateProtocolMin, mc.DelegateProtocolVersion, mc.DelegateProtocolMax = uint8(wireBase), uint8(wireBase), uint8(m.wire)
	if cfg.SecretKey != nil {
		mc.SecretKey = append([]byte(nil), cfg.SecretKey...)
	}
	if cfg.BindAddr != "" {
		host, port, err := splitHostPort(cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("mesh: bind address %q: %w", cfg.BindAddr, err)
		}
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, port, port
	}
	if cfg.AdvertiseAddr != "" {
		host, port, err := splitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			return nil, fmt.Errorf("mesh: advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	if err := m.guardTransport(mc); err != nil { // transport.go
		return nil, err
	}
	m.withDeadlines(mc) // deadline.go
	return mc, nil
}

func splitHostPort(s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// joinLoop joins the seeds with backoff until one answers, then, every
// ReconnectInterval, re-joins failed peers (for FailedPeerTimeout) and
// every seed not all in the mesh (for ever, re-resolving DNS names):
// memberlist never re-joins a dead node by itself, so this is what heals a
// partition, whatever its length. Between reconnects it expires the
// declarations peers stopped asserting.
func (m *Mesh) joinLoop() {
	defer m.wg.Done()
	if len(m.cfg.Join) > 0 {
		backoff := m.cfg.Timing.ProbeInterval
		for {
			n, err := m.ml.Join(m.cfg.Join)
			if err == nil && n > 0 {
				m.log.Info("joined mesh", "seeds", m.cfg.Join, "contacted", n)
				break
			}
			m.log.Warn("join failed; retrying", "seeds", m.cfg.Join, "error", err, "in", backoff)
			if !m.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
	t := m.cfg.Timing
	period := min(t.ReconnectInterval, max(t.DeclarationTTL/4, t.StateInterval))
	lastReconnect := time.Now()
	for m.sleep(period) {
		now := time.Now()
		m.mu.Lock()
		m.expireDeclarationsLocked(now)
		m.unlockAndRun()
		if now.Sub(lastReconnect) < t.ReconnectInterval {
			continue
		}
		lastReconnect = now
		m.reconnect(now)
	}
}

// reconnect re-joins up to three failed peers (remembered for
// FailedPeerTimeout) and every seed that is missing; when a peer is
// missing but no seed is, one seed as well.
func (m *Mesh) reconnect(now time.Time) {
	var addrs []string
	alive := map[string]bool{m.ml.LocalNode().Address(): true}
	m.mu.Lock()
	for name, mb := range m.members {
		if mb.alive {
			alive[mb.node.Address()] = true
			continue
		}
		if now.Sub(mb.failedAt) > m.cfg.Timing.FailedPeerTimeout {
			delete(m.members, name)
			m.dirty = true
			continue
		}
		addrs = append(addrs, mb.node.Address())
	}
	m.unlockAndRun()
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	addrs = addrs[:min(len(addrs), 3)]
	ctx, cancel := context.WithTimeout(m.ctx, min(m.cfg.Timing.TCPTimeout, 5*time.Second))
	seeds := missingSeeds(m.cfg.Join, int(m.ml.LocalNode().Port), func(host string) ([]string, error) {
		return net.DefaultResolver.LookupHost(ctx, host)
	}, alive)
	cancel()
	if len(addrs) > 0 && len(seeds) == 0 && len(m.cfg.Join) > 0 {
		// A known peer is missing though every seed is here: ask one seed,
		// which may know where it went (one push/pull per round, not one
		// per seed: each carries full summaries).
		seeds = []string{m.cfg.Join[rand.IntN(len(m.cfg.Join))]}
	}
	addrs = append(addrs, seeds...)
	if len(addrs) == 0 {
		return
	}
	if n, err := m.ml.Join(addrs); n > 0 {
		m.log.Debug("reconnected", "addrs", addrs, "contacted", n)
	} else {
		m.log.Debug("reconnect failed", "addrs", addrs, "error", err)
	}
}

func (m *Mesh) replicaLocked(id string, create bool) *replica {
	r := m.replicas[id]
	if r == nil && create && len(m.replicas) < maxReplicas && id != "" && len(id) <= maxReplicaIDLen {
		// The ID's one copy in the process (unique), as long as a
		// replica holds its handle: the routers of one process (the
		// scale harness, tests) then hand out the same string for a
		// replica, and a CandidateBuffer going from one router's view to
		// another's finds its Details' IDs already right (a string
		// written to the heap is a pointer for the write barrier while
		// the collector marks).
		h := unique.Make(id)
		id = h.Value()
		r = &replica{id: id, idh: h, hash: route.HashID(id), declarers: map[string]bool{}, declHeard: map[string]time.Time{},
			load: m.newLoadLocked()}
		m.replicas[id] = r
		i, _ := slices.BinarySearchFunc(m.order, id, func(x *replica, id string) int { return strings.Compare(x.id, id) })
		m.order = slices.Insert(m.order, i, r)
		m.markOwnerLocked(r)
	}
	return r
}

// newLoadLocked returns a replica's in-flight counters, taken from slabs
// of loadSlab: a decision reads the counters of every owned replica, and
// sixteen bytes each side by side are a few hundred cache lines read in
// order, where counters allocated one by one among the summaries' data
// were a cache miss per replica. A slab lives while any of its replicas
// does.
func (m *Mesh) newLoadLocked() *replicaLoad {
	if len(m.loads) == cap(m.loads) {
		m.loads = make([]replicaLoad, 0, loadSlab)
	}
	m.loads = m.loads[:len(m.loads)+1]
	return &m.loads[len(m.loads)-1]
}

// loadSlab is how many replicas' counters newLoadLocked allocates at once.
const loadSlab = 256

// liveLocked reports whether a router counts as alive.
func (m *Mesh) liveLocked(name string) bool {
	if name == m.cfg.Name {
		return true
	}
	mb := m.members[name]
	return mb != nil && mb.alive
}

// ownerLocked returns the owner of r: rendezvous hashing over the live
// routers that declare it (ownerOf); "" when none is alive. Owners are
// computed when membership or declarations change, not per request: a
// writer that changes them sets m.dirty, and unlockAndRun recomputes
// before it releases the lock, so readers under the read lock always find
// them current.
func (m *Mesh) ownerLocked(r *replica) string {
	switch { // only ever true under the write lock
	case m.dirty:
		m.recomputeOwnersLocked()
	case r.ownerDirty:
		m.recomputeOwnerLocked(r)
	}
	return r.owner
}

// markOwnerLocked notes that r's declarers changed.
func (m *Mesh) markOwnerLocked(r *replica) {
	if !r.ownerDirty {
		r.ownerDirty = true
		m.dirtyReps = append(m.dirtyReps, r)
	}
}

func (m *Mesh) recomputeOwnerLocked(r *replica) {
	r.owner = ownerOf(r.id, r.declarers, m.liveLocked)
	r.ownerMb = m.members[r.owner]
	r.ownerDirty = false
	m.touchLocked(r)
}

// recomputeOwnersLocked brings every owner up to date (membership
// changed), or, when only declarations changed, those replicas'.
func (m *Mesh) recomputeOwnersLocked() {
	if m.dirty {
		for _, r := range m.order {
			m.recomputeOwnerLocked(r)
		}
	} else {
		for _, r := range m.dirtyReps {
			if r.ownerDirty {
				m.recomputeOwnerLocked(r)
			}
		}
	}
	m.dirty, m.dirtyReps = false, m.dirtyReps[:0]
}

// declareLocked records that a state's origin declares the replica it
// names, for DeclarationTTL from now (softstate.go). It is the only way a
// peer's declaration is learned or renewed: the DeclaredBy list a state
// carries is another router's hearsay, and adopting it let a declaration
// outlive its router (two routers re-teach each other a claim its router
// no longer makes; a restarted router took its own old claim back).
func (m *Mesh) declareLocked(st *stateMsg) *replica {
	if st.Origin == m.cfg.Name {
		return nil
	}
	r := m.replicaLocked(st.Replica, true)
	if r == nil {
		return nil
	}
	delete(r.withdrawn, st.Origin) // its own word, again
	if !r.declarers[st.Origin] && len(r.declarers) >= maxDeclarers {
		return r
	}
	m.addDeclarerLocked(r, st.Origin)
	r.declHeard[st.Origin] = time.Now()
	m.handBackLocked(r, st)
	return r
}

func (m *Mesh) addDeclarerLocked(r *replica, name string) {
	if !r.declarers[name] {
		r.declarers[name] = true
		m.markOwnerLocked(r)
	}
}
