// Package mesh is kvmesh's membership and gossip layer over
// hashicorp/memberlist. Each router declares its replicas; the mesh agrees
// on one owner per replica (rendezvous hashing over the live routers that
// declare it), and the owner is the only writer of the replica's summary.
// Owners gossip each replica's state (health, load, summary position; it is
// also the heartbeat) and the summary's new inserts as memberlist user
// broadcasts; receivers re-broadcast what they have not seen, because
// memberlist does not. Full summaries travel in push/pull state and, on
// demand, as reliable direct messages when a copy misses a delta: a gap is
// repaired by a full copy, never guessed.
//
// Mesh implements the view the proxy reads (Candidates, Locate, Models,
// Record, Begin).
package mesh

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

const (
	inboxSize      = 4096
	repairSize     = 256
	maxQueued      = 4096 // broadcasts kept before the oldest are pruned
	maxReplicas    = 1 << 16
	maxPending     = 64   // out-of-order deltas kept per copy
	dedupeWindow   = 4096 // delta sequence numbers remembered per origin
	maxOrigins     = 4096 // origins remembered for dedupe
	declEveryTicks = 10   // a declaration-only state every this many ticks
	failedPeerTTL  = 30 * time.Minute
	udpBufferSize  = 1400
	encryptOverhd  = 29 // AES-GCM: version + nonce + tag (memberlist ≥ v2 protocol)
	packetOverhead = 5  // compound header (2) + user-message framing (3), see memberlist GetBroadcasts
)

// MemberInfo describes one router of the mesh.
type MemberInfo struct {
	Name   string  `json:"name"`
	Region string  `json:"region"`
	API    string  `json:"api"`
	Addr   string  `json:"addr"`
	State  string  `json:"state"` // "alive" or "failed"
	RTTMs  float64 `json:"rtt_ms"`
	Self   bool    `json:"self"`
}

type member struct {
	node     memberlist.Node // a copy: memberlist mutates its own under its lock
	meta     nodeMeta
	alive    bool
	failedAt time.Time
	rtt      time.Duration
}

// replica is everything this router knows of one replica.
type replica struct {
	id   string
	hash uint64

	// Local declaration and the proxy's health checks.
	declared bool
	models   []string
	healthy  bool
	capacity int
	inFlight atomic.Int64
	pendingK atomic.Int64 // pending prefill blocks × 1000

	declarers map[string]bool // routers known to declare it

	// The owner's word, when another router owns it.
	st       stateMsg
	hasState bool
	heard    time.Time // last state or delta from the owner

	sum   *summary.Summary // the owner's own summary, or this router's copy
	owned bool             // this router is the writer

	// Owner side.
	lastSent  uint64
	digestVer uint64
	digest    uint64

	// Copy side.
	pend          []deltaMsg // deltas that arrived before the ones they follow
	mismatchSince time.Time  // copy version differs from the owner's state
	verified      uint64     // version+1 whose digest matched
	wantFull      bool
	lastFullReq   time.Time
}

type seenState struct{ boot, seq uint64 }

type window struct {
	boot, max uint64
	seen      map[uint64]struct{}
}

type job struct {
	to  string
	msg []byte
}

// Mesh is one router's membership in the mesh. It is safe for concurrent
// use. Its methods never call memberlist while holding its own lock,
// because memberlist calls the mesh's delegates under its own locks.
type Mesh struct {
	cfg        Config
	log        hclog.Logger
	met        *metrics
	fp         uint64
	contractID string
	boot       uint64
	seq        atomic.Uint64
	maxMsg     int

	queue    *memberlist.TransmitLimitedQueue
	ml       *memberlist.Memberlist
	numAlive atomic.Int64
	// fanout is memberlist's GossipNodes: the peers each gossip tick
	// reaches.
	fanout  int
	inbox   chan []byte
	repairs chan job

	mu        sync.RWMutex
	members   map[string]*member
	replicas  map[string]*replica
	stateSeen map[string]seenState
	deltaSeen map[string]*window
	refused   map[string]time.Time // last log line per refused peer
	ticks     int

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New creates the router's memberlist and starts the mesh's goroutines;
// Close stops them. Joining the seeds happens in the background, with
// retries: a router that reaches no seed still serves its own replicas.
func New(ctx context.Context, cfg Config) (*Mesh, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Mesh{
		cfg: cfg, log: cfg.Logger.Named("mesh"), fp: cfg.Contract.Fingerprint(), contractID: cfg.Contract.ID(),
		boot:    uint64(time.Now().UnixNano()),
		inbox:   make(chan []byte, inboxSize),
		repairs: make(chan job, repairSize),
		members: map[string]*member{}, replicas: map[string]*replica{},
		stateSeen: map[string]seenState{}, deltaSeen: map[string]*window{}, refused: map[string]time.Time{},
	}
	m.maxMsg = udpBufferSize - packetOverhead
	if cfg.SecretKey != nil {
		m.maxMsg -= encryptOverhd
	}
	m.numAlive.Store(1)
	// The queue must work before Create: memberlist gossips right away.
	m.queue = &memberlist.TransmitLimitedQueue{NumNodes: func() int { return int(m.numAlive.Load()) }}
	m.met = newMetrics(cfg.Registerer, func() float64 { return float64(m.numAlive.Load()) },
		func() float64 { return float64(m.queue.NumQueued()) })

	meta := nodeMeta{Region: cfg.Region, API: cfg.APIAddr, Contract: m.contractID}.encode()
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("mesh: node metadata is %d bytes, over memberlist's %d", len(meta), memberlist.MetaMaxSize)
	}

	mc, err := m.memberlistConfig()
	if err != nil {
		return nil, err
	}
	m.queue.RetransmitMult = mc.RetransmitMult
	d := &delegate{m: m, meta: meta}
	mc.Delegate, mc.Events, mc.Alive, mc.Merge, mc.Ping = d, d, d, d, d
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("mesh: creating memberlist: %w", err)
	}
	m.ml = ml
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.log.Info("mesh started", "name", cfg.Name, "gossip", m.GossipAddr(), "contract", m.contractID,
		"encrypted", cfg.SecretKey != nil, "max_broadcast_bytes", m.maxMsg)
	m.wg.Add(4)
	go m.inboxLoop()
	go m.repairLoop()
	go m.tickLoop()
	go m.joinLoop()
	return m, nil
}

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
	m.fanout = mc.GossipNodes
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

// Close leaves the mesh (bounded by ctx, or two seconds) and shuts
// memberlist down; no goroutine of the mesh survives it.
func (m *Mesh) Close(ctx context.Context) error {
	m.closeOnce.Do(func() {
		m.cancel()
		m.wg.Wait()
		timeout := 2 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(dl), time.Millisecond)
		}
		var errs []error
		if err := m.ml.Leave(timeout); err != nil {
			errs = append(errs, fmt.Errorf("mesh: leave: %w", err))
		}
		if err := m.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("mesh: shutdown: %w", err))
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// GossipAddr returns the bound gossip address "ip:port".
func (m *Mesh) GossipAddr() string { return m.ml.LocalNode().Address() }

// joinLoop joins the seeds with backoff until one answers, then keeps
// re-joining failed peers (and the seeds, when alone): memberlist never
// re-joins a dead node by itself, so this is what heals a partition.
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
	for m.sleep(m.cfg.Timing.ReconnectInterval) {
		var addrs []string
		now := time.Now()
		m.mu.Lock()
		for name, mb := range m.members {
			if mb.alive {
				continue
			}
			if now.Sub(mb.failedAt) > failedPeerTTL {
				delete(m.members, name)
				continue
			}
			addrs = append(addrs, mb.node.Address())
		}
		m.mu.Unlock()
		rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
		addrs = addrs[:min(len(addrs), 3)]
		if m.ml.NumMembers() <= 1 {
			addrs = append(addrs, m.cfg.Join...)
		}
		if len(addrs) == 0 {
			continue
		}
		if n, err := m.ml.Join(addrs); n > 0 {
			m.log.Debug("reconnected", "addrs", addrs, "contacted", n)
		} else {
			m.log.Debug("reconnect failed", "addrs", addrs, "error", err)
		}
	}
}

// sleep waits d or until Close; it reports whether to go on.
func (m *Mesh) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (m *Mesh) nextHeader() header {
	return header{Origin: m.cfg.Name, Boot: m.boot, Seq: m.seq.Add(1)}
}

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
func (b *namedBroadcast) Name() string    { return b.name }
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}

// uniqueBroadcast never replaces another (a summary delta).
type uniqueBroadcast struct{ msg []byte }

func (b *uniqueBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b *uniqueBroadcast) UniqueBroadcast()                      {}
func (b *uniqueBroadcast) Message() []byte                       { return b.msg }
func (b *uniqueBroadcast) Finished()                             {}

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
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
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
		m.handleFullLocked(&v, now)
		m.handleStateLocked(&v.State, now)
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

func (m *Mesh) replicaLocked(id string, create bool) *replica {
	r := m.replicas[id]
	if r == nil && create && len(m.replicas) < maxReplicas && id != "" && len(id) <= maxReplicaIDLen {
		r = &replica{id: id, hash: route.HashID(id), declarers: map[string]bool{}}
		m.replicas[id] = r
	}
	return r
}

// liveLocked reports whether a router counts as alive.
func (m *Mesh) liveLocked(name string) bool {
	if name == m.cfg.Name {
		return true
	}
	mb := m.members[name]
	return mb != nil && mb.alive
}

// ownerLocked picks the owner of r: rendezvous hashing over the live
// routers that declare it; "" when none is alive.
func (m *Mesh) ownerLocked(r *replica) string {
	best, bestH := "", uint64(0)
	for d := range r.declarers {
		if !m.liveLocked(d) {
			continue
		}
		h := xxh3.HashString(d + "\x00" + r.id)
		if best == "" || h > bestH || (h == bestH && d < best) {
			best, bestH = d, h
		}
	}
	return best
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

// declareLocked learns who declares the replica a state names.
func (m *Mesh) declareLocked(st *stateMsg) *replica {
	if st.Origin == m.cfg.Name {
		return nil
	}
	r := m.replicaLocked(st.Replica, true)
	if r == nil {
		return nil
	}
	r.declarers[st.Origin] = true
	for _, d := range st.DeclaredBy {
		if d != "" && len(d) <= maxNameLen && len(r.declarers) < 64 {
			r.declarers[d] = true
		}
	}
	return r
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
		d, ok := digestOf(r.sum, m.fp)
		if ok && d != r.st.Digest {
			m.requestFullLocked(r, r.st.Origin, now, "copy diverged (digest differs at equal version)")
			return
		}
		if ok {
			r.verified = v + 1
		}
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

func (m *Mesh) handleFullReqLocked(f fullReq) {
	r := m.replicas[f.Replica]
	if r == nil || !r.owned || r.sum == nil {
		return
	}
	st := m.ownedStateLocked(r)
	msg := appendStateWithSummary([]byte{kindFullReply}, &st, r.sum.AppendEncode(nil, m.fp))
	m.send(f.Origin, msg)
}

// handleFullLocked installs a full copy from the owner (or adopts one
// from the previous owner when ours is fresh and empty).
func (m *Mesh) handleFullLocked(f *stateWithSummary, now time.Time) {
	if len(f.Summary) == 0 || f.State.Origin == m.cfg.Name {
		return
	}
	r := m.replicas[f.State.Replica]
	if r == nil {
		return
	}
	s, err := summary.Decode(f.Summary, m.fp)
	if err != nil {
		m.met.dropped.WithLabelValues(dropDecode).Inc()
		m.log.Warn("undecodable full summary", "replica", r.id, "from", f.State.Origin, "error", err)
		return
	}
	owner := m.ownerLocked(r)
	switch {
	case owner == m.cfg.Name && r.owned && r.sum != nil && r.sum.Version() == 0 && s.Version() > 0:
		m.log.Info("adopting summary of a previous owner", "replica", r.id, "from", f.State.Origin, "epoch", s.Epoch(), "version", s.Version())
		r.sum, r.lastSent, r.wantFull = s, s.Version(), false
		return
	case owner != f.State.Origin || r.owned:
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
	m.mu.Unlock()
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
	if r.digestVer != r.lastSent+1 {
		if d, ok := digestOf(r.sum, m.fp); ok && r.sum.Version() == r.lastSent {
			r.digest, r.digestVer = d, r.lastSent+1
		}
	}
	st := m.ownedStateLocked(r)
	m.enqueue(&namedBroadcast{name: stateName(m.cfg.Name, r.id), msg: m.encodeStateLocked(&st)})
}
