package mesh

// Copy side of dissemination: the state machine that keeps a copy of
// another router's summary in step with its owner (apply deltas in
// order, keep early ones, repair gaps and divergence with a full copy).

import (
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/summary"
)

// replication is the copy side: it applies the owners' states, deltas and
// full copies to this router's copies of their summaries, under the
// table's lock (a state declares, decides the owner and updates the copy
// at once).
type replication struct {
	*env
	tab   *table
	dis   *dissemination // sends the full-copy requests
	inbox chan []byte
}

func newReplication(e *env, t *table, d *dissemination) *replication {
	return &replication{env: e, tab: t, dis: d, inbox: make(chan []byte, inboxSize)}
}

func (c *replication) inboxLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case b := <-c.inbox:
			c.handleMsg(b)
		}
	}
}

// handleMsg decodes and applies one direct message.
func (c *replication) handleMsg(b []byte) {
	msg, err := decodeMsg(b, c.wire)
	if err != nil {
		c.met.dropped.WithLabelValues(dropDecode).Inc()
		c.log.Debug("undecodable message", "bytes", len(b), "error", err)
		return
	}
	c.met.in(b[0], len(b))
	switch v := msg.(type) {
	case batchMsg:
		c.handleBatch(&v)
		return
	case usageMsg:
		c.handleUsage(v)
		return
	case loadMsg:
		c.handleLoad(&v)
		return
	}
	now := time.Now()
	c.tab.mu.Lock()
	defer c.tab.unlock()
	switch v := msg.(type) {
	case stateMsg:
		c.handleStateLocked(&v, now)
	case fullReq:
		c.dis.handleFullReqLocked(v)
	}
}

// handleBatch applies an owner's batch: payloads are decoded first,
// without the lock; then, per entry, the declaration (it decides the
// owner), a full copy, the delta, and last the state, which then finds the
// copy it describes.
func (c *replication) handleBatch(b *batchMsg) {
	if b.Origin == c.cfg.Name {
		return
	}
	deltas := make([]*summary.Delta, len(b.Entries))
	fulls := make([]*summary.Summary, len(b.Entries))
	nfull := 0
	for i := range b.Entries {
		e := &b.Entries[i]
		switch e.Kind {
		case payloadDelta:
			d, err := summary.DecodeDelta(e.Payload)
			if err != nil {
				c.met.dropped.WithLabelValues(dropDecode).Inc()
				c.log.Debug("undecodable delta", "replica", e.State.Replica, "from", b.Origin, "error", err)
				continue
			}
			deltas[i] = d
		case payloadFull:
			fulls[i] = c.decodeSummary(&stateWithSummary{State: e.State, Summary: e.Payload})
			nfull++
		}
	}
	var checks []fullCheck
	if nfull > 0 {
		checks = c.compareFulls(len(fulls), func(i int) string { return b.Entries[i].State.Replica },
			func(i int) *summary.Summary { return fulls[i] })
	}
	now := time.Now()
	c.tab.mu.Lock()
	defer c.tab.unlock()
	for i := range b.Entries {
		st := &b.Entries[i].State
		if !st.Withdrawn {
			c.tab.declareLocked(st)
		}
		if fulls[i] != nil {
			c.handleFullLocked(st, fulls[i], checks[i], now)
		}
		if deltas[i] != nil {
			c.handleDeltaLocked(st.Origin, st.Replica, deltas[i], now)
		}
		c.handleStateLocked(st, now)
	}
}

// handleStateLocked applies a state; it reports whether it was new (and
// so should be re-broadcast).
func (c *replication) handleStateLocked(st *stateMsg, now time.Time) bool {
	if st.Origin == c.cfg.Name {
		return false
	}
	key := st.Origin + "\x00" + st.Replica
	if s, ok := c.tab.stateSeen[key]; ok && (st.Boot < s.boot || st.Boot == s.boot && st.Seq <= s.seq) {
		c.met.dropped.WithLabelValues(dropDuplicate).Inc()
		return false
	}
	if len(c.tab.stateSeen) >= maxOrigins*16 {
		clear(c.tab.stateSeen) // bounded memory; states only get re-accepted
	}
	c.tab.stateSeen[key] = seenState{st.Boot, st.Seq}
	if r := c.tab.replicas[st.Replica]; r != nil {
		handBackDoneLocked(r, st)
	}
	if st.Withdrawn {
		c.tab.withdrawLocked(st.Origin, st.Replica)
		return true
	}
	if st.Slim {
		c.slimStateLocked(st, now)
		return true
	}
	r := c.tab.declareLocked(st)
	if r == nil {
		c.met.dropped.WithLabelValues(dropRefused).Inc()
		return false
	}
	owner := c.tab.ownerLocked(r)
	if !st.Owned {
		return true
	}
	if owner == c.cfg.Name {
		// We own it by our view. If ours is an empty fresh summary and the
		// other router has history (we just started, it held the replica
		// meanwhile), adopt its copy rather than erase it.
		if r.sum != nil && r.sum.Version() == 0 && st.Version > 0 {
			c.requestFullLocked(r, st.Origin, now, "adopting history of a previous owner")
		}
		return true
	}
	if owner != st.Origin {
		return true // a stale claim; ownership moved on
	}
	c.dis.setOwnedLocked(r, false)
	r.st, r.hasState, r.heard, r.loadAt = *st, true, now, now
	c.tab.touchLocked(r)
	if r.sum == nil || r.sum.Epoch() != st.Epoch {
		c.requestFullLocked(r, owner, now, "no copy of the owner's epoch")
	} else {
		c.drainLocked(r)
		c.checkSyncLocked(r, now)
	}
	return true
}

// checkSyncLocked compares a copy with the owner's last state: versions
// that stay apart too long, or a digest that differs at equal versions,
// make the copy ask for a full one.
func (c *replication) checkSyncLocked(r *replica, now time.Time) {
	if r.sum == nil || !r.hasState || r.sum.Epoch() != r.st.Epoch {
		return
	}
	v := r.sum.Version()
	if v != r.st.Version {
		if r.mismatchSince.IsZero() {
			r.mismatchSince = now
		}
		return
	}
	r.mismatchSince = time.Time{}
	if r.st.Digest != 0 && r.verified != v+1 {
		// Hashing the encoded summary happens after the lock (see
		// table.unlock); the job re-checks that nothing moved meanwhile.
		c.tab.post.verify = append(c.tab.post.verify, verifyJob{r: r, sum: r.sum, version: v, want: r.st.Digest})
	}
}

// digestOf is the summary's digest; ok is false when an insert raced it
// (the version moved).
func digestOf(s *summary.Summary, fp uint64) (uint64, bool) {
	v := s.Version()
	d, at := s.Digest(fp)
	return d, at == v
}

func (c *replication) requestFullLocked(r *replica, from string, now time.Time, why string) {
	r.wantFull = true
	c.tab.touchLocked(r)
	if now.Sub(r.lastFullReq) < max(4*c.cfg.Timing.StateInterval, 200*time.Millisecond) {
		return
	}
	r.lastFullReq = now
	c.met.resyncs.Inc()
	c.log.Debug("requesting full summary", "replica", r.id, "from", from, "reason", why)
	c.dis.send(from, fullReq{Origin: c.cfg.Name, Replica: r.id}.append(nil))
}

// handleDeltaLocked applies an owner's delta to the copy.
func (c *replication) handleDeltaLocked(origin, id string, d *summary.Delta, now time.Time) {
	r := c.tab.replicas[id]
	if r == nil || r.owned || c.tab.ownerLocked(r) != origin {
		return
	}
	r.heard = now
	c.tab.touchLocked(r)
	switch {
	case r.sum == nil:
		c.requestFullLocked(r, origin, now, "delta without a copy")
	case r.sum.Epoch() != d.Epoch:
		if r.hasState && r.st.Epoch == d.Epoch {
			c.requestFullLocked(r, origin, now, "copy of an old epoch")
		}
	default:
		c.applyLocked(r, d, origin, now)
		c.drainLocked(r)
		// The delta states the owner's version as well as a state would
		// (states are slim or absent while nothing else changes).
		if r.hasState && r.st.Origin == origin && r.st.Epoch == d.Epoch && d.To() > r.st.Version {
			r.st.Version, r.st.Digest = d.To(), 0
		}
		c.checkSyncLocked(r, now)
	}
}

func (c *replication) applyLocked(r *replica, d *summary.Delta, origin string, now time.Time) {
	switch err := r.sum.ApplyDelta(d); {
	case err == nil:
	case errors.Is(err, summary.ErrGap):
		// Streams to a peer are ordered, but each batch is its own
		// connection: keep an early one until the ones before it come, or
		// a state shows the copy stays behind.
		if len(r.pend) < maxPending {
			r.pend = append(r.pend, d)
		} else {
			c.requestFullLocked(r, origin, now, "too many deltas out of order")
		}
	default:
		c.requestFullLocked(r, origin, now, err.Error())
	}
}

// drainLocked applies kept deltas that now reach the copy.
func (c *replication) drainLocked(r *replica) {
	for progress := true; progress && len(r.pend) > 0; {
		progress = false
		v, e := r.sum.Version(), r.sum.Epoch()
		keep := r.pend[:0]
		for _, d := range r.pend {
			switch {
			case d.Epoch != e || d.To() <= v:
				// obsolete
			case d.From <= v:
				if err := r.sum.ApplyDelta(d); err != nil {
					r.wantFull = true
					c.tab.touchLocked(r)
				}
				progress = true
			default:
				keep = append(keep, d)
			}
		}
		r.pend = keep
	}
}

// slimStateLocked moves a copy's idea of its owner's version on: a slim
// state says nothing else changed since the owner's last full state.
func (c *replication) slimStateLocked(st *stateMsg, now time.Time) {
	r := c.tab.replicas[st.Replica]
	if r == nil || r.owned || !r.hasState || r.st.Origin != st.Origin || c.tab.ownerLocked(r) != st.Origin || r.st.Epoch != st.Epoch {
		return // the owner's next full state (change or heartbeat) sets it up
	}
	if st.Version != r.st.Version {
		r.st.Version, r.st.Digest = st.Version, 0 // the digest was of another version
	}
	r.st.header = st.header
	r.heard, r.loadAt = now, now
	c.tab.touchLocked(r)
	c.drainLocked(r)
	c.checkSyncLocked(r, now)
}

// decodeSummary decodes the summary of a full copy (nil when it carries
// none or it does not decode). It takes no lock.
func (c *replication) decodeSummary(f *stateWithSummary) *summary.Summary {
	if len(f.Summary) == 0 || f.State.Origin == c.cfg.Name {
		return nil
	}
	s, err := summary.Decode(f.Summary, c.fp)
	if err != nil {
		c.met.dropped.WithLabelValues(dropDecode).Inc()
		c.log.Warn("undecodable full summary", "replica", f.State.Replica, "from", f.State.Origin, "error", err)
		return nil
	}
	return s
}

// fullCheck is a full copy compared, before the lock, with the copy it
// would replace: cur at version curVer, equal says their digests (of
// everything the encoding holds) and versions are equal.
type fullCheck struct {
	cur    *summary.Summary
	curVer uint64
	equal  bool
}

// compareFulls compares each of n entries' full copy (full(i), nil for
// none) of replica id(i) with this router's copy of that replica, off the
// lock: hashing two summaries costs microseconds, and a push/pull carries
// a thousand.
func (c *replication) compareFulls(n int, id func(int) string, full func(int) *summary.Summary) []fullCheck {
	checks := make([]fullCheck, n)
	c.tab.mu.RLock()
	for i := range n {
		if s := full(i); s != nil {
			if r := c.tab.replicas[id(i)]; r != nil && !r.owned && r.sum != nil && r.sum.Epoch() == s.Epoch() {
				checks[i].cur = r.sum
			}
		}
	}
	c.tab.mu.RUnlock()
	fp := c.fp
	for i := range checks {
		c := &checks[i]
		if c.cur == nil {
			continue
		}
		s := full(i)
		d, v := c.cur.Digest(fp)
		if v != s.Version() {
			continue
		}
		ds, _ := s.Digest(fp)
		c.curVer, c.equal = v, d == ds
	}
	return checks
}

// handleFullLocked installs a full copy s (decoded by decodeSummary) from
// the owner, or adopts one from the previous owner when ours is fresh and
// empty. A copy equal to the one held (chk, by version and digest) is not
// installed: replacing it would make the Index refill the replica's
// column for nothing (a push/pull carries every replica's summary), so
// the copy is kept and counts as verified. A copy that diverged at equal
// version has another digest and is installed, as is any copy asked for.
func (c *replication) handleFullLocked(st *stateMsg, s *summary.Summary, chk fullCheck, now time.Time) {
	if s == nil || st.Origin == c.cfg.Name {
		return
	}
	r := c.tab.replicas[st.Replica]
	if r == nil {
		return
	}
	owner := c.tab.ownerLocked(r)
	switch {
	case c.adoptSummaryLocked(r, owner, st, s):
		return
	case owner != st.Origin || r.owned:
		c.met.dropped.WithLabelValues(dropRefused).Inc()
		return
	}
	switch {
	case r.sum != nil && !r.wantFull && chk.equal && r.sum == chk.cur && r.sum.Version() == chk.curVer:
		c.met.fullsIn.WithLabelValues(fullEqual).Inc()
		r.verified, r.mismatchSince, r.heard = chk.curVer+1, time.Time{}, now
		c.tab.touchLocked(r)
		c.drainLocked(r)
		c.checkSyncLocked(r, now)
	case r.sum == nil || r.wantFull || r.sum.Epoch() != s.Epoch() || s.Version() >= r.sum.Version():
		c.met.fullsIn.WithLabelValues(fullInstalled).Inc()
		r.sum, r.wantFull, r.verified, r.mismatchSince = s, false, 0, time.Time{}
		r.heard = now
		c.tab.touchLocked(r)
		c.drainLocked(r)
		c.checkSyncLocked(r, now)
	}
}

// verifyJob checks a copy's digest against its owner's, off the lock.
type verifyJob struct {
	r       *replica
	sum     *summary.Summary
	version uint64
	want    uint64
}

// ownerDigestJob computes an owned summary's digest, off the lock.
type ownerDigestJob struct {
	r       *replica
	sum     *summary.Summary
	version uint64
}

// postLock is work found under the lock that encodes or hashes a whole
// summary: it runs after the lock is released, so readers never wait on
// it.
type postLock struct {
	verify  []verifyJob
	digests []ownerDigestJob
}

// afterUnlock hashes the summaries p names, off the lock, and applies
// the results under it (table.unlock calls it once it released the lock).
func (c *replication) afterUnlock(p postLock) {
	type result struct {
		d  uint64
		ok bool
	}
	vr := make([]result, len(p.verify))
	for i, j := range p.verify {
		d, ok := digestOf(j.sum, c.fp)
		vr[i] = result{d, ok && j.sum.Version() == j.version}
	}
	dr := make([]result, len(p.digests))
	for i, j := range p.digests {
		d, ok := digestOf(j.sum, c.fp)
		dr[i] = result{d, ok && j.sum.Version() == j.version}
	}
	now := time.Now()
	c.tab.mu.Lock()
	defer c.tab.unlock() // requests only send; nothing is queued again
	for i, j := range p.verify {
		r := j.r
		if !vr[i].ok || r.sum != j.sum || r.owned || !r.hasState || r.st.Version != j.version || r.st.Digest != j.want {
			continue // moved on meanwhile; the next state checks again
		}
		if vr[i].d != j.want {
			c.requestFullLocked(r, r.st.Origin, now, "copy diverged (digest differs at equal version)")
			continue
		}
		r.verified = j.version + 1
	}
	for i, j := range p.digests {
		if r := j.r; dr[i].ok && r.owned && r.sum == j.sum && r.lastSent == j.version {
			r.digest, r.digestVer = dr[i].d, j.version+1
		}
	}
}
