package mesh

// Per-peer dissemination: one ordered queue and one sender goroutine per
// live peer. Back-pressure is explicit: a peer whose queue would exceed
// maxPeerLag of batches (or maxPeerBytes), or whose stream failed, loses
// its queued batches and gets full copies of every owned replica instead,
// at most one round per fullEvery; until then it gets states only (the
// heartbeat, and the version its copy is behind). It never gets a delta
// after a gap it was not told about.

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

const (
	// maxPeerLag is how far, in time, a peer's queue may fall behind
	// before it is resynchronised with full copies: a copy that old is
	// worth less than a fresh one.
	maxPeerLag   = 2 * time.Second
	maxPeerBytes = 32 << 20
)

// Reasons for a full copy, the label of kvmesh_summary_full_copies_total.
const (
	fullOverflow  = "overflow"   // the peer's queue overflowed
	fullSendError = "send_error" // a stream to the peer failed
	fullRequest   = "request"    // the peer's copy asked (gap, divergence, new)
	fullCheaper   = "cheaper"    // the delta was larger than the summary
	fullLog       = "log"        // the owner's log no longer held the entries
	fullNewPeer   = "new_peer"   // a router joined (or came back)
)

// peer is one live peer's send queue.
type peer struct {
	name string
	wake chan struct{}
	stop context.CancelFunc

	mu     sync.Mutex // after d.tab.mu when both are held, never before
	node   memberlist.Node
	wire   wireVersion // what its batches are encoded at (peerWire)
	q      [][]byte
	qBytes int
	// handBack holds copies handed back to this peer's new incarnation
	// (softstate.go). They are not this router's own replicas, so no full
	// round or resynchronisation repeats them: they have a queue of their
	// own, sent first and cleared only when the peer goes.
	handBack [][]byte
	fullAll  bool            // every owned replica needs a full copy
	fullWhy  string          // why fullAll
	fullSome map[string]bool // replicas whose copies asked for a full one
	lastFull time.Time
	fresh    bool // no batch queued yet: send full states
	// usage is the latest tenant usage not yet sent (usage.go), sent
	// ahead of the batches; a newer one replaces it.
	usage []byte
}

// fullEvery is the least time between two rounds of full copies to one
// peer: the bounded rate of resynchronisation.
func (d *dissemination) fullEvery() time.Duration {
	return max(5*d.cfg.Timing.StateInterval, 250*time.Millisecond)
}

// maxPeerMsgs is maxPeerLag in batches.
func (d *dissemination) maxPeerMsgs() int {
	return max(int(maxPeerLag/d.cfg.Timing.StateInterval), 4)
}

// syncPeersLocked starts a sender for every live peer and stops those of
// peers gone; it returns the live ones.
func (d *dissemination) syncPeersLocked() []*peer {
	members := d.mem.peerNodes()
	for name, mb := range members {
		if name == d.cfg.Name {
			continue
		}
		p := d.peers[name]
		switch {
		case mb.alive && p == nil:
			ctx, cancel := context.WithCancel(d.ctx)
			p = &peer{name: name, wake: make(chan struct{}, 1), stop: cancel, node: mb.node, fullSome: map[string]bool{},
				fresh: true, fullAll: true, fullWhy: fullNewPeer, wire: peerWire(d.wire, mb.wire)}
			d.peers[name] = p
			d.wg.Add(1)
			go d.sendLoop(ctx, p)
		case mb.alive:
			p.mu.Lock()
			p.node, p.wire = mb.node, peerWire(d.wire, mb.wire)
			p.mu.Unlock()
		case p != nil:
			d.dropPeerLocked(p)
		}
	}
	out := make([]*peer, 0, len(d.peers))
	for name, p := range d.peers {
		if _, ok := members[name]; !ok {
			d.dropPeerLocked(p)
			continue
		}
		out = append(out, p)
	}
	return out
}

func (d *dissemination) dropPeerLocked(p *peer) {
	p.stop()
	p.mu.Lock()
	d.queued.Add(-int64(len(p.q) + len(p.handBack)))
	p.q, p.qBytes, p.handBack = nil, 0, nil
	p.mu.Unlock()
	delete(d.peers, p.name)
}

// handleFullReqLocked marks a replica's copy at the requesting peer for a
// full copy in a coming batch (bounded by fullEvery).
func (d *dissemination) handleFullReqLocked(f fullReq) {
	r, p := d.tab.replicas[f.Replica], d.peers[f.Origin]
	if r == nil || !r.owned || r.sum == nil || p == nil {
		return
	}
	p.mu.Lock()
	p.fullSome[r.id] = true
	p.mu.Unlock()
}

// entryEnc is one owned replica's share of a tick, encoded once and
// shared by every peer's batch.
type entryEnc struct {
	id     string
	stFull []byte      // the full state, whole
	need   wireVersion // the least version stFull is for (stateMsg.needs)
	// stOld holds the full state at each version below need, encoded
	// for the first peer of that version (stateFor).
	stOld   [wireLatest][]byte
	stSlim  []byte // the slim state (position only)
	delta   []byte // nil when nothing changed
	changed bool   // the full state goes to everyone
	fullAll bool   // no usable delta this tick: every peer gets full
	full    []byte // the full summary, encoded when a peer needs it
	c       *cut
}

// stateFor is the full state as a peer of version v is to read it.
func (e *entryEnc) stateFor(d *dissemination, v wireVersion) []byte {
	if v >= e.need {
		return e.stFull
	}
	if e.stOld[v] == nil {
		st := e.c.st.at(v)
		e.stOld[v] = d.encodeState(make([]byte, 0, len(e.stFull)), &st) // at most as long
	}
	return e.stOld[v]
}

// entry assembles the entry a peer gets.
func (e *entryEnc) entry(d *dissemination, dst []byte, p *peer, wantFull string, due bool) []byte {
	st := e.stSlim
	if e.changed || p.fresh {
		st = e.stateFor(d, p.wire)
	}
	switch {
	case wantFull != "" && due:
		if e.full == nil {
			e.full = e.c.sum.AppendEncode(nil, d.fp)
		}
		return appendEntryRaw(dst, e.stateFor(d, p.wire), payloadFull, e.full)
	case wantFull != "":
		return appendEntryRaw(dst, st, payloadNone, nil)
	case e.delta != nil:
		return appendEntryRaw(dst, st, payloadDelta, e.delta)
	case e.changed || p.fresh:
		return appendEntryRaw(dst, st, payloadNone, nil)
	}
	return dst // nothing to say this tick
}

// offer hands every live peer this tick's batch.
func (d *dissemination) offer(now time.Time, peers []*peer, cuts []cut, others []stateMsg) {
	encs := make([]entryEnc, len(cuts))
	for i := range cuts {
		c := &cuts[i]
		e := &encs[i]
		e.id, e.c, e.changed = c.r.id, c, c.changed
		e.stFull, e.need = d.encodeState(nil, &c.st), c.st.needs()
		slim := stateMsg{header: c.st.header, Replica: c.st.Replica, Owned: c.st.Owned, Healthy: c.st.Healthy,
			Slim: true, Epoch: c.st.Epoch, Version: c.st.Version}
		e.stSlim = slim.append(nil)
		switch {
		case !c.ok:
			e.fullAll = true
		case c.to != c.from:
			e.delta = c.delta
		}
	}
	// Declarations and withdrawals carry nothing a wire version added
	// (stateMsg.needs is wireBase for them), so one encoding serves every
	// peer; an addition they carry would take stateFor's way.
	var rest [][]byte
	for i := range others {
		rest = append(rest, appendEntryRaw(nil, d.encodeState(nil, &others[i]), payloadNone, nil))
	}
	limit := d.maxPeerMsgs()
	// A peer's entries are encoded into one buffer, reused for the next
	// peer once assemble has copied them into the peer's messages.
	var buf []byte
	var ends []int
	var parts [][]byte
	for _, p := range peers {
		p.mu.Lock()
		due := now.Sub(p.lastFull) >= d.fullEvery()
		buf, ends, parts = buf[:0], ends[:0], parts[:0]
		sent := 0
		for i := range encs {
			e := &encs[i]
			why := p.wantFull(e)
			n0 := len(buf)
			buf = e.entry(d, buf, p, why, due)
			if len(buf) == n0 {
				continue
			}
			switch {
			case why != "" && due:
				d.met.fullCopies.WithLabelValues(why).Inc()
				sent++
			case why == "" && e.delta != nil:
				d.met.deltaBytes.Add(float64(len(e.delta)))
				d.met.deltaEntries.Add(float64(e.c.to - e.c.from))
			}
			ends = append(ends, len(buf))
		}
		for k, end := range ends {
			start := 0
			if k > 0 {
				start = ends[k-1]
			}
			parts = append(parts, buf[start:end])
		}
		if sent > 0 {
			if p.fullAll {
				// Every replica is in this round: older batches are moot.
				d.queued.Add(-int64(len(p.q)))
				p.q, p.qBytes = nil, 0
			}
			p.fullAll, p.fullWhy, p.lastFull = false, "", now
			clear(p.fullSome)
		}
		parts = append(parts, rest...)
		msgs := d.assemble(parts)
		if n := msgBytes(msgs); sent == 0 && (len(p.q)+len(msgs) > limit || p.qBytes+n > maxPeerBytes) {
			// The peer is not keeping up: drop what it has not taken, tell
			// it where we are (states), and resynchronise it with full
			// copies at the bounded rate.
			d.log.Debug("peer not keeping up; resynchronising with full copies", "peer", p.name, "queued", len(p.q))
			d.queued.Add(-int64(len(p.q)))
			p.q, p.qBytes = nil, 0
			p.fullAll, p.fullWhy = true, fullOverflow
			parts = parts[:0]
			for i := range encs {
				if b := encs[i].entry(d, nil, p, fullOverflow, false); len(b) > 0 {
					parts = append(parts, b)
				}
			}
			msgs = d.assemble(append(parts, rest...))
		}
		if len(msgs) > 0 {
			p.fresh = false
		}
		p.q = append(p.q, msgs...)
		p.qBytes += msgBytes(msgs)
		d.queued.Add(int64(len(msgs)))
		p.mu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// wantFull says why the peer needs a full copy of e, or "".
func (p *peer) wantFull(e *entryEnc) string {
	switch {
	case p.fullAll:
		return p.fullWhy
	case p.fullSome[e.id]:
		return fullRequest
	case e.fullAll && e.c.cheaper:
		return fullCheaper
	case e.fullAll:
		return fullLog
	}
	return ""
}

// assemble packs encoded entries into batch messages under maxBatchBytes
// and maxBatchEntries each; no entries, no message. Each message is
// allocated once, at its size: appended to as it grew, the messages of a
// tick (a peer's each, every tick) were a third of a router's allocation
// under load (the scale harness's profile), and half of it garbage.
func (d *dissemination) assemble(parts [][]byte) [][]byte {
	var msgs [][]byte
	for i := 0; i < len(parts); {
		h := d.nextHeader()
		size := 1 + 1 + min(len(h.Origin), math.MaxUint8) + 8 + 8 + 2 // header.append (appendS8), then the count
		j := i
		for j < len(parts) && j-i < maxBatchEntries && (j == i || size+len(parts[j]) <= maxBatchBytes) {
			size += len(parts[j])
			j++
		}
		cur := h.append(make([]byte, 0, size), kindBatch)
		cur = binary.BigEndian.AppendUint16(cur, uint16(j-i))
		for _, b := range parts[i:j] {
			cur = append(cur, b...)
		}
		msgs = append(msgs, cur)
		i = j
	}
	return msgs
}

func msgBytes(msgs [][]byte) int {
	n := 0
	for _, b := range msgs {
		n += len(b)
	}
	return n
}

// sendLoop sends a peer's batches in order over reliable streams.
func (d *dissemination) sendLoop(ctx context.Context, p *peer) {
	defer d.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		for ctx.Err() == nil {
			p.mu.Lock()
			var msg []byte
			queued := true
			switch {
			case p.usage != nil:
				msg, p.usage, queued = p.usage, nil, false
			case len(p.handBack) > 0:
				msg = p.handBack[0]
				p.handBack[0] = nil
				p.handBack = p.handBack[1:]
			case len(p.q) > 0:
				msg = p.q[0]
				p.q[0] = nil
				p.q = p.q[1:]
				p.qBytes -= len(msg)
			default:
				p.mu.Unlock()
			}
			if msg == nil {
				break
			}
			node := p.node
			if queued {
				d.queued.Add(-1)
			}
			p.mu.Unlock()
			if err := d.mem.ml.SendReliable(&node, msg); err != nil {
				d.log.Debug("batch send failed; the peer will get full copies", "peer", p.name, "error", err)
				p.mu.Lock()
				d.queued.Add(-int64(len(p.q)))
				p.q, p.qBytes = nil, 0
				p.fullAll, p.fullWhy = true, fullSendError
				p.mu.Unlock()
				break
			}
			d.met.out(msg[0], len(msg))
		}
	}
}
