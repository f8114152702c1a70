package mesh

// Owner side of dissemination: what an owner sends about the replicas it
// owns, and the transport of direct messages.

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

// enqueue validates a broadcast's size and queues it: memberlist would
// keep an oversize one queued forever and never send it.
func (m *Mesh) enqueue(b memberlist.Broadcast) bool {
	msg := b.Message()
	if len(msg) > m.maxMsg {
		m.met.dropped.WithLabelValues(dropOversize).Inc()
		m.log.Warn("broadcast too large for one packet; dropped", "kind", kindName(msg[0]), "bytes", len(msg), "limit", m.maxMsg)
		return false
	}
	m.queue.QueueBroadcast(b)
	return true
}

// namedBroadcast replaces a queued broadcast of the same name (a newer
// state of the same replica from the same origin).
type namedBroadcast struct {
	name string
	msg  []byte
}

func (b *namedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(*namedBroadcast)
	return ok && nb.name == b.name
}

func (b *namedBroadcast) Name() string { return b.name }

func (b *namedBroadcast) Message() []byte { return b.msg }

func (b *namedBroadcast) Finished() {}

// uniqueBroadcast never replaces another (a summary delta).
type uniqueBroadcast struct{ msg []byte }

func (b *uniqueBroadcast) Invalidates(memberlist.Broadcast) bool { return false }

func (b *uniqueBroadcast) UniqueBroadcast() {}

func (b *uniqueBroadcast) Message() []byte { return b.msg }

func (b *uniqueBroadcast) Finished() {}

func stateName(origin, replica string) string { return "s/" + origin + "\x00" + replica }

// send queues a direct message (full request or reply) for repairLoop.
func (m *Mesh) send(to string, msg []byte) {
	select {
	case m.repairs <- job{to: to, msg: msg}:
	default:
		m.met.dropped.WithLabelValues(dropHandoffFull).Inc()
	}
}

func (m *Mesh) repairLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case j := <-m.repairs:
			m.mu.RLock()
			mb, ok := m.members[j.to]
			var node memberlist.Node
			if ok {
				node, ok = mb.node, mb.alive
			}
			m.mu.RUnlock()
			if !ok {
				continue
			}
			if len(j.msg) > maxFullBytes {
				m.met.dropped.WithLabelValues(dropOversize).Inc()
				m.log.Warn("direct message over memberlist's 20 MiB limit; dropped", "to", j.to, "bytes", len(j.msg))
				continue
			}
			if err := m.ml.SendReliable(&node, j.msg); err != nil {
				m.log.Debug("direct send failed", "to", j.to, "kind", kindName(j.msg[0]), "error", err)
				continue
			}
			m.met.out(j.msg[0], len(j.msg))
		}
	}
}

// relay reports whether a new message should be re-broadcast. memberlist
// does not re-gossip user messages, so in a mesh larger than one gossip
// tick's fanout receivers must; in a smaller one every tick of the
// originator already reaches every peer, and a relay would only multiply
// the bytes (measured in `kvmesh demo`: 147 KB/s per router relaying,
// 56-84 KB/s not, at the same hit ratio; push/pull repairs a lost packet).
func (m *Mesh) relay() bool {
	return int(m.numAlive.Load())-1 > m.fanout
}

// setOwnedLocked flips r between writer and copy.
func (m *Mesh) setOwnedLocked(r *replica, owned bool) {
	if r.owned == owned {
		return
	}
	r.owned = owned
	if !owned {
		m.log.Info("replica owned elsewhere now; keeping a copy", "replica", r.id)
		r.hasState = false
		return
	}
	r.pend, r.mismatchSince, r.wantFull = nil, time.Time{}, false
	if r.sum != nil {
		// The copy is bit-identical to the old owner's: continue its epoch.
		r.lastSent = r.sum.Version()
		m.log.Info("taking over replica with its gossiped summary", "replica", r.id, "epoch", r.sum.Epoch(), "version", r.lastSent)
	}
}

// ensureSummaryLocked gives an owned replica a summary of the right size.
func (m *Mesh) ensureSummaryLocked(r *replica) {
	want := m.cfg.DefaultCapacityBlocks
	if r.capacity > 0 {
		want = min(max(r.capacity, 2), summary.MaxCapacityBlocks)
	}
	if r.sum != nil && (r.sum.Params().CapacityBlocks == want || r.capacity == 0) {
		return
	}
	epoch := uint64(time.Now().UnixNano()) ^ xxh3.HashString(m.cfg.Name)
	s, err := summary.New(summary.Params{CapacityBlocks: want, FalsePositiveRate: m.cfg.FalsePositiveRate}, epoch)
	if err != nil {
		m.log.Error("cannot size summary", "replica", r.id, "capacity", want, "error", err)
		return
	}
	if r.sum != nil {
		m.log.Info("replica capacity changed; new summary epoch", "replica", r.id, "from", r.sum.Params().CapacityBlocks, "to", want)
	}
	r.sum, r.lastSent, r.digestVer, r.digest = s, 0, 0, 0
}

// ownedStateLocked is the state of a replica this router owns (or, when
// not owned, a declaration).
func (m *Mesh) ownedStateLocked(r *replica) stateMsg {
	st := stateMsg{header: m.nextHeader(), Replica: r.id, Owned: r.owned, Healthy: r.healthy,
		Capacity: uint32(max(r.capacity, 0)), Models: r.models}
	for d := range r.declarers {
		st.DeclaredBy = append(st.DeclaredBy, d)
	}
	slices.Sort(st.DeclaredBy)
	if r.owned && r.sum != nil {
		st.Epoch, st.Version = r.sum.Epoch(), r.lastSent
		st.InFlight = uint32(max(r.inFlight.Load(), 0))
		st.Pending = float64(max(r.pendingK.Load(), 0)) / 1000
		if r.digestVer == r.lastSent+1 {
			st.Digest = r.digest
		}
	}
	return st
}

// encodeStateLocked encodes a state, dropping models that do not fit one
// packet (a replica with hundreds of models is not routed for all).
func (m *Mesh) encodeStateLocked(st *stateMsg) []byte {
	b := st.append(nil)
	for len(b) > m.maxMsg && len(st.DeclaredBy) > 1 {
		st.DeclaredBy = st.DeclaredBy[:len(st.DeclaredBy)-1]
		b = st.append(b[:0])
	}
	for len(b) > m.maxMsg && len(st.Models) > 0 {
		st.Models = st.Models[:len(st.Models)-1]
		b = st.append(b[:0])
		if len(b) <= m.maxMsg {
			m.log.Warn("replica state over one packet; models left out", "replica", st.Replica, "kept", len(st.Models))
		}
	}
	return b
}

func (m *Mesh) tickLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Timing.StateInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.tick(time.Now())
		}
	}
}

// tick re-decides ownership, gossips the owned replicas' deltas and
// states, checks copies, and bounds the queue.
func (m *Mesh) tick(now time.Time) {
	m.mu.Lock()
	m.ticks++
	decl := m.ticks%declEveryTicks == 1
	for _, r := range m.replicas {
		owner := m.ownerLocked(r)
		m.setOwnedLocked(r, owner == m.cfg.Name)
		if r.owned {
			m.ensureSummaryLocked(r)
			m.gossipOwnedLocked(r)
			continue
		}
		if r.declared && decl {
			st := m.ownedStateLocked(r)
			m.enqueue(&namedBroadcast{name: stateName(m.cfg.Name, r.id), msg: m.encodeStateLocked(&st)})
		}
		if r.hasState && owner == r.st.Origin {
			age := now.Sub(r.heard)
			m.met.age.WithLabelValues(r.id).Set(age.Seconds())
			if r.wantFull || (!r.mismatchSince.IsZero() && now.Sub(r.mismatchSince) > 4*m.cfg.Timing.StateInterval) {
				m.requestFullLocked(r, owner, now, "copy stays behind the owner's state")
			}
		}
	}
	m.unlockAndRun()
	if n := m.queue.NumQueued(); n > maxQueued {
		m.met.dropped.WithLabelValues(dropQueuePrune).Add(float64(n - maxQueued))
		m.queue.Prune(maxQueued) // n > 0, so the queue has been used
	}
}

// gossipOwnedLocked queues the summary's new inserts, split to fit one
// packet each, then the replica's state.
func (m *Mesh) gossipOwnedLocked(r *replica) {
	if r.sum == nil {
		return
	}
	if hashes, ok := r.sum.Since(r.lastSent); ok && len(hashes) > 0 {
		per := max((m.maxMsg-deltaOverhead(m.cfg.Name, r.id))/8, 1)
		epoch := r.sum.Epoch()
		for from := 0; from < len(hashes); from += per {
			d := deltaMsg{header: m.nextHeader(), Replica: r.id, Epoch: epoch, From: r.lastSent + uint64(from),
				Hashes: hashes[from:min(from+per, len(hashes))]}
			m.enqueue(&uniqueBroadcast{msg: d.append(nil)})
		}
		r.lastSent += uint64(len(hashes))
	} else if !ok {
		// Too many inserts for the log since the last tick: copies see the
		// state's version ahead of them and ask for a full copy.
		r.lastSent = r.sum.Version()
	}
	if r.digestVer != r.lastSent+1 && r.sum.Version() == r.lastSent {
		m.post.digests = append(m.post.digests, ownerDigestJob{r: r, sum: r.sum, version: r.lastSent})
	}
	st := m.ownedStateLocked(r)
	m.enqueue(&namedBroadcast{name: stateName(m.cfg.Name, r.id), msg: m.encodeStateLocked(&st)})
}

func (m *Mesh) handleFullReqLocked(f fullReq) {
	r := m.replicas[f.Replica]
	if r == nil || !r.owned || r.sum == nil {
		return
	}
	m.post.replies = append(m.post.replies, fullReplyJob{to: f.Origin, st: m.ownedStateLocked(r), sum: r.sum})
}
