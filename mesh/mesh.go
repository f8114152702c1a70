// Package mesh is kvmesh's membership and gossip layer over
// hashicorp/memberlist. Each router declares its replicas; the mesh agrees
// on one owner per replica (rendezvous hashing over the live routers that
// declare it), and the owner is the only writer of the replica's summary.
//
// memberlist does membership and failure detection. Dissemination is the
// mesh's own: every tick, an owner cuts each owned summary's new log
// entries into a compact delta (summary.AppendDelta, under 2 bytes per
// block at load) and sends each live peer one batch, over a reliable
// stream, of the states (health, load, summary position; also the
// heartbeat) and deltas of the replicas it owns. Batches to a peer queue
// in order behind a bounded per-peer queue; a peer that cannot keep up, or
// whose stream failed, gets full copies instead, at a bounded rate, never
// a silent gap. A copy that sees a gap asks for a full copy too. Full
// summaries also travel in memberlist's push/pull state.
//
// The mesh is layered as serf is over memberlist, one type per concern:
//
//   - membership (membership.go, delegate.go): memberlist, its events,
//     joining and re-joining; the routers and their metadata, under a
//     lock of its own. It tells the table what ownership and the view
//     need of a router (alive, region, API, RTT).
//   - table (table.go, softstate.go): the replica records, who declares
//     each and who owns it (owner.go is the pure rule), under the lock
//     every write section takes. Owners are recomputed, and the view
//     republished, only for what a section changed.
//   - replication (copysync.go): the copy side, keeping this router's
//     copies of peers' summaries in step with their owners.
//   - dissemination (gossip.go, peers.go): the owner side, cutting each
//     owned summary's deltas every tick and queueing them to each peer.
//   - published (decview.go): the decision's compact view of the
//     replicas, under a lock of its own, which Candidates reads.
//
// Locks are taken in one order: the table's, then membership's, the
// view's queue or a peer's queue; membership's and the queues' are held
// for no other lock, and none of the mesh's while calling memberlist.
//
// Mesh composes them and is the surface the router and the proxy use
// (view.go: Candidates, Locate, Models, Record, Forget, Begin; debug.go:
// Members, Debug). wire.go holds the formats.
package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

const (
	inboxSize      = 4096
	repairSize     = 256
	maxReplicas    = 1 << 16
	maxPending     = 64   // out-of-order deltas kept per copy
	maxOrigins     = 4096 // origins remembered for dedupe
	declEveryTicks = 10   // a declaration-only state every this many ticks
	withdrawTicks  = 10   // ticks a withdrawal is repeated
	// defaultFailedPeerTimeout is Timing.FailedPeerTimeout's default.
	defaultFailedPeerTimeout = 30 * time.Minute
	udpBufferSize            = 1400
	// protocol names the dissemination protocol in the contract ID peers
	// compare: routers of protocol 1 (raw hashes on the broadcast queue,
	// summary encoding v1) cannot read these summaries.
	protocol = "-p2"
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
	// Wire is the highest gossip wire version the router decodes, as it
	// advertises it (wireversion.go): during a rolling upgrade, the routers
	// still on an older build show a lower one.
	Wire int `json:"wire_version"`
}

// env is what every part of the mesh reads and nothing changes after New:
// the configuration, logging, metrics, this incarnation's identity, and
// the lifetime of the goroutines.
type env struct {
	cfg  Config
	log  hclog.Logger
	met  *metrics
	fp   uint64
	wire wireVersion // what this router decodes and encodes at most (wireLatest)
	boot uint64
	seq  atomic.Uint64
	t0   time.Time // origin of the view's clock (viewEntry.heard)
	// beaconWake wakes the beacon loop (wakeBeacons); nil when it does
	// not run (beacons off, or a wire version without them).
	beaconWake chan struct{}

	ctx context.Context
	wg  sync.WaitGroup
}

// sleep waits d or until Close; it reports whether to go on.
func (e *env) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (e *env) nextHeader() header {
	return header{Origin: e.cfg.Name, Boot: e.boot, Seq: e.seq.Add(1)}
}

// Mesh is one router's membership in the mesh. It is safe for concurrent
// use. No part of it calls memberlist while holding one of its locks,
// because memberlist calls the mesh's delegates under its own locks.
type Mesh struct {
	*env
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeErr  error

	ml   *memberlist.Memberlist // mem's, for Close and the tests
	mem  *membership
	tab  *table
	rep  *replication
	dis  *dissemination
	view *published
}

// New creates the router's memberlist and starts the mesh's goroutines;
// Close stops them. Joining the seeds happens in the background, with
// retries: a router that reaches no seed still serves its own replicas.
func New(ctx context.Context, cfg Config) (*Mesh, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &env{cfg: cfg, log: cfg.Logger.Named("mesh"), fp: cfg.Contract.Fingerprint(),
		boot: uint64(time.Now().UnixNano()), t0: time.Now(), wire: wireLatest}
	if cfg.wire != nil {
		e.wire = min(*cfg.wire, wireLatest)
	}
	if cfg.Timing.LoadInterval > 0 && e.wire >= wireLoad {
		e.beaconWake = make(chan struct{}, 1)
	}
	// Before memberlist starts: its delegates may use the context at once.
	var cancel context.CancelFunc
	e.ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	m := compose(e)
	m.cancel = cancel

	if err := m.mem.start(m.rep); err != nil {
		cancel()
		return nil, err
	}
	m.ml = m.mem.ml
	m.log.Info("mesh started", "name", cfg.Name, "gossip", m.GossipAddr(), "contract", m.mem.contractID,
		"encrypted", cfg.SecretKey != nil)
	m.wg.Add(4)
	go m.rep.inboxLoop()
	go m.dis.repairLoop()
	go m.dis.tickLoop()
	go m.mem.joinLoop()
	if cfg.Usage != nil {
		m.wg.Add(1)
		go m.dis.usageLoop()
	}
	if e.beaconWake != nil {
		m.wg.Add(1)
		go m.dis.beaconLoop()
	}
	return m, nil
}

// compose builds the mesh's parts over e and registers its metrics;
// nothing runs until New starts memberlist and the goroutines.
func compose(e *env) *Mesh {
	m := &Mesh{env: e}
	m.mem = newMembership(e)
	m.view = newPublished(e)
	m.tab = newTable(e, m.view)
	m.dis = newDissemination(e, m.tab, m.mem)
	m.rep = newReplication(e, m.tab, m.dis)
	m.tab.rep, m.mem.tab, m.dis.rep = m.rep, m.tab, m.rep
	e.met = newMetrics(e.cfg.Registerer, func() float64 { return float64(m.mem.numAlive.Load()) },
		func() float64 { return float64(m.dis.queued.Load()) })
	return m
}

// Close leaves the mesh (bounded by ctx, or two seconds, and by the time
// the leave broadcast needs: leave.go) and shuts memberlist down; no
// goroutine of the mesh survives it. A leave no peer confirmed is logged,
// not returned: only a failing shutdown is an error.
func (m *Mesh) Close(ctx context.Context) error {
	m.closeOnce.Do(func() {
		m.cancel()
		m.wg.Wait()
		timeout := 2 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(dl), time.Millisecond)
		}
		m.leave(timeout) // heard or not, not an error (leave.go)
		var errs []error
		if err := m.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("mesh: shutdown: %w", err))
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// GossipAddr returns the bound gossip address "ip:port".
func (m *Mesh) GossipAddr() string { return m.ml.LocalNode().Address() }
