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
// Files: membership.go (memberlist adapter, lifecycle, declarations),
// owner.go (the pure ownership rule), gossip.go (the owner side of a
// tick), peers.go (per-peer queues and streams), copysync.go (the copy
// side), view.go (what the proxy reads), decview.go (the decision's
// compact view of the replicas), wire.go (formats).
//
// Mesh implements the view the proxy reads (Candidates, Locate, Models,
// Record, Forget, Begin).
package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/summary"
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
	// advertises it (wire.go): during a rolling upgrade, the routers
	// still on an older build show a lower one.
	Wire int `json:"wire_version"`
}

type member struct {
	node     memberlist.Node // a copy: memberlist mutates its own under its lock
	meta     nodeMeta
	wire     wireVersion // the highest it decodes, as it last advertised (delegate.go)
	alive    bool
	failedAt time.Time
	rtt      time.Duration
}

// replica is everything this router knows of one replica.
type replica struct {
	id   string
	idh  unique.Handle[string] // keeps id the process's one copy (replicaLocked)
	hash uint64

	// Local declaration and the proxy's health checks.
	declared bool
	models   []string
	healthy  bool
	capacity int
	// The engine's load from the last health check (see ReplicaStatus).
	running, waiting, slots int
	hasLoad                 bool
	load                    *replicaLoad // the requests in flight here (Begin)

	declarers map[string]bool // routers known to declare it
	// Soft state of the peers' declarations (softstate.go): when each
	// declarer last asserted it itself, and the owner boot this router's
	// copy was handed back to.
	declHeard  map[string]time.Time
	handedBack uint64
	hb         *handBack       // a hand-back in progress, if any
	withdrawn  map[string]bool // routers that withdrew it (their word beats hearsay)
	owner      string          // ownerOf, kept current by recomputeOwnersLocked
	ownerMb    *member         // members[owner] when another router owns it
	// ownerDirty: the declarers changed since owner was computed.
	ownerDirty bool
	withdrawT  int // ticks left to repeat this router's withdrawal

	// The owner's word, when another router owns it.
	st       stateMsg
	hasState bool
	heard    time.Time // last state or delta from the owner
	// loadAt is when the owner's last state (full or slim) came: its
	// load as of then, since an owner sends a full state whenever the
	// load changes and a slim one only when nothing but the summary's
	// position did.
	loadAt time.Time

	sum   *summary.Summary // the owner's own summary, or this router's copy
	owned bool             // this router is the writer

	// Owner side.
	lastSent  uint64 // version the last delta reached
	stateFP   uint64 // fingerprint of the last full state sent (see tick; tick's goroutine only)
	stateTick int    // tick of the last full state sent (same)
	digestVer uint64
	digest    uint64

	// Copy side.
	pend          []*summary.Delta // deltas that arrived before the ones they follow
	mismatchSince time.Time        // copy version differs from the owner's state
	verified      uint64           // version+1 whose digest matched
	wantFull      bool
	lastFullReq   time.Time

	// The decision's view (decview.go): the models whose arrays hold
	// this replica's entry as of the last build, where, and whether a
	// writer touched it since the entries were last published.
	viewModels []string
	viewAt     []viewSlot
	viewDirty  bool
}

type seenState struct{ boot, seq uint64 }

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
	wire       wireVersion // what this router decodes and encodes at most (wireLatest)
	boot       uint64
	seq        atomic.Uint64

	ml       *memberlist.Memberlist
	guard    *guardedTransport // nil with Config.Transport (transport.go)
	numAlive atomic.Int64
	inbox    chan []byte
	repairs  chan job
	queued   atomic.Int64 // batches waiting in peer queues

	mu        sync.RWMutex
	members   map[string]*member
	replicas  map[string]*replica
	order     []*replica // replicas sorted by ID (Candidates' order)
	dirty     bool       // every owner needs recomputing (see ownerLocked)
	dirtyReps []*replica // replicas whose owner needs recomputing
	stateSeen map[string]seenState
	refused   map[string]time.Time // last log line per refused peer
	peers     map[string]*peer     // live peers and their send queues
	ticks     int
	post      postLock      // work for after the lock, see unlockAndRun
	index     summary.Index // the summaries bit-sliced, for Candidates' matches (view.go)
	// The decision's view (decview.go) and the replicas whose entries
	// the write section in progress changed (or all: viewRebuild).
	view        decisionView
	viewDirty   []*replica
	viewRebuild bool
	viewUpd     []viewOp      // publishViewLocked's scratch, kept from section to section
	bufs        sync.Pool     // *CandidateBuffer lent by PooledCandidates
	loads       []replicaLoad // the slab newLoadLocked takes counters from
	t0          time.Time     // origin of the view's clock (viewEntry.heard)
	// declaredLoads is the load counters of the replicas declared here
	// (replica ID → *replicaLoad), written under mu with r.declared and
	// read by Begin without mu: the proxy books a request under its
	// placement lock (proxy/place.go), which must not wait for the
	// gossip's write sections.
	declaredLoads sync.Map
	// gone are the watchers of routers that left or failed (gonewatch.go).
	gone goneWatches

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
		cfg: cfg, log: cfg.Logger.Named("mesh"), fp: cfg.Contract.Fingerprint(), contractID: cfg.Contract.ID() + protocol,
		boot: uint64(time.Now().UnixNano()), t0: time.Now(),
		inbox:   make(chan []byte, inboxSize),
		repairs: make(chan job, repairSize),
		members: map[string]*member{}, replicas: map[string]*replica{},
		stateSeen: map[string]seenState{}, refused: map[string]time.Time{}, peers: map[string]*peer{},
	}
	m.wire = wireLatest
	if cfg.wire != nil {
		m.wire = min(*cfg.wire, wireLatest)
	}
	m.numAlive.Store(1)
	// Before memberlist starts: its delegates may use the context at once.
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.met = newMetrics(cfg.Registerer, func() float64 { return float64(m.numAlive.Load()) },
		func() float64 { return float64(m.queued.Load()) })

	meta := nodeMeta{Region: cfg.Region, API: cfg.APIAddr, Contract: m.contractID}.encode()
	if len(meta) > memberlist.MetaMaxSize {
		m.cancel()
		return nil, fmt.Errorf("mesh: node metadata is %d bytes, over memberlist's %d", len(meta), memberlist.MetaMaxSize)
	}

	mc, err := m.memberlistConfig()
	if err != nil {
		m.cancel()
		return nil, err
	}
	d := &delegate{m: m, meta: meta}
	mc.Delegate, mc.Events, mc.Alive, mc.Merge, mc.Ping = d, d, d, d, d
	ml, err := memberlist.Create(mc)
	if err != nil {
		if cfg.Transport == nil {
			_ = mc.Transport.Shutdown() // ours: release the sockets
		}
		m.cancel()
		return nil, fmt.Errorf("mesh: creating memberlist: %w", err)
	}
	m.ml = ml
	m.log.Info("mesh started", "name", cfg.Name, "gossip", m.GossipAddr(), "contract", m.contractID,
		"encrypted", cfg.SecretKey != nil)
	m.wg.Add(4)
	go m.inboxLoop()
	go m.repairLoop()
	go m.tickLoop()
	go m.joinLoop()
	return m, nil
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
