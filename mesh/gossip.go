package mesh

// Owner side of dissemination: every tick, the owner cuts each owned
// summary's new log entries into one compact delta, encodes every replica's
// state once, and hands each live peer a batch assembled from those
// encodings (see peers.go for the queues and back-pressure).

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

const (
	// maxStateBytes bounds one encoded state (a batch entry's state is
	// u16-prefixed); models and declarers beyond it are left out.
	maxStateBytes = 8 << 10
	// maxBatchBytes is the size a batch message is split at, well under
	// memberlist's 20 MiB limit on one reliable message.
	maxBatchBytes = 4 << 20
)

// dissemination is the owner side: every tick it cuts the owned
// summaries' deltas and queues each live peer its batch (peers.go), and
// it sends the copy side's full-copy requests. The peer set and the tick
// count are guarded by the table's lock, under which ticks decide what
// to send; each peer's queue has a lock of its own.
type dissemination struct {
	*env
	tab     *table
	mem     *membership  // the live peers and their nodes
	rep     *replication // asks for full copies of stale copies
	repairs chan job
	queued  atomic.Int64 // batches waiting in peer queues

	peers map[string]*peer // live peers and their send queues (tab.mu)
	ticks int              // (tab.mu)

	// beaconTicks counts beaconTick's runs: an idle owner's stays put.
	beaconTicks atomic.Int64
}

type job struct {
	to  string
	msg []byte
}

func newDissemination(e *env, t *table, mem *membership) *dissemination {
	return &dissemination{env: e, tab: t, mem: mem, repairs: make(chan job, repairSize), peers: map[string]*peer{}}
}

// send queues a direct message (a full-copy request) for repairLoop.
func (d *dissemination) send(to string, msg []byte) {
	select {
	case d.repairs <- job{to: to, msg: msg}:
	default:
		d.met.dropped.WithLabelValues(dropHandoffFull).Inc()
	}
}

func (d *dissemination) repairLoop() {
	defer d.wg.Done()
	for {
		select {
		case <-d.ctx.Done():
			return
		case j := <-d.repairs:
			node, ok := d.mem.aliveNode(j.to)
			if !ok {
				continue
			}
			if err := d.mem.ml.SendReliable(&node, j.msg); err != nil {
				d.log.Debug("direct send failed", "to", j.to, "kind", kindName(j.msg[0]), "error", err)
				continue
			}
			d.met.out(j.msg[0], len(j.msg))
		}
	}
}

// setOwnedLocked flips r between writer and copy.
func (d *dissemination) setOwnedLocked(r *replica, owned bool) {
	if r.owned == owned {
		return
	}
	r.owned = owned
	d.tab.touchLocked(r)
	if !owned {
		d.log.Info("replica owned elsewhere now; keeping a copy", "replica", r.id)
		r.hasState = false
		return
	}
	// Its load goes in the next beacon, whether it moves or not, as it
	// did when a ticker ran the beacon loop (the write lock held here
	// excludes the loop's read of the mark).
	r.beaconed = beaconMark{}
	wakeBeacons(d.beaconWake)
	r.pend, r.mismatchSince, r.wantFull = nil, time.Time{}, false
	if r.sum != nil {
		// The copy is bit-identical to the old owner's: continue its epoch.
		r.lastSent = r.sum.Version()
		d.log.Info("taking over replica with its gossiped summary", "replica", r.id, "epoch", r.sum.Epoch(), "version", r.lastSent)
	}
}

// ensureSummaryLocked gives an owned replica a summary of the right size.
func (d *dissemination) ensureSummaryLocked(r *replica) {
	want := d.cfg.DefaultCapacityBlocks
	if r.capacity > 0 {
		want = min(max(r.capacity, 2), summary.MaxCapacityBlocks)
	}
	if r.sum != nil && (r.sum.Params().CapacityBlocks == want || r.capacity == 0) {
		return
	}
	epoch := uint64(time.Now().UnixNano()) ^ xxh3.HashString(d.cfg.Name)
	p := summary.Params{CapacityBlocks: want, FalsePositiveRate: d.cfg.FalsePositiveRate}
	var s *summary.Summary
	var err error
	if r.sum == nil {
		s, err = summary.New(p, epoch)
	} else {
		// Another size is another geometry, so another epoch (copies
		// take a full copy), holding what the old summary held: the
		// prefixes the replica has do not change with the size it is
		// counted in.
		var kept int
		s, kept, err = summary.Resized(r.sum, p, epoch)
		if err == nil {
			d.log.Info("replica capacity changed; summary resized into a new epoch", "replica", r.id,
				"from", r.sum.Params().CapacityBlocks, "to", want, "kept_blocks", kept)
		}
	}
	if err != nil {
		d.log.Error("cannot size summary", "replica", r.id, "capacity", want, "error", err)
		return
	}
	if r.sum == nil {
		wakeBeacons(d.beaconWake) // its load goes in beacons from now on
	}
	r.sum, r.lastSent, r.digestVer, r.digest = s, 0, 0, 0
	d.tab.touchLocked(r)
}

// ownedStateLocked is the state of a replica this router owns (or, when
// not owned, a declaration).
func (d *dissemination) ownedStateLocked(r *replica) stateMsg {
	st := stateMsg{header: d.nextHeader(), Replica: r.id, Owned: r.owned, Healthy: r.healthy,
		Capacity: uint32(max(r.capacity, 0)), Models: r.models}
	for d := range r.declarers {
		st.DeclaredBy = append(st.DeclaredBy, d)
	}
	slices.Sort(st.DeclaredBy)
	// A state without its owner's load (a declaration, an owner before
	// its first summary) carries zero counts, which routers have always
	// read as known: HasLoad keeps that reading (and its bytes).
	st.Engine.HasLoad = true
	if r.owned && r.sum != nil {
		st.Epoch, st.Version = r.sum.Epoch(), r.lastSent
		st.InFlight = uint32(max(r.load.inFlight.Load(), 0))
		st.Pending = float64(max(r.load.pendingK.Load(), 0)) / 1000
		st.Engine, st.EngineWire, st.LoRA = r.engine, true, r.lora
		st.Role, st.Bootstrap = r.role, r.bootstrap
		if r.digestVer == r.lastSent+1 {
			st.Digest = r.digest
		}
	}
	return st
}

// encodeState appends a state to dst within maxStateBytes, dropping
// declarers then models that do not fit (a replica with hundreds of
// models is not routed for all).
func (d *dissemination) encodeState(dst []byte, st *stateMsg) []byte {
	b := st.append(dst)
	for len(b) > maxStateBytes && len(st.DeclaredBy) > 1 {
		st.DeclaredBy = st.DeclaredBy[:len(st.DeclaredBy)-1]
		b = st.append(b[:len(dst)])
	}
	for len(b) > maxStateBytes && len(st.Models) > 0 {
		st.Models = st.Models[:len(st.Models)-1]
		b = st.append(b[:len(dst)])
		if len(b) <= maxStateBytes {
			d.log.Warn("replica state over its bound; models left out", "replica", st.Replica, "kept", len(st.Models))
		}
	}
	return b
}

func (d *dissemination) tickLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Timing.StateInterval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
			d.tick(time.Now())
		}
	}
}

// cut is one owned replica's share of a tick.
type cut struct {
	r        *replica
	sum      *summary.Summary
	from, to uint64
	delta    []byte
	ok       bool // delta is usable; else everyone gets a full copy
	cheaper  bool // not usable because a full copy is smaller
	st       stateMsg
	changed  bool // the full state goes out (changed, or heartbeat due)
}

// stateFingerprint hashes what a full state says beyond the summary's
// position, which deltas and slim states carry.
func stateFingerprint(st stateMsg) uint64 {
	st.header, st.Version = header{}, 0
	return xxh3.Hash(st.append(nil))
}

// heartbeatTicks is how often an unchanged replica's full state is
// repeated: four times per StaleAfter.
func (d *dissemination) heartbeatTicks() int {
	return max(int(d.cfg.Timing.StaleAfter/(4*d.cfg.Timing.StateInterval)), 1)
}

// tick re-decides ownership, checks copies, cuts the owned replicas'
// deltas and hands every live peer its batch.
func (d *dissemination) tick(now time.Time) {
	d.tab.mu.Lock()
	d.ticks++
	decl := d.ticks%declEveryTicks == 1
	var cuts []cut
	var others []stateMsg // declarations and withdrawals
	for _, r := range d.tab.order {
		d.sendHandBackLocked(r, now)
		owner := d.tab.ownerLocked(r)
		d.setOwnedLocked(r, owner == d.cfg.Name)
		if r.owned {
			d.ensureSummaryLocked(r)
			if r.sum != nil {
				cuts = append(cuts, cut{r: r, sum: r.sum, from: r.lastSent})
				// What else changes the summary (a forget, a cut, a new
				// epoch) reaches the decisions' held count here.
				r.load.held.Store(int64(r.sum.Held()))
			}
			continue
		}
		switch {
		case r.withdrawT > 0:
			r.withdrawT--
			others = append(others, stateMsg{header: d.nextHeader(), Replica: r.id, Withdrawn: true})
		case r.declared && decl:
			others = append(others, d.ownedStateLocked(r))
		}
		if r.hasState && owner == r.st.Origin {
			if d.ticks%declEveryTicks == 0 { // a gauge per replica: not every tick
				d.met.age.WithLabelValues(r.id).Set(now.Sub(r.heard).Seconds())
			}
			if r.wantFull || (!r.mismatchSince.IsZero() && now.Sub(r.mismatchSince) > 4*d.cfg.Timing.StateInterval) {
				d.rep.requestFullLocked(r, owner, now, "copy stays behind the owner's state")
			}
		}
	}
	peers := d.syncPeersLocked()
	d.tab.unlock()

	// Off the lock: cut the deltas (copying and coding the log).
	for i := range cuts {
		c := &cuts[i]
		c.delta, c.to, c.ok = c.sum.AppendDelta(nil, c.from)
		if c.ok && len(c.delta) > c.sum.Stats().Bytes {
			c.ok, c.cheaper = false, true // a full copy is cheaper
		}
	}

	d.tab.mu.Lock()
	kept := cuts[:0]
	for _, c := range cuts {
		r := c.r
		if !r.owned || r.sum != c.sum || r.lastSent != c.from {
			continue // ownership or summary changed meanwhile: next tick
		}
		switch {
		case c.ok:
			r.lastSent = c.to
		default:
			r.lastSent = c.sum.Version()
		}
		// A digest lets copies catch what versions cannot show; one per
		// heartbeat is enough, and only of a summary at rest.
		if r.digestVer != r.lastSent+1 && c.sum.Version() == r.lastSent && d.ticks%d.heartbeatTicks() == 0 {
			d.tab.post.digests = append(d.tab.post.digests, ownerDigestJob{r: r, sum: c.sum, version: r.lastSent})
		}
		c.st = d.ownedStateLocked(r)
		kept = append(kept, c)
	}
	ticks := d.ticks
	d.tab.unlock()
	// Off the lock: fingerprinting encodes and hashes every state (0.3-1
	// ms at 1,024 owned replicas, which readers such as Begin and Locate
	// would wait for). stateFP and stateTick are this goroutine's alone.
	for i := range kept {
		c := &kept[i]
		if fp := stateFingerprint(c.st); fp != c.r.stateFP || ticks-c.r.stateTick >= d.heartbeatTicks() {
			c.r.stateFP, c.r.stateTick, c.changed = fp, ticks, true
		}
	}
	d.offer(now, peers, kept, others)
}
