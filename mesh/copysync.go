package mesh

// Copy side of dissemination: the state machine that keeps a copy of
// another router's summary in step with its owner (apply deltas in
// order, keep early ones, repair gaps and divergence with a full copy).

import (
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

func (m *Mesh) inboxLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case b := <-m.inbox:
			m.handleMsg(b)
		}
	}
}

// handleMsg decodes and applies one message (gossiped or direct).
func (m *Mesh) handleMsg(b []byte) {
	msg, err := decodeMsg(b)
	if err != nil {
		m.met.dropped.WithLabelValues(dropDecode).Inc()
		m.log.Debug("undecodable message", "bytes", len(b), "error", err)
		return
	}
	m.met.in(b[0], len(b))
	// A full copy is decoded before the lock: decoding a large summary
	// must not hold up the readers (every request's Candidates).
	var full *summary.Summary
	if v, ok := msg.(stateWithSummary); ok {
		full = m.decodeSummary(&v)
	}
	now := time.Now()
	m.mu.Lock()
	defer m.unlockAndRun()
	switch v := msg.(type) {
	case stateMsg:
		if m.handleStateLocked(&v, now) && m.relay() {
			m.enqueue(&namedBroadcast{name: stateName(v.Origin, v.Replica), msg: b})
		}
	case deltaMsg:
		if m.handleDeltaLocked(&v, now) && m.relay() {
			m.enqueue(&uniqueBroadcast{msg: b})
		}
	case fullReq:
		m.handleFullReqLocked(v)
	case stateWithSummary:
		// Declarations first (they decide the owner), then the copy, then
		// the state, which then finds the copy it describes.
		m.declareLocked(&v.State)
		m.handleFullLocked(&v.State, full, now)
		m.handleStateLocked(&v.State, now)
	}
}

// handleStateLocked applies a state; it reports whether it was new (and
// so should be re-broadcast).
func (m *Mesh) handleStateLocked(st *stateMsg, now time.Time) bool {
	if st.Origin == m.cfg.Name {
		return false
	}
	key := st.Origin + "\x00" + st.Replica
	if s, ok := m.stateSeen[key]; ok && (st.Boot < s.boot || st.Boot == s.boot && st.Seq <= s.seq) {
		m.met.dropped.WithLabelValues(dropDuplicate).Inc()
		return false
	}
	if len(m.stateSeen) >= maxOrigins*16 {
		clear(m.stateSeen) // bounded memory; states only get re-accepted
	}
	m.stateSeen[key] = seenState{st.Boot, st.Seq}
	r := m.declareLocked(st)
	if r == nil {
		m.met.dropped.WithLabelValues(dropRefused).Inc()
		return false
	}
	owner := m.ownerLocked(r)
	if !st.Owned {
		return true
	}
	if owner == m.cfg.Name {
		// We own it by our view. If ours is an empty fresh summary and the
		// other router has history (we just started, it held the replica
		// meanwhile), adopt its copy rather than erase it.
		if r.sum != nil && r.sum.Version() == 0 && st.Version > 0 {
			m.requestFullLocked(r, st.Origin, now, "adopting history of a previous owner")
		}
		return true
	}
	if owner != st.Origin {
		return true // a stale claim; ownership moved on
	}
	m.setOwnedLocked(r, false)
	r.st, r.hasState, r.heard = *st, true, now
	if r.sum == nil || r.sum.Epoch() != st.Epoch {
		m.requestFullLocked(r, owner, now, "no copy of the owner's epoch")
	} else {
		m.drainLocked(r)
		m.checkSyncLocked(r, now)
	}
	return true
}

// checkSyncLocked compares a copy with the owner's last state: versions
// that stay apart too long, or a digest that differs at equal versions,
// make the copy ask for a full one.
func (m *Mesh) checkSyncLocked(r *replica, now time.Time) {
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
		// unlockAndRun); the job re-checks that nothing moved meanwhile.
		m.post.verify = append(m.post.verify, verifyJob{r: r, sum: r.sum, version: v, want: r.st.Digest})
	}
}

// digestOf hashes the encoded summary; ok is false when an insert raced
// the encoding (the version moved).
func digestOf(s *summary.Summary, fp uint64) (uint64, bool) {
	v := s.Version()
	b := s.AppendEncode(nil, fp)
	if s.Version() != v {
		return 0, false
	}
	return xxh3.Hash(b) | 1, true // never 0, which means "unknown"
}

func (m *Mesh) requestFullLocked(r *replica, from string, now time.Time, why string) {
	r.wantFull = true
	if now.Sub(r.lastFullReq) < max(4*m.cfg.Timing.StateInterval, 200*time.Millisecond) {
		return
	}
	r.lastFullReq = now
	m.met.resyncs.Inc()
	m.log.Debug("requesting full summary", "replica", r.id, "from", from, "reason", why)
	m.send(from, fullReq{Origin: m.cfg.Name, Replica: r.id}.append(nil))
}

func (m *Mesh) acceptDeltaLocked(d *deltaMsg) bool {
	w := m.deltaSeen[d.Origin]
	if w == nil || d.Boot > w.boot {
		if w == nil && len(m.deltaSeen) >= maxOrigins {
			clear(m.deltaSeen)
		}
		w = &window{boot: d.Boot, seen: map[uint64]struct{}{}}
		m.deltaSeen[d.Origin] = w
	}
	if d.Boot < w.boot || d.Seq+dedupeWindow < w.max {
		return false
	}
	if _, ok := w.seen[d.Seq]; ok {
		return false
	}
	w.seen[d.Seq] = struct{}{}
	w.max = max(w.max, d.Seq)
	if len(w.seen) > 2*dedupeWindow {
		for s := range w.seen {
			if s+dedupeWindow < w.max {
				delete(w.seen, s)
			}
		}
	}
	return true
}

// handleDeltaLocked applies a delta to the copy; it reports whether the
// delta was new (and so should be re-broadcast).
func (m *Mesh) handleDeltaLocked(d *deltaMsg, now time.Time) bool {
	if d.Origin == m.cfg.Name {
		return false
	}
	if !m.acceptDeltaLocked(d) {
		m.met.dropped.WithLabelValues(dropDuplicate).Inc()
		return false
	}
	r := m.replicas[d.Replica]
	if r == nil || r.owned || m.ownerLocked(r) != d.Origin {
		return true
	}
	r.heard = now
	switch {
	case r.sum == nil:
		m.requestFullLocked(r, d.Origin, now, "delta without a copy")
	case r.sum.Epoch() != d.Epoch:
		if r.hasState && r.st.Epoch == d.Epoch {
			m.requestFullLocked(r, d.Origin, now, "copy of an old epoch")
		}
	default:
		m.applyLocked(r, *d, now)
		m.drainLocked(r)
		m.checkSyncLocked(r, now)
	}
	return true
}

func (m *Mesh) applyLocked(r *replica, d deltaMsg, now time.Time) {
	switch err := r.sum.Apply(d.Epoch, d.From, d.Hashes); {
	case err == nil:
	case errors.Is(err, summary.ErrGap):
		// Deltas arrive in any order: keep it until the ones before it
		// come, or a state shows the copy stays behind.
		if len(r.pend) < maxPending {
			r.pend = append(r.pend, d)
		}
	default:
		m.requestFullLocked(r, d.Origin, now, err.Error())
	}
}

// drainLocked applies kept deltas that now follow the copy.
func (m *Mesh) drainLocked(r *replica) {
	for progress := true; progress && len(r.pend) > 0; {
		progress = false
		v, e := r.sum.Version(), r.sum.Epoch()
		keep := r.pend[:0]
		for _, d := range r.pend {
			switch {
			case d.Epoch != e || d.From+uint64(len(d.Hashes)) <= v:
				// obsolete
			case d.From <= v:
				if err := r.sum.Apply(d.Epoch, d.From, d.Hashes); err != nil && !errors.Is(err, summary.ErrGap) {
					r.wantFull = true
				}
				progress = true
			default:
				keep = append(keep, d)
			}
		}
		r.pend = keep
	}
}

// decodeSummary decodes the summary of a full copy (nil when it carries
// none or it does not decode). It takes no lock.
func (m *Mesh) decodeSummary(f *stateWithSummary) *summary.Summary {
	if len(f.Summary) == 0 || f.State.Origin == m.cfg.Name {
		return nil
	}
	s, err := summary.Decode(f.Summary, m.fp)
	if err != nil {
		m.met.dropped.WithLabelValues(dropDecode).Inc()
		m.log.Warn("undecodable full summary", "replica", f.State.Replica, "from", f.State.Origin, "error", err)
		return nil
	}
	return s
}

// handleFullLocked installs a full copy s (decoded by decodeSummary) from
// the owner, or adopts one from the previous owner when ours is fresh and
// empty.
func (m *Mesh) handleFullLocked(st *stateMsg, s *summary.Summary, now time.Time) {
	if s == nil || st.Origin == m.cfg.Name {
		return
	}
	r := m.replicas[st.Replica]
	if r == nil {
		return
	}
	owner := m.ownerLocked(r)
	switch {
	case owner == m.cfg.Name && r.owned && r.sum != nil && r.sum.Version() == 0 && s.Version() > 0:
		m.log.Info("adopting summary of a previous owner", "replica", r.id, "from", st.Origin, "epoch", s.Epoch(), "version", s.Version())
		r.sum, r.lastSent, r.wantFull = s, s.Version(), false
		return
	case owner != st.Origin || r.owned:
		m.met.dropped.WithLabelValues(dropRefused).Inc()
		return
	}
	if r.sum == nil || r.wantFull || r.sum.Epoch() != s.Epoch() || s.Version() >= r.sum.Version() {
		r.sum, r.wantFull, r.verified, r.mismatchSince = s, false, 0, time.Time{}
		r.heard = now
		m.drainLocked(r)
		m.checkSyncLocked(r, now)
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

// fullReplyJob encodes a full copy for a peer, off the lock.
type fullReplyJob struct {
	to  string
	st  stateMsg
	sum *summary.Summary
}

// postLock is work found under the lock that encodes or hashes a whole
// summary: it runs after the lock is released, so readers never wait on
// it.
type postLock struct {
	verify  []verifyJob
	digests []ownerDigestJob
	replies []fullReplyJob
}

// unlockAndRun releases m.mu and runs the work queued under it.
func (m *Mesh) unlockAndRun() {
	p := m.post
	m.post = postLock{}
	m.mu.Unlock()
	if len(p.verify)+len(p.digests)+len(p.replies) == 0 {
		return
	}
	for _, j := range p.replies {
		msg := appendStateWithSummary([]byte{kindFullReply}, &j.st, j.sum.AppendEncode(nil, m.fp))
		m.send(j.to, msg)
	}
	type result struct {
		d  uint64
		ok bool
	}
	vr := make([]result, len(p.verify))
	for i, j := range p.verify {
		d, ok := digestOf(j.sum, m.fp)
		vr[i] = result{d, ok && j.sum.Version() == j.version}
	}
	dr := make([]result, len(p.digests))
	for i, j := range p.digests {
		d, ok := digestOf(j.sum, m.fp)
		dr[i] = result{d, ok && j.sum.Version() == j.version}
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, j := range p.verify {
		r := j.r
		if !vr[i].ok || r.sum != j.sum || r.owned || !r.hasState || r.st.Version != j.version || r.st.Digest != j.want {
			continue // moved on meanwhile; the next state checks again
		}
		if vr[i].d != j.want {
			m.requestFullLocked(r, r.st.Origin, now, "copy diverged (digest differs at equal version)")
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
