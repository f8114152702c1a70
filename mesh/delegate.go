package mesh

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/summary"
)

// delegate adapts memberlist's callbacks to the mesh: events and alive
// messages to membership, messages and push/pull state to replication.
// memberlist calls the event and alive delegates while it holds its node
// lock, so none of these methods may call back into memberlist; they take
// only the mesh's locks.
type delegate struct {
	mem *membership
	rep *replication
}

var (
	_ memberlist.Delegate      = (*delegate)(nil)
	_ memberlist.EventDelegate = (*delegate)(nil)
	_ memberlist.AliveDelegate = (*delegate)(nil)
	_ memberlist.MergeDelegate = (*delegate)(nil)
	_ memberlist.PingDelegate  = (*delegate)(nil)
)

// NodeMeta returns the router's metadata, checked against the limit in New.
func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.mem.meta) > limit {
		return nil // New refuses this; never panic memberlist
	}
	return d.mem.meta
}

// NotifyMsg hands a copy of the message to the inbox goroutine. The mesh
// sends its messages over streams, so a full inbox holds up the sender's
// stream (back-pressure) for up to a second before the message is dropped
// and counted; the copy then sees the gap and asks for a full copy.
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) == 0 {
		return
	}
	msg := bytes.Clone(b)
	c := d.rep
	select {
	case c.inbox <- msg:
		return
	default:
	}
	if b[0] == kindLoad {
		// A load beacon comes in a UDP packet, handed over by
		// memberlist's packet handler, which also handles the alive,
		// suspect and dead messages: it is dropped rather than hold that
		// up. The next beacon or state makes up for it.
		c.met.dropped.WithLabelValues(dropHandoffFull).Inc()
		return
	}
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case c.inbox <- msg:
	case <-t.C:
		c.met.dropped.WithLabelValues(dropHandoffFull).Inc()
	case <-c.ctx.Done():
	}
}

// GetBroadcasts adds nothing to memberlist's gossip packets: the mesh
// sends over its own per-peer streams (peers.go).
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState is the router's push/pull state: a state for every replica
// it declares or owns, with the full summary of those it owns while they
// fit under maxLocalStateBytes (receivers pull the rest).
func (d *delegate) LocalState(join bool) []byte {
	m, t := d.rep, d.rep.tab
	// Snapshot under the read lock; encode the summaries after it.
	type entry struct {
		st  stateMsg
		sum *summary.Summary
	}
	var entries []entry
	live := d.mem.liveWires()
	t.mu.RLock()
	for _, r := range t.replicas {
		if !r.declared && !r.owned {
			continue
		}
		e := entry{st: d.rep.dis.ownedStateLocked(r)}
		if r.owned {
			e.sum = r.sum
		}
		entries = append(entries, e)
	}
	t.mu.RUnlock()
	v := pushPullWire(m.wire, join, live)
	b := []byte{kindPushPull}
	b = appendS8(b, m.cfg.Name)
	b = binary.BigEndian.AppendUint64(b, m.boot)
	b = binary.BigEndian.AppendUint32(b, uint32(len(entries)))
	for _, e := range entries {
		var sum []byte
		if e.sum != nil {
			sum = e.sum.AppendEncode(nil, m.fp)
			if len(b)+len(sum) > maxLocalStateBytes {
				m.met.dropped.WithLabelValues(dropStateFull).Inc()
				sum = nil
			}
		}
		st := e.st.at(v)
		b = appendStateWithSummary(b, &st, sum)
	}
	m.met.out(kindPushPull, len(b))
	return b
}

// MergeRemoteState applies a peer's push/pull state; it validates
// everything and only logs and counts what it cannot decode.
func (d *delegate) MergeRemoteState(buf []byte, join bool) { d.rep.mergeRemoteState(buf, join) }

// mergeRemoteState applies a peer's push/pull state.
func (c *replication) mergeRemoteState(buf []byte, join bool) {
	p, err := decodePushPull(buf, c.wire)
	if err != nil {
		c.met.dropped.WithLabelValues(dropDecode).Inc()
		c.log.Warn("undecodable push/pull state", "bytes", len(buf), "error", err)
		return
	}
	c.met.in(kindPushPull, len(buf))
	// Full summaries are decoded before the lock.
	sums := make([]*summary.Summary, len(p.Entries))
	for i := range p.Entries {
		if e := &p.Entries[i]; e.State.Origin == p.Origin {
			sums[i] = c.decodeSummary(e)
		}
	}
	checks := c.compareFulls(len(sums), func(i int) string { return p.Entries[i].State.Replica },
		func(i int) *summary.Summary { return sums[i] })
	now := time.Now()
	c.tab.mu.Lock()
	defer c.tab.unlock()
	// Declarations first, so ownership is known before the full copies;
	// the states last, so they find the copies they describe.
	var valid []int
	for i := range p.Entries {
		if e := &p.Entries[i]; e.State.Origin == p.Origin {
			valid = append(valid, i)
			c.tab.declareLocked(&e.State)
		} else {
			c.met.dropped.WithLabelValues(dropRefused).Inc()
		}
	}
	c.tab.reassertedLocked(&p)
	for _, i := range valid {
		c.handleFullLocked(&p.Entries[i].State, sums[i], checks[i], now)
	}
	for _, i := range valid {
		st := &p.Entries[i].State
		if join {
			c.keepEngineLocked(st)
		}
		c.keepRoleLocked(st)
		c.handleStateLocked(st, now)
	}
}

// keepEngineLocked carries over to a state from a join's push/pull what
// of the engine's load the copy's last state from the same owner knew
// and the state cannot say. Those are encoded at wireBase
// (pushPullWire), which has neither flagNoLoad nor the engine section:
// their silence says nothing (of the LoRA adapters, gossiped in the
// section, too). Taken as "the engine publishes load" it
// turned a no-load replica's zero counts into known ones at every router
// a seed re-join reached (routers re-join their seeds after a failure),
// and taken as "unknown" it would drop the section's other fields, until
// the owner's next full state. A state that does not come from a join is
// encoded at a version the sender chose for its peers and is taken as it
// says.
func (c *replication) keepEngineLocked(st *stateMsg) {
	if st.EngineWire || !st.Owned || st.Slim || st.Withdrawn {
		return
	}
	r := c.tab.replicas[st.Replica]
	if r == nil || !r.hasState || r.st.Origin != st.Origin {
		return
	}
	noLoad := !st.Engine.HasLoad || !r.st.Engine.HasLoad
	st.Engine = legacyLoad(st.Engine, r.st.Engine)
	st.LoRA = r.st.LoRA
	if noLoad {
		st.Engine.HasLoad = false
	}
}

// keepRoleLocked carries over to an owner's full state from a push/pull
// the role its owner's last state gave the replica, when the state has
// none. A push/pull is encoded at the least version of the live routers
// (pushPullWire, wireBase in a join), below wireRole whenever one of
// them is older, and so says nothing of roles: taken as "a whole
// replica" it would offer a prefill-only replica whole requests until
// the owner's next full state. A batch is encoded at the receiver's own
// version and says: a replica whose owner makes it whole again is
// whole from the next batch.
func (c *replication) keepRoleLocked(st *stateMsg) {
	if !st.Owned || st.Slim || st.Withdrawn || st.hasRole() {
		return
	}
	r := c.tab.replicas[st.Replica]
	if r == nil || !r.hasState || r.st.Origin != st.Origin {
		return
	}
	st.Role, st.Bootstrap = r.st.Role, r.st.Bootstrap
}

// checkPeer refuses a peer whose metadata is not ours to understand or
// whose hashing contract differs.
func (b *membership) checkPeer(n *memberlist.Node) error {
	meta, err := decodeMeta(n.Meta)
	if err == nil && meta.Contract == b.contractID {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("peer %s uses hashing contract %q, this router uses %q", n.Name, meta.Contract, b.contractID)
	} else {
		err = fmt.Errorf("peer %s: %w", n.Name, err)
	}
	b.met.refusals.Inc()
	b.mu.Lock()
	last := b.refused[n.Name]
	logIt := time.Since(last) > time.Minute
	if logIt {
		b.refused[n.Name] = time.Now()
	}
	b.mu.Unlock()
	if logIt {
		b.log.Error("refusing peer with another hashing contract", "peer", n.Name, "peer_contract", meta.Contract,
			"our_contract", b.contractID, "error", err)
	}
	return err
}

// NotifyAlive filters every alive message (memberlist holds its lock),
// and takes a known router's wire version from it.
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	if n.Name == d.mem.cfg.Name {
		return nil
	}
	if err := d.mem.checkPeer(n); err != nil {
		return err
	}
	d.mem.heardWire(n)
	return nil
}

// heardWire records the wire version an alive message of a known router
// advertises. memberlist tells the event delegate of a router that came
// back only when it was gone or its metadata changed, not when it
// restarted, with another build, before its failure was detected: the
// version would stay the old build's. Alive messages carry the new one
// (the restarted router refutes its old incarnation with one), and every
// push/pull repeats each router's; one that a third router relays from
// before the restart may set the old version back, until the next
// push/pull. Either way the version is wrong only for a while: sent too
// low, a state loses what the peer could have read; too high, the peer
// refuses the batch and repairs its copies with full ones once the
// version is right.
func (b *membership) heardWire(n *memberlist.Node) {
	v := wireVersion(n.DMax)
	b.mu.RLock()
	mb := b.members[n.Name]
	skip := mb == nil || mb.wire == v || !mb.node.Addr.Equal(n.Addr) || mb.node.Port != n.Port
	b.mu.RUnlock()
	if skip {
		return // not known yet (NotifyJoin records it), or another node by that name
	}
	b.mu.Lock()
	if mb := b.members[n.Name]; mb != nil {
		mb.wire = v
	}
	b.mu.Unlock()
}

// NotifyMerge refuses a join with a cluster of another contract.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if n.Name == d.mem.cfg.Name || n.State != memberlist.StateAlive {
			continue
		}
		if err := d.mem.checkPeer(n); err != nil {
			return err
		}
	}
	return nil
}

// NotifyJoin records a new router (memberlist holds its lock).
func (d *delegate) NotifyJoin(n *memberlist.Node) { d.mem.upsert(n, true) }

// NotifyUpdate records a router's new metadata.
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.mem.upsert(n, true) }

// NotifyLeave records a router that left or failed, and tells the
// watchers (gonewatch.go).
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.mem.upsert(n, false) }

// AckPayload adds nothing to probe acks.
func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete records the RTT of a direct probe.
func (d *delegate) NotifyPingComplete(n *memberlist.Node, rtt time.Duration, _ []byte) {
	d.mem.pinged(n.Name, rtt)
}
