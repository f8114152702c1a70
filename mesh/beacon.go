package mesh

// Load beacons: when the load (in flight, pending prefill) of a replica
// it owns changes, an owner sends each peer the loads that changed since
// its last beacon, at most once per LoadInterval, in small UDP packets,
// best effort.
//
// Why: a peer's routers decide on a remote replica's load as of its
// owner's last state, which comes every StateInterval (200 ms on a LAN).
// Between two states they all see the replica that looked least loaded
// as still least loaded, and herd onto it (the simulator at 8 routers
// over 8 replicas, one each: states every 20 ms instead of 200 ms cut the
// cells lost to a single round-robin balancer from 41 to 32 of 100, and
// the network delay, 1 or 50 ms, changed nothing). The summaries' deltas
// do not need that pace; only the load does, and it is a few bytes per
// replica.
//
// A beacon is a hint over the states, never a replacement: it creates no
// replica, changes no declaration, ownership or summary, and is applied
// only to a replica whose owner's state this router holds from the same
// origin and boot. Its load and the state's are both numbered by the
// owner's one header counter (env.nextHeader, taken as each reads the
// load), so a copy keeps both and reads whichever the owner sent later
// (replica.remoteLoad): a state delayed behind a beacon does not set an
// older load back, and a slim state, which says the load is its last full
// state's, takes over from a beacon it follows. A beacon lost leaves the
// load as old as it was without beacons: the next beacon (the load moves
// on) or the next state (whose fingerprint includes the load) repairs it.
// Beacons never touch the stateSeen numbers the states and deltas are
// checked against.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/route"
)

const (
	// maxBeaconBytes bounds one beacon message. memberlist sends it as
	// one UDP packet (SendBestEffort), which must fit its UDPBufferSize
	// (udpBufferSize, 1,400 bytes) after its own framing: a message type
	// byte, a CRC (5 bytes), with a gossip key the encryption's version,
	// nonce and tag (29), and a label; and it stays under a 1,500-byte
	// MTU unfragmented.
	maxBeaconBytes = 1100
	// maxBeaconPackets bounds the packets one beacon tick sends each
	// peer: an owner of thousands of replicas whose loads all moved sends
	// the rest in the following ticks (beaconSender.after rotates where a
	// tick starts), rather than a burst that overruns the peers' receive
	// buffers. At URL-sized IDs a packet holds about 30 entries.
	maxBeaconPackets = 16
	// maxPendingMilli bounds a beacon's pending prefill, in thousandths
	// of a block, as the state's decoder bounds Pending (1e15 blocks).
	maxPendingMilli = 1e18
	// minLoadInterval is the shortest Timing.LoadInterval: each beacon
	// tick walks the table's replicas.
	minLoadInterval = time.Millisecond
)

// Outcomes of a beacon's entries, the label of
// kvmesh_load_beacon_entries_total.
const (
	beaconSent     = "sent"     // put in a beacon (once, whatever the peers)
	beaconDeferred = "deferred" // changed, left to a later tick by maxBeaconPackets
	beaconApplied  = "applied"  // newer than what the copy held: the view reads it
	beaconOld      = "old"      // not newer than the copy's last state or beacon
	beaconIgnored  = "ignored"  // unknown replica, another owner or boot, or no state
)

// loadEntry is one replica's load in a beacon. Replica aliases the
// decoded buffer.
type loadEntry struct {
	Replica  []byte
	InFlight uint32
	// PendingMilli is the pending prefill in thousandths of a block, as
	// the owner counts it (replicaLoad.pendingK): stateMsg.Pending × 1000.
	PendingMilli uint64
}

// loadMsg is a load beacon: its header numbers it with the owner's
// states (one counter), and every entry's load was read after the header
// was taken.
type loadMsg struct {
	header
	Entries []loadEntry
}

func (m *loadMsg) append(dst []byte) []byte {
	dst = m.header.append(dst, kindLoad)
	dst = binary.AppendUvarint(dst, uint64(len(m.Entries)))
	for _, e := range m.Entries {
		dst = appendLoadEntry(dst, string(e.Replica), e.InFlight, e.PendingMilli)
	}
	return dst
}

func appendLoadEntry(dst []byte, id string, inFlight uint32, milli uint64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(id)))
	dst = append(dst, id...)
	dst = binary.AppendUvarint(dst, uint64(inFlight))
	return binary.AppendUvarint(dst, milli)
}

// loadEntrySize is appendLoadEntry's length.
func loadEntrySize(id string, inFlight uint32, milli uint64) int {
	return uvarintLen(uint64(len(id))) + len(id) + uvarintLen(uint64(inFlight)) + uvarintLen(milli)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// uvarint reads a varint in its shortest form (one encoding per value:
// the format keeps no slack).
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	switch {
	case n <= 0:
		r.fail(errors.New("bad varint"))
		return 0
	case n > 1 && r.b[n-1] == 0:
		r.fail(errors.New("varint not in its shortest form"))
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) load() loadMsg {
	m := loadMsg{header: r.header()}
	n := r.uvarint()
	// Every entry takes at least 4 bytes, so n is bounded by the input.
	if r.err == nil && (n == 0 || n > uint64(len(r.b)/4)) {
		r.fail(fmt.Errorf("%d entries in %d bytes", n, len(r.b)))
	}
	if r.err == nil {
		m.Entries = make([]loadEntry, 0, n)
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		var e loadEntry
		l := r.uvarint()
		if r.err == nil && (l == 0 || l > maxReplicaIDLen) {
			r.fail(fmt.Errorf("entry %d: replica id of %d bytes", i, l))
		}
		e.Replica = r.take(int(l))
		f := r.uvarint()
		e.PendingMilli = r.uvarint()
		if r.err == nil && (f > math.MaxUint32 || e.PendingMilli > maxPendingMilli) {
			r.fail(fmt.Errorf("entry %d: in flight %d or pending %d out of range", i, f, e.PendingMilli))
		}
		e.InFlight = uint32(f)
		m.Entries = append(m.Entries, e)
	}
	if r.err == nil && m.Origin == "" {
		r.fail(errors.New("empty origin"))
	}
	return m
}

// beaconLoad is a replica's load as its owner's last beacon applied here
// said it (the receiving side).
type beaconLoad struct {
	boot, seq uint64
	inFlight  uint32
	pending   float64
	at        time.Time // when it came (LoadHeard)
}

// beaconMark is the load of an owned replica as the last beacon carried
// it (the sending side: the beacon loop reads and writes it under the
// table's read lock, which no other reader of it takes; setOwnedLocked
// clears it under the write lock).
type beaconMark struct {
	inFlight uint32
	milli    uint64
	ok       bool
}

// remoteLoad is the owner's latest word on the load of r, a replica
// another router owns: its last state's (full, or slim, which repeats
// the full one's), or its last beacon's when the owner numbered that
// later, and when it came.
func (r *replica) remoteLoad() (inFlight uint32, pending float64, at time.Time) {
	if b := &r.beacon; b.boot == r.st.Boot && b.seq > r.st.Seq {
		return b.inFlight, b.pending, b.at
	}
	return r.st.InFlight, r.st.Pending, r.loadAt
}

// beaconLoop sends the load beacons: it sleeps until a load changes
// (wakeBeacons), then sends what changed, at most once per LoadInterval.
// A wake that comes within an interval of the last tick waits out the
// rest of it and then sends everything changed since, so a burst of
// changes costs one tick, not one each. An idle owner's loop does
// nothing at all: no header, no peer list, no walk of the table (the
// ticker it replaces ran all three every interval).
//
// No change is lost: each change stores the count before it signals, and
// the loop takes the signal before it reads the counts, so a change the
// tick read too early to see leaves a signal for the next tick (at worst
// a tick that finds nothing new). The one-slot channel folds every
// signal that comes meanwhile into one.
func (d *dissemination) beaconLoop() {
	defer d.wg.Done()
	pause := d.cfg.beaconPause
	if pause == nil {
		p := &pauseTimer{ctx: d.ctx}
		defer p.stop()
		pause = p.pause
	}
	var s beaconSender
	var last time.Time // the last tick's start; zero before the first
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.beaconWake:
		}
		if !last.IsZero() {
			if rest := d.cfg.Timing.LoadInterval - time.Since(last); rest > 0 && !pause(rest) {
				return
			}
		}
		last = time.Now()
		if d.beaconTick(&s) {
			// Left out by maxBeaconPackets: the next interval sends them.
			wakeBeacons(d.beaconWake)
		}
	}
}

// wakeBeacons tells the beacon loop that an owned replica's load may
// have changed, without blocking or allocating: a full channel already
// holds a wake that the loop has not taken, and a nil one (beacons off)
// takes none. The request path calls it (Begin and its ends).
func wakeBeacons(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// pauseTimer is the beacon loop's wait for the rest of an interval, on
// one timer it reuses rather than one per wait.
type pauseTimer struct {
	ctx context.Context
	t   *time.Timer
}

// pause waits d or until Close; it reports whether to go on.
func (p *pauseTimer) pause(d time.Duration) bool {
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d) // Go 1.23 timers: no stale tick to drain
	}
	select {
	case <-p.ctx.Done():
		return false
	case <-p.t.C:
		return true
	}
}

func (p *pauseTimer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}

// beaconSender is the beacon loop's state from tick to tick.
type beaconSender struct {
	// after is where the next tick's walk starts (past this replica ID):
	// the replicas a bounded tick left out go first in the next.
	after string
	peers []memberlist.Node
	outs  []beaconOut
	ends  []int // each packet's end in outs
	msgs  [][]byte
}

// beaconOut is one owned replica's load for the packets of a tick.
type beaconOut struct {
	id       string
	inFlight uint32
	milli    uint64
}

// beaconTick sends every peer that reads beacons the loads that changed;
// it reports whether it left some out (maxBeaconPackets). The table's
// lock is held (for reading) only to read them. With no peer it reads
// nothing: the changes wait for the next tick, which a peer's coming
// wakes (membership.upsert).
func (d *dissemination) beaconTick(s *beaconSender) (deferred bool) {
	d.beaconTicks.Add(1)
	s.peers = beaconPeers(d.mem, d.wire, s.peers[:0])
	if len(s.peers) == 0 {
		return false
	}
	h, deferred := d.collectLoads(s)
	s.msgs = encodeBeacons(s.msgs[:0], h, s.outs, s.ends)
	for i := range s.peers {
		node := &s.peers[i]
		for _, b := range s.msgs {
			if err := d.mem.ml.SendBestEffort(node, b); err != nil {
				d.log.Debug("load beacon not sent", "peer", node.Name, "error", err)
				break
			}
			d.met.out(kindLoad, len(b))
		}
	}
	return deferred
}

// beaconPeers appends the nodes of the live peers that decode beacons
// (wireLoad or later; an older router is sent none).
func beaconPeers(mem *membership, self wireVersion, dst []memberlist.Node) []memberlist.Node {
	mem.mu.RLock()
	defer mem.mu.RUnlock()
	for name, mb := range mem.members {
		if mb.alive && name != mem.cfg.Name && peerWire(self, mb.wire) >= wireLoad {
			dst = append(dst, mb.node)
		}
	}
	return dst
}

// collectLoads takes the tick's header and reads, after it, the loads of
// the owned replicas that changed since the last beacon, into s.outs cut
// into packets (s.ends) of maxBeaconBytes, at most maxBeaconPackets. It
// holds the table's read lock: a tick's states take their headers and
// loads under the write lock, so one counter orders both. It reports
// whether it left changed loads out.
func (d *dissemination) collectLoads(s *beaconSender) (header, bool) {
	s.outs, s.ends = s.outs[:0], s.ends[:0]
	sent, deferred := 0, 0
	d.tab.mu.RLock()
	h := d.nextHeader()
	hdr := beaconHeaderSize(h)
	size := hdr
	order := d.tab.order
	start, found := slices.BinarySearchFunc(order, s.after, func(r *replica, id string) int { return strings.Compare(r.id, id) })
	if found {
		start++
	}
	full, last := false, ""
	for k := range order {
		r := order[(start+k)%len(order)]
		if !r.owned || r.sum == nil {
			// What ownedStateLocked carries no load of; a replica
			// owned again starts from no mark (written only when set:
			// a copy's record is not dirtied every tick).
			if r.beaconed.ok {
				r.beaconed = beaconMark{}
			}
			continue
		}
		o := beaconOut{id: r.id, inFlight: uint32(min(max(r.load.inFlight.Load(), 0), math.MaxUint32)),
			milli: uint64(max(r.load.pendingK.Load(), 0))}
		if m := r.beaconed; m.ok && m.inFlight == o.inFlight && m.milli == o.milli {
			continue
		}
		if full {
			deferred++
			continue
		}
		n := loadEntrySize(o.id, o.inFlight, o.milli)
		if size+n > maxBeaconBytes && size > hdr {
			s.ends = append(s.ends, len(s.outs))
			size = hdr
			if len(s.ends) == maxBeaconPackets {
				full = true
				deferred++
				continue
			}
		}
		size += n
		s.outs = append(s.outs, o)
		r.beaconed = beaconMark{inFlight: o.inFlight, milli: o.milli, ok: true}
		last = r.id
		sent++
	}
	d.tab.mu.RUnlock()
	if size > hdr {
		s.ends = append(s.ends, len(s.outs))
	}
	if full {
		s.after = last // the next tick starts with those left out
	}
	if sent > 0 {
		d.met.beacons.WithLabelValues(beaconSent).Add(float64(sent))
	}
	if deferred > 0 {
		d.met.beacons.WithLabelValues(beaconDeferred).Add(float64(deferred))
	}
	return h, full
}

// beaconHeaderSize is a beacon's length before its entries, with a
// count of up to two varint bytes (a packet holds under 2^14 entries).
func beaconHeaderSize(h header) int {
	return 1 + 1 + min(len(h.Origin), math.MaxUint8) + 8 + 8 + 2
}

// encodeBeacons appends to dst the packets of outs cut at ends, each
// allocated at its size.
func encodeBeacons(dst [][]byte, h header, outs []beaconOut, ends []int) [][]byte {
	from := 0
	for _, end := range ends {
		size := beaconHeaderSize(h)
		for _, o := range outs[from:end] {
			size += loadEntrySize(o.id, o.inFlight, o.milli)
		}
		b := h.append(make([]byte, 0, size), kindLoad)
		b = binary.AppendUvarint(b, uint64(end-from))
		for _, o := range outs[from:end] {
			b = appendLoadEntry(b, o.id, o.inFlight, o.milli)
		}
		dst = append(dst, b)
		from = end
	}
	return dst
}

// handleLoad applies a beacon: for each entry, the load of a replica
// whose owner's state this router holds from the beacon's origin and
// boot, when the owner numbered it after what the copy holds. It creates
// and declares nothing, and republishes only the entries whose load
// changed.
func (c *replication) handleLoad(m *loadMsg) {
	if m.Origin == c.cfg.Name {
		return
	}
	var n [3]int // applied, old, ignored
	now := time.Now()
	c.tab.mu.Lock()
	for i := range m.Entries {
		n[c.applyLoadLocked(m.header, &m.Entries[i], now)]++
	}
	c.tab.unlock()
	for i, o := range [3]string{beaconApplied, beaconOld, beaconIgnored} {
		if n[i] > 0 {
			c.met.beacons.WithLabelValues(o).Add(float64(n[i]))
		}
	}
}

// applyLoadLocked applies one entry of beacon h; it returns 0 (applied),
// 1 (old) or 2 (ignored).
func (c *replication) applyLoadLocked(h header, e *loadEntry, now time.Time) int {
	r := c.tab.replicas[string(e.Replica)]
	if r == nil || r.owned || !r.hasState || r.st.Origin != h.Origin || r.st.Boot != h.Boot ||
		c.tab.ownerLocked(r) != h.Origin {
		return 2
	}
	if h.Seq <= r.st.Seq || (r.beacon.boot == h.Boot && h.Seq <= r.beacon.seq) {
		return 1
	}
	f0, p0, _ := r.remoteLoad()
	r.beacon = beaconLoad{boot: h.Boot, seq: h.Seq, inFlight: e.InFlight, pending: float64(e.PendingMilli) / 1000, at: now}
	if f1, p1, _ := r.remoteLoad(); f1 != f0 || p1 != p0 {
		c.tab.touchLocked(r)
	}
	return 0
}

// remoteCounts is r's remote load as a view entry keeps it.
func remoteCounts(r *replica) (int32, float64) {
	f, p, _ := r.remoteLoad()
	return route.Count32(int(f)), p
}
