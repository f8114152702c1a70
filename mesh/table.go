package mesh

// The replica table: every replica this router knows, who declares it and
// who owns it, and what each write section changed. Ownership, the copy
// side (copysync.go) and the owner side (gossip.go) all change one
// replica's record together (a peer's state declares the replica, decides
// its owner and updates the copy in one step), so they share the table's
// lock; membership and the published view have locks of their own.

import (
	"slices"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

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
	engine   route.EngineLoad
	lora     route.LoRAs // the engine's LoRA adapters (ReplicaStatus.LoRA)
	restarts int         // the engine restarts its health checks found (ReplicaStatus)
	// role and bootstrap are the replica's part of disaggregated
	// requests and a prefill replica's bootstrap port (ReplicaStatus).
	role      route.Role
	bootstrap uint16
	load      *replicaLoad // the requests in flight here (Begin)

	declarers map[string]bool // routers known to declare it
	// Soft state of the peers' declarations (softstate.go): when each
	// declarer last asserted it itself, and the owner boot this router's
	// copy was handed back to.
	declHeard  map[string]time.Time
	handedBack uint64
	hb         *handBack       // a hand-back in progress, if any
	withdrawn  map[string]bool // routers that withdrew it (their word beats hearsay)
	owner      string          // ownerOf, kept current by recomputeOwnersLocked
	ownerMb    *router         // routers[owner] when another router owns it
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
	// beacon is the owner's last load beacon applied (beacon.go); the
	// view reads it over st's load when the owner sent it later
	// (remoteLoad).
	beacon beaconLoad

	sum   *summary.Summary // the owner's own summary, or this router's copy
	owned bool             // this router is the writer

	// Owner side.
	lastSent  uint64     // version the last delta reached
	stateFP   uint64     // fingerprint of the last full state sent (see tick; tick's goroutine only)
	stateTick int        // tick of the last full state sent (same)
	beaconed  beaconMark // the load the last beacon carried (the beacon loop's goroutine only)
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

// router is what the table keeps of a router, from membership's events:
// whether it is alive (ownership), and its metadata and RTT (Locate and
// the view's entries of the replicas it owns).
type router struct {
	alive bool
	meta  nodeMeta
	rtt   time.Duration
}

type seenState struct{ boot, seq uint64 }

// table is the replicas and their ownership. Every section that writes
// under mu ends with unlock, which recomputes the owners and republishes
// the view entries that section made stale, and nothing else.
type table struct {
	*env
	view *published   // where unlock publishes the touched entries
	rep  *replication // runs the work queued for after the lock

	// mu guards everything below, each replica's record, the
	// dissemination's peer set and tick count, and is taken before
	// published.pendMu and any peer's mu, never after.
	mu       sync.RWMutex
	replicas map[string]*replica
	order    []*replica // replicas sorted by ID (Candidates' order)
	routers  map[string]*router
	// dirtyReps: replicas whose owner may have changed (their declarers,
	// or the liveness of one of them: ownerLocked).
	dirtyReps []*replica
	// viewDirty lists the replicas whose entries the write section in
	// progress changed (touchLocked); viewRebuild, the arrays themselves.
	viewDirty   []*replica
	viewRebuild bool
	stateSeen   map[string]seenState
	post        postLock      // work for after the lock, see unlock
	loads       []replicaLoad // the slab newLoadLocked takes counters from
	// sections counts what unlock recomputed and published, for tests.
	sections sectionCounts

	// declaredLoads is the load counters of the replicas declared here
	// (replica ID → *replicaLoad), written under mu with r.declared and
	// read by Begin without mu: the proxy books a request under its
	// placement lock (proxy/place.go), which must not wait for the
	// gossip's write sections.
	declaredLoads sync.Map
}

// sectionCounts is how often unlock recomputed owners (one per replica)
// and queued view changes.
type sectionCounts struct {
	owners, publishes int
}

func newTable(e *env, v *published) *table {
	return &table{env: e, view: v, replicas: map[string]*replica{}, routers: map[string]*router{},
		stateSeen: map[string]seenState{}}
}

// unlock brings owners up to date (readers rely on it, see ownerLocked)
// and queues the touched replicas' view entries, when the section changed
// them; it releases mu, applies the queued view changes and runs the work
// queued under the lock. Every section that writes under mu ends with it.
func (t *table) unlock() {
	if len(t.dirtyReps) > 0 {
		t.recomputeOwnersLocked()
	}
	queued := t.view.publishLocked(t)
	if queued {
		t.sections.publishes++
	}
	p := t.post
	t.post = postLock{}
	t.mu.Unlock()
	if queued {
		t.view.drain()
	}
	if len(p.verify)+len(p.digests) > 0 {
		t.rep.afterUnlock(p)
	}
}

func (t *table) replicaLocked(id string, create bool) *replica {
	r := t.replicas[id]
	if r == nil && create && len(t.replicas) < maxReplicas && id != "" && len(id) <= maxReplicaIDLen {
		// The ID's one copy in the process (unique), as long as a
		// replica holds its handle: the routers of one process (the
		// scale harness, tests) then hand out the same string for a
		// replica, and a CandidateBuffer going from one router's view to
		// another's finds its Details' IDs already right (a string
		// written to the heap is a pointer for the write barrier while
		// the collector marks).
		h := unique.Make(id)
		id = h.Value()
		r = &replica{id: id, idh: h, hash: route.HashID(id), declarers: map[string]bool{}, declHeard: map[string]time.Time{},
			load: t.newLoadLocked()}
		t.replicas[id] = r
		i, _ := slices.BinarySearchFunc(t.order, id, func(x *replica, id string) int { return strings.Compare(x.id, id) })
		t.order = slices.Insert(t.order, i, r)
		t.markOwnerLocked(r)
	}
	return r
}

// newLoadLocked returns a replica's in-flight counters, taken from slabs
// of loadSlab: a decision reads the counters of every owned replica, and
// sixteen bytes each side by side are a few hundred cache lines read in
// order, where counters allocated one by one among the summaries' data
// would be a cache miss per replica. A slab lives while any of its
// replicas does.
func (t *table) newLoadLocked() *replicaLoad {
	if len(t.loads) == cap(t.loads) {
		t.loads = make([]replicaLoad, 0, loadSlab)
	}
	t.loads = t.loads[:len(t.loads)+1]
	return &t.loads[len(t.loads)-1]
}

// loadSlab is how many replicas' counters newLoadLocked allocates at once.
const loadSlab = 256

// setRouter records membership's word on a router: alive or not, and its
// metadata. A router new to the table, or one that came or went, may
// change the owners of the replicas it declares (an owner is one of the
// declarers, ownerOf), and no other; new metadata, the entries of the
// replicas it owns.
func (t *table) setRouter(name string, alive bool, meta nodeMeta) {
	t.mu.Lock()
	rt := t.routers[name]
	if rt == nil {
		rt = &router{alive: alive}
		t.routers[name] = rt
		t.markDeclaredByLocked(name) // their owner's record, if it is theirs
	}
	if rt.meta != meta {
		t.touchOwnedByLocked(rt) // their entries carry its region
	}
	rt.meta = meta
	if rt.alive != alive {
		t.markDeclaredByLocked(name)
	}
	rt.alive = alive
	t.unlock()
}

// setRTT records a router's smoothed RTT, which the entries of the
// replicas it owns carry.
func (t *table) setRTT(name string, rtt time.Duration) {
	t.mu.Lock()
	if rt := t.routers[name]; rt != nil {
		rt.rtt = rtt
		t.touchOwnedByLocked(rt)
	}
	t.unlock()
}

// forgetRouter drops a router membership stopped remembering (failed
// longer than FailedPeerTimeout). One alive again meanwhile is kept.
func (t *table) forgetRouter(name string) {
	t.mu.Lock()
	if rt := t.routers[name]; rt != nil && !rt.alive {
		delete(t.routers, name)
		t.markDeclaredByLocked(name)
	}
	t.unlock()
}

// markDeclaredByLocked marks the owners of the replicas router name
// declares: its liveness decides them, and only them.
func (t *table) markDeclaredByLocked(name string) {
	for _, r := range t.order {
		if r.declarers[name] {
			t.markOwnerLocked(r)
		}
	}
}

// liveLocked reports whether a router counts as alive.
func (t *table) liveLocked(name string) bool {
	if name == t.cfg.Name {
		return true
	}
	rt := t.routers[name]
	return rt != nil && rt.alive
}

// ownerLocked returns the owner of r: rendezvous hashing over the live
// routers that declare it (ownerOf); "" when none is alive. Owners are
// computed when membership or declarations change, not per request: a
// writer that changes them marks the replicas whose owner they decide,
// and unlock recomputes those before it releases the lock, so readers
// under the read lock always find them current.
func (t *table) ownerLocked(r *replica) string {
	if r.ownerDirty { // only ever true under the write lock
		t.recomputeOwnerLocked(r)
	}
	return r.owner
}

// markOwnerLocked notes that r's declarers changed.
func (t *table) markOwnerLocked(r *replica) {
	if !r.ownerDirty {
		r.ownerDirty = true
		t.dirtyReps = append(t.dirtyReps, r)
	}
}

// recomputeOwnerLocked computes r's owner; its view entry is republished
// only when the owner, or the owner's record, changed.
func (t *table) recomputeOwnerLocked(r *replica) {
	t.sections.owners++
	owner := ownerOf(r.id, r.declarers, t.liveLocked)
	mb := t.routers[owner]
	r.ownerDirty = false
	if owner != r.owner || mb != r.ownerMb {
		r.owner, r.ownerMb = owner, mb
		t.touchLocked(r)
	}
}

// recomputeOwnersLocked brings the marked replicas' owners up to date.
func (t *table) recomputeOwnersLocked() {
	for _, r := range t.dirtyReps {
		if r.ownerDirty {
			t.recomputeOwnerLocked(r)
		}
	}
	clear(t.dirtyReps)
	t.dirtyReps = t.dirtyReps[:0]
}

// touchLocked notes that something a decision reads of r changed; the
// entry is published when the write section ends (unlock). Every writer
// of a field entryLocked reads calls it.
func (t *table) touchLocked(r *replica) {
	if !r.viewDirty {
		r.viewDirty = true
		t.viewDirty = append(t.viewDirty, r)
	}
}

// touchOwnedByLocked touches the replicas rt owns (its RTT or region
// changed: their entries carry them).
func (t *table) touchOwnedByLocked(rt *router) {
	for _, r := range t.order {
		if r.ownerMb == rt {
			t.touchLocked(r)
		}
	}
}

// countsLocked reports whether a remote copy may be used for routing.
func (t *table) countsLocked(r *replica, now time.Time) bool {
	return r.copyCountsLocked() && now.Sub(r.heard) <= t.cfg.Timing.StaleAfter
}

// copyCountsLocked reports whether r's copy says what the replica holds,
// its age aside: a copy of the owner's epoch not waiting for a full copy,
// or a copy of another epoch while the owner's full copy is on its way.
// A new epoch is a resize (summary.Resized carries over what the old
// summary held) or an owner that started over (the engine still holds
// what the copy says, and softstate's hand-back gives the copy back); an
// engine's restart cuts the summary within its epoch. So the old copy is
// the best word there is until the new one lands: reading the replica as
// stale meanwhile would place every follow-up due there as cold (real
// vLLM, two follow-ups a benchmark sent elsewhere while their owners
// resized). A copy of the owner's epoch that waits for a full copy has
// diverged from it (a gap, a digest that differs) and does not count.
func (r *replica) copyCountsLocked() bool {
	return r.sum != nil && r.hasState && (r.sum.Epoch() != r.st.Epoch || !r.wantFull)
}

// declareLocked records that a state's origin declares the replica it
// names, for DeclarationTTL from now (softstate.go). It is the only way a
// peer's declaration is learned or renewed: the DeclaredBy list a state
// carries is another router's hearsay, and adopting it would let a
// declaration outlive its router (two routers re-teaching each other a
// claim its router no longer makes; a restarted router taking its own old
// claim back).
func (t *table) declareLocked(st *stateMsg) *replica {
	if st.Origin == t.cfg.Name {
		return nil
	}
	r := t.replicaLocked(st.Replica, true)
	if r == nil {
		return nil
	}
	delete(r.withdrawn, st.Origin) // its own word, again
	if !r.declarers[st.Origin] && len(r.declarers) >= maxDeclarers {
		return r
	}
	t.addDeclarerLocked(r, st.Origin)
	r.declHeard[st.Origin] = time.Now()
	t.rep.handBackLocked(r, st)
	return r
}

func (t *table) addDeclarerLocked(r *replica, name string) {
	if !r.declarers[name] {
		r.declarers[name] = true
		t.markOwnerLocked(r)
	}
}
