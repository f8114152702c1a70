package mesh

// Membership as soft state: a peer's declaration of a replica lives while
// that router re-asserts it (its own states, at least every declaration
// period, and its push/pull state) and goes DeclarationTTL after it stops,
// or at once when its push/pull state no longer lists it (or it gossips a
// withdrawal). A replica with no live declarer has no owner and leaves the
// candidate list. Seeds not all in the mesh are re-joined for as long as
// they are missing.

import (
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/summary"
)

// maxDeclarers bounds the routers remembered as declaring one replica.
const maxDeclarers = 64

// declarationHolds is the soft-state rule: this router's own declaration
// holds while it declares the replica; a peer's, for ttl after the last
// time that peer asserted it itself.
func declarationHolds(name, self string, selfDeclares bool, heard time.Time, now time.Time, ttl time.Duration) bool {
	if name == self {
		return selfDeclares
	}
	return !heard.IsZero() && now.Sub(heard) <= ttl
}

// declaresLocked reports whether router name's declaration of r holds.
func (t *table) declaresLocked(r *replica, name string, now time.Time) bool {
	return r.declarers[name] && declarationHolds(name, t.cfg.Name, r.declared, r.declHeard[name], now, t.cfg.Timing.DeclarationTTL)
}

// declarersLocked lists, sorted, the routers whose declaration of r holds.
func (t *table) declarersLocked(r *replica, now time.Time) []string {
	var out []string
	for d := range r.declarers {
		if t.declaresLocked(r, d, now) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// expireDeclarations is expireDeclarationsLocked in a write section of
// its own (membership's join loop runs it every period).
func (t *table) expireDeclarations(now time.Time) {
	t.mu.Lock()
	t.expireDeclarationsLocked(now)
	t.unlock()
}

// expireDeclarationsLocked drops the declarations that no longer hold
// (owners are recomputed as the lock is released); a replica left with
// no live declarer loses its dead owner's word, so no view lists it
// healthy.
func (t *table) expireDeclarationsLocked(now time.Time) {
	for id, r := range t.replicas {
		for d := range r.declarers {
			if t.declaresLocked(r, d, now) {
				continue
			}
			delete(r.declarers, d)
			delete(r.declHeard, d)
			t.markOwnerLocked(r)
			if d != t.cfg.Name {
				t.log.Info("declaration expired: its router stopped asserting it", "replica", id, "router", d)
			}
		}
		if !r.owned && r.hasState && t.ownerLocked(r) == "" {
			r.hasState = false
			t.touchLocked(r)
		}
	}
}

// reassertedLocked applies a peer's complete push/pull state: its
// declarations of replicas it no longer lists go at once, so a router
// restarted without a replica stops claiming it at its first push/pull,
// not a TTL later.
func (t *table) reassertedLocked(p *pushPull) {
	if p.Origin == t.cfg.Name {
		return
	}
	asserted := map[string]bool{}
	for i := range p.Entries {
		if st := &p.Entries[i].State; st.Origin == p.Origin {
			asserted[st.Replica] = true
		}
	}
	for id, r := range t.replicas {
		if r.declarers[p.Origin] && !asserted[id] {
			delete(r.declarers, p.Origin)
			delete(r.declHeard, p.Origin)
			t.markOwnerLocked(r)
			t.log.Info("declaration retracted: absent from its router's push/pull state", "replica", id, "router", p.Origin)
		}
	}
}

// withdrawLocked forgets that origin declares the replica.
func (t *table) withdrawLocked(origin, id string) {
	r := t.replicas[id]
	if r == nil {
		return
	}
	if r.declarers[origin] {
		delete(r.declarers, origin)
		t.markOwnerLocked(r)
	}
	if r.withdrawn == nil {
		r.withdrawn = map[string]bool{}
	}
	if len(r.withdrawn) < 64 {
		r.withdrawn[origin] = true
	}
	if r.hasState && r.st.Origin == origin {
		r.hasState = false
		t.touchLocked(r)
	}
}

// handBack is a copy handed back to a restarted owner. It is resent,
// backing off, until the owner's state shows the copy's epoch (it
// adopted it) or handBackFor passes: one message can be lost to the
// restart itself (the peer's old address, its sender dropped while it
// was briefly gone), and a hand-back that fails leaves the owner cold.
type handBack struct {
	to    string
	boot  uint64
	epoch uint64
	enc   []byte // the copy, encoded once
	until time.Time
	next  time.Time
	wait  time.Duration
}

// handBackFor bounds how long a copy is offered back.
const handBackFor = 20 * time.Second

// handBackLocked runs on the first state of a restarted owner (a new
// boot, a new epoch) of a replica this router holds a copy of from its
// previous incarnation: the copy goes back to it, once per boot, so
// the owner is warm after one exchange even when no other router held the
// replica meanwhile. (It runs before the state replaces the copy's.) A
// router that owned the replica meanwhile, continuing that epoch, hands
// its summary back the same way: it may still count itself the owner when
// the restarted one's first state comes (it gives the replica up on that
// state or at its next tick), and after that first state nothing would
// tell it to.
func (c *replication) handBackLocked(r *replica, st *stateMsg) {
	if r.sum == nil || r.sum.Version() == 0 || st.Epoch == r.sum.Epoch() ||
		r.st.Origin != st.Origin || r.st.Boot == st.Boot || r.handedBack == st.Boot ||
		r.st.Epoch != r.sum.Epoch() || c.tab.ownerLocked(r) != st.Origin {
		return
	}
	now := time.Now()
	r.handedBack = st.Boot
	r.hb = &handBack{to: st.Origin, boot: st.Boot, epoch: r.sum.Epoch(), enc: r.sum.AppendEncode(nil, c.fp),
		until: now.Add(handBackFor), next: now, wait: max(c.cfg.Timing.StateInterval, 50*time.Millisecond)}
	c.log.Info("handing a restarted owner its summary back", "replica", r.id, "to", st.Origin, "epoch", r.sum.Epoch(), "version", r.sum.Version())
	c.dis.sendHandBackLocked(r, now)
}

// sendHandBackLocked (re)sends r's hand-back when it is due, and drops
// it when it is done or too old.
func (d *dissemination) sendHandBackLocked(r *replica, now time.Time) {
	hb := r.hb
	if hb == nil || now.Before(hb.next) {
		return
	}
	if now.After(hb.until) {
		r.hb = nil
		return
	}
	p := d.peers[hb.to]
	if p == nil {
		d.syncPeersLocked() // it may have come back before the next tick
		if p = d.peers[hb.to]; p == nil {
			return // not alive here yet: the next tick tries again
		}
	}
	hb.next, hb.wait = now.Add(hb.wait), 2*hb.wait
	// A batch entry's state is its sender's: a withdrawn one says, truly,
	// that this router does not declare the replica, and carries the copy.
	st := stateMsg{header: d.nextHeader(), Replica: r.id, Withdrawn: true}
	msgs := d.assemble([][]byte{appendEntryRaw(nil, st.append(nil), payloadFull, hb.enc)})
	p.mu.Lock()
	p.handBack = append(p.handBack, msgs...)
	d.queued.Add(int64(len(msgs)))
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// handBackDoneLocked ends a hand-back once the owner's state shows the
// copy's epoch: it adopted it.
func handBackDoneLocked(r *replica, st *stateMsg) {
	if hb := r.hb; hb != nil && st.Origin == hb.to && st.Boot == hb.boot && st.Epoch == hb.epoch {
		r.hb = nil
	}
}

// adoptSummaryLocked lets the owner of r take a full summary a peer sent
// (a push/pull state or a full reply: the router that held the replica
// meanwhile, or a copy of this router's previous incarnation's summary)
// while its own is young (every insert of it still in its log, as after
// a restart): it adopts s and re-adds its own inserts, so a restarted
// owner is warm again after one exchange, as a new router is, and loses
// nothing it recorded meanwhile. It reports whether it adopted s.
func (c *replication) adoptSummaryLocked(r *replica, owner string, st *stateMsg, s *summary.Summary) bool {
	if owner != c.cfg.Name || s == nil || (st.Origin == c.cfg.Name && st.Boot == c.boot) || s.Version() == 0 {
		return false
	}
	var mine []uint64
	if r.sum != nil {
		if r.sum.Epoch() == s.Epoch() {
			return false
		}
		hs, ok := r.sum.Since(0)
		if !ok {
			return false // ours has a history of its own: keep it
		}
		mine = hs
	}
	c.log.Info("adopting the summary a peer held", "replica", r.id, "from", st.Origin, "epoch", s.Epoch(), "version", s.Version(), "own_entries", len(mine))
	v := s.Version()
	if len(mine) > 0 {
		// Log entries are keys of the summary's geometry: they replay on
		// one of the same parameters.
		if r.sum.Params() != s.Params() {
			c.log.Warn("adopted summary has other parameters; this router's own recent inserts are not carried over", "replica", r.id)
		} else if err := s.Apply(s.Epoch(), v, mine); err != nil {
			c.log.Warn("replaying own inserts on the adopted summary", "replica", r.id, "error", err)
		}
	}
	r.sum, r.wantFull, r.digestVer, r.digest = s, false, 0, 0
	c.tab.touchLocked(r)
	if r.owned {
		r.lastSent = v // the re-added inserts go out as deltas
	}
	return true
}

// missingSeeds returns the seeds to re-join: each seed ("host:port", or a
// host with the default port) whose resolved addresses are not all alive
// members. A seed that does not resolve now is missing (DNS may be back
// at the next round); resolve is called for host names only.
func missingSeeds(seeds []string, defaultPort int, resolve func(host string) ([]string, error), alive map[string]bool) []string {
	var out []string
	for _, s := range seeds {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			host, port = s, strconv.Itoa(defaultPort)
		}
		ips := []string{host}
		if net.ParseIP(host) == nil {
			if ips, err = resolve(host); err != nil || len(ips) == 0 {
				out = append(out, s)
				continue
			}
		}
		for _, ip := range ips {
			if !alive[net.JoinHostPort(ip, port)] {
				out = append(out, s)
				break
			}
		}
	}
	return out
}
