package mesh

import (
	"cmp"
	"math"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// DeclareReplica declares a replica (its URL is its ID) at this router.
func (m *Mesh) DeclareReplica(id string) {
	if id == "" || len(id) > maxReplicaIDLen {
		m.log.Error("replica id empty or too long; not declared", "replica", id, "max", maxReplicaIDLen)
		return
	}
	m.tab.mu.Lock()
	r := m.tab.replicaLocked(id, true)
	if r != nil {
		// A new declaration's health checks count restarts from 0.
		r.declared, r.withdrawT, r.restarts = true, 0, 0
		m.tab.declaredLoads.Store(r.id, r.load)
		m.tab.addDeclarerLocked(r, m.cfg.Name)
	}
	m.tab.unlock()
}

// WithdrawReplica undeclares a replica at this router (discovery saw it
// go, or the operator removed it): this router stops claiming it, and
// ownership moves to another declarer, if any. Peers learn it from the
// next tick's batch (the withdrawal is repeated for a few ticks, and a
// peer then ignores hearsay naming this router as a declarer until this
// router declares the replica again).
func (m *Mesh) WithdrawReplica(id string) {
	m.tab.mu.Lock()
	defer m.tab.unlock()
	r := m.tab.replicas[id]
	if r == nil || !r.declared {
		return
	}
	r.declared, r.withdrawT = false, withdrawTicks
	m.tab.declaredLoads.Delete(r.id)
	delete(r.declarers, m.cfg.Name)
	m.tab.markOwnerLocked(r)
	if r.owned {
		m.dis.setOwnedLocked(r, false)
	}
}

// ReplicaStatus is a health check's view of a replica: what it serves,
// whether it answers, its cache capacity and the engine's own load. It
// is the health checker's type (engine.ReplicaStatus), taken as is.
type ReplicaStatus = engine.ReplicaStatus

// UpdateReplica records the proxy's latest health check of a declared
// replica; an owner gossips it with the next tick's batch.
func (m *Mesh) UpdateReplica(id string, s ReplicaStatus) {
	models, healthy, capacityBlocks := slices.Clone(s.Models), s.Healthy, s.CapacityBlocks
	slices.Sort(models)
	models = slices.Compact(models)
	m.tab.mu.Lock()
	defer m.tab.unlock()
	r := m.tab.replicas[id]
	if r == nil || !r.declared {
		return
	}
	r.models, r.healthy, r.capacity = models, healthy, capacityBlocks
	r.engine, r.lora = s.Load, s.LoRA
	r.role, r.bootstrap = s.Role, 0
	if s.Role == route.RolePrefill {
		r.bootstrap = s.Bootstrap // the wire carries a port only for a prefill replica
	}
	restarted := s.Restarts > r.restarts
	r.restarts = s.Restarts
	m.tab.touchLocked(r)
	if r.owned {
		m.dis.ensureSummaryLocked(r) // the next tick's batch carries the change
		if restarted {
			m.restartedLocked(r)
		}
	}
}

// Candidates appends the healthy replicas serving model, sorted by ID.
// It reads the decision's view (decview.go) under that view's read lock
// only, so it never waits for gossip being applied, and does no hashing:
// owners, order and entries are kept current by the writers.
//
// In a view of at least summary.IndexMinSummaries replicas, the
// candidates' Summary is not the summary itself but a view of it in one
// batch: the first Match asked of any of them answers all of them at once
// through the mesh's bit-sliced Index (summary.Index), and later Matches
// with the same probes slice read that answer. A decision over a thousand
// replicas costs a few hundred cache lines instead of one or two misses
// per replica. A caller that rewrites a probes slice in place and asks the
// same candidates again must pass a different slice (or call Candidates
// again): the batch recognises probes by their slice, first and last. The
// candidates of one call are for one goroutine at a time (the batch keeps
// its answer unlocked), as a request's are.
//
// Candidates allocates the batch (32 bytes per replica) and the
// candidates' Details (route.Detail, 40 bytes per replica) on every call,
// and dst when it is short; CandidatesInto reuses all three.
func (m *Mesh) Candidates(model string, dst []route.Candidate) []route.Candidate {
	return m.view.candidates(model, dst, nil, nil)
}

// CandidateBuffer is storage a caller reuses across decisions, so that
// CandidatesInto allocates nothing once it has grown to the view: the
// candidates' slice and the batch their Summary matchers answer from. It
// belongs to one goroutine at a time (a request's handler; a pool of
// them for a server). The zero value is ready to use.
type CandidateBuffer struct {
	cands []route.Candidate
	// details are the candidates' Details, cands[i] pointing at
	// details[i] from call to call: one array for every view the buffer
	// decides for, so that going from one router's view to another's (the
	// scale harness's sixteen routers) rewrites no Detail pointer, and,
	// as a replica's ID is one string in the process (replicaLocked), no
	// ID either. Per view (hint set) the pointers changed with the view:
	// a thousand pointers written per decision, each through the write
	// barrier while the collector marks, which made those decisions
	// several times slower (BenchmarkDecisionRotating/marking).
	details []route.Detail
	batch   matchBatch
	// hints are the Index's hints (matchBatch.hints) of each mesh and
	// model the buffer decided for lately, at most maxHintSets: a
	// buffer that goes from one model to another (a proxy's pool) or
	// from one mesh to another (the scale harness's sixteen routers)
	// would otherwise find every hint wrong, and the Index would read
	// each summary again to find its column (a cache miss each, and a
	// thousand hints rewritten).
	hints []hintSet
	uses  uint64 // calls, to tell the least recently used hint set
}

// hintSet is a CandidateBuffer's hints for one mesh and model.
type hintSet struct {
	m     *Mesh
	model string
	hints []summary.IndexHint
	// sums is the batch's summaries (matchBatch.sums) of the last call
	// for this mesh and model, which the batch takes for the call: add
	// writes only the summaries that changed, and a buffer that went
	// from one view to another (the scale harness's sixteen routers, a
	// pool's buffer from model to model) found them all changed and
	// wrote a thousand pointers per decision, each through the write
	// barrier while the collector marks (the decisions of the mark
	// phases were the harness's slowest percent). Each set keeps alive
	// the summaries of its last call.
	sums []*summary.Summary
	// plan is where the Index answered sums last time
	// (summary.IndexPlan): while a view's summaries stay the same, a
	// decision reads the rows of their columns without reading a
	// thousand hints and shards' owners again. Forgotten when sums
	// changes.
	plan summary.IndexPlan
	used uint64
}

// maxHintSets bounds a buffer's hint sets (16 bytes per replica each).
const maxHintSets = 32

// CandidatesInto is Candidates into buf: the candidates it returns, and
// their matchers, are valid until the next call with buf (which reuses
// them).
func (m *Mesh) CandidatesInto(model string, buf *CandidateBuffer) []route.Candidate {
	hs := buf.hintsFor(m, model)
	b := &buf.batch
	b.sums, b.plan = hs.sums, &hs.plan
	buf.cands = m.view.candidates(model, buf.cands[:0], b, &buf.details)
	hs.sums = b.sums
	if len(hs.hints) < len(b.sums) { // hints pay from call to call
		hs.hints = append(hs.hints, make([]summary.IndexHint, len(b.sums)-len(hs.hints))...)
	}
	b.hints = hs.hints
	return buf.cands
}

// hintsFor returns buf's hint set for m and model, taking over the least
// recently used one when it has none and holds maxHintSets.
func (buf *CandidateBuffer) hintsFor(m *Mesh, model string) *hintSet {
	buf.uses++
	for i := range buf.hints {
		if hs := &buf.hints[i]; hs.m == m && hs.model == model {
			hs.used = buf.uses
			return hs
		}
	}
	if len(buf.hints) < maxHintSets {
		buf.hints = append(buf.hints, hintSet{})
	} else {
		slices.SortFunc(buf.hints, func(a, b hintSet) int { return cmp.Compare(b.used, a.used) })
		last := &buf.hints[len(buf.hints)-1]
		clear(last.hints) // wrong for another mesh or model
		clear(last.sums[:cap(last.sums)])
		last.sums = last.sums[:0]
		last.plan.Forget()
	}
	hs := &buf.hints[len(buf.hints)-1]
	hs.m, hs.model, hs.used = m, model, buf.uses
	return hs
}

// PooledCandidates is CandidatesInto with a buffer lent from the mesh's
// pool, for a server whose requests decide concurrently: at a thousand
// replicas a request's candidates and batch are about 200 KB, which
// Candidates would allocate per request. The candidates are valid until
// release, which returns the buffer; a caller calls it once, when it no
// longer reads them.
func (m *Mesh) PooledCandidates(model string) (cands []route.Candidate, release func()) {
	buf, _ := m.view.bufs.Get().(*CandidateBuffer)
	if buf == nil {
		buf = new(CandidateBuffer)
	}
	return m.CandidatesInto(model, buf), func() { m.view.bufs.Put(buf) }
}

// candidates is Candidates with the batch b to reuse (nil: a new one
// when the view is large enough for the Index) and the Details in *ds,
// from the first (nil: new ones).
func (v *published) candidates(model string, dst []route.Candidate, b *matchBatch, ds *[]route.Detail) []route.Candidate {
	now := int64(time.Since(v.t0))
	stale := int64(v.cfg.Timing.StaleAfter)
	v.mu.RLock()
	defer v.mu.RUnlock()
	mv := v.models[model]
	if mv == nil {
		b.drop()
		return dst
	}
	es := mv.entries
	// One allocation for a caller that passes nil (the proxy), not the
	// dozen doublings of appending 1,024 candidates.
	dst = slices.Grow(dst, len(es))
	var details []route.Detail
	if ds != nil {
		// Grown, the candidates' pointers are written anew below.
		*ds = slices.Grow((*ds)[:0], len(es))[:len(es)]
		details = *ds
	} else {
		details = make([]route.Detail, len(es))
	}
	k := 0
	if len(es) >= summary.IndexMinSummaries {
		if b == nil {
			b = &matchBatch{}
		}
		b.reset(&v.index, len(es))
	} else {
		b.drop() // no batch this call (CandidatesInto's hints)
		b = nil
	}
	// The batch's summaries and keys are appended to here, in locals,
	// and stored in b once: b is in the heap (a CandidateBuffer), and
	// storing its slices per candidate put two pointers per candidate
	// through the write barrier while the collector marks, the most of
	// such a decision's fill (BenchmarkDecisionRotating/marking).
	bf := b.filling()
	for i := range es {
		e := &es[i]
		if !e.ok {
			continue
		}
		n := len(dst)
		dst = dst[:n+1]
		c := &dst[n]
		var sum route.Matcher
		fillCandidate(c, e, &details[k])
		k++
		if l := e.load; l != nil { // owned here
			c.Detail.Local = true
			c.InFlight = int32(min(max(l.inFlight.Load(), 0), math.MaxInt32))
			c.PendingPrefillBlocks = float64(max(l.pendingK.Load(), 0)) / 1000
			if e.sum != nil {
				sum = bf.add(e.sum, c.Hash)
				// Live, as the loads: the owner's summary grows with
				// every request it records, which touches no entry.
				c.Held = route.Count32(int(l.held.Load()))
			}
		} else {
			if e.counts && now-e.heard <= stale {
				sum = bf.add(e.sum, c.Hash)
			} else {
				c.Stale = true
			}
		}
		if !sameMatcher(c.Summary, sum) {
			c.Summary = sum
		}
	}
	b.filled(bf)
	route.PoolSlots(dst)
	return dst
}

// batchFill is a matchBatch's summaries and keys while candidates adds
// to them, held on the stack (rb nil: no batch).
type batchFill struct {
	sums []*summary.Summary
	keys []uint64
	rb   *route.Batch
	// changed: a summary written (not the last call's at its place).
	changed bool
}

// filling returns b's summaries and keys to add to (no batch when b is
// nil).
func (b *matchBatch) filling() batchFill {
	if b == nil {
		return batchFill{}
	}
	return batchFill{sums: b.sums, keys: b.keys, rb: &b.rb}
}

// filled stores in b what f added, and clears the summaries past them:
// a buffer at rest keeps alive no more than the summaries of its last
// call.
func (b *matchBatch) filled(f batchFill) {
	if b == nil {
		return
	}
	b.sums, b.keys = f.sums, f.keys
	if f.changed || len(b.sums) != b.held {
		b.plan.Forget()
	}
	// Only those the last call set: clearing the whole spare capacity
	// put every slot through the write barrier while the collector
	// marks, a hundred and more per decision.
	clear(b.sums[len(b.sums):max(b.held, len(b.sums))])
}

// drop empties b's summaries (b may be nil).
func (b *matchBatch) drop() {
	if b != nil {
		clear(b.sums)
		b.sums = b.sums[:0]
		b.plan.Forget()
	}
}

// add returns the Matcher of s for a candidate: s itself without a batch
// (a view too small for the Index to pay), else the batch's cell for it.
// It writes the summary into the batch only when it changed (a pointer
// written costs a write barrier while the collector marks).
func (f *batchFill) add(s *summary.Summary, key uint64) route.Matcher {
	if f.rb == nil {
		return s
	}
	i := len(f.sums)
	f.sums, f.keys = f.sums[:i+1], append(f.keys, key)
	if f.sums[i] != s {
		f.sums[i], f.changed = s, true
	}
	return f.rb.Cell(i)
}

// sameMatcher is a == b for the matchers candidates writes, without
// comparing interfaces: that calls runtime.ifaceeq once the types agree,
// a call per candidate where a batch's cell is one pointer compare.
func sameMatcher(a, b route.Matcher) bool {
	if x, ok := a.(*route.BatchCell); ok {
		y, ok := b.(*route.BatchCell)
		return ok && x == y
	}
	return a == b
}

// fillCandidate writes e's fields into c, all but the Summary, which the
// caller sets, with x as its Detail; it writes the pointer, and x's
// fields, only when they differ (a reused buffer's Detail holds the
// same ID, and SeqMs and SlotAgeMs only when the proxy has set them). Why not *c = a candidate
// built from e: while the collector marks (in a busy router, much of the
// time) every pointer written to the heap goes through its write barrier,
// and candidates copied whole, or zeroed then written, queued thousands
// of pointers for it to shade per decision: the decisions that overlapped
// a mark phase cost several times the others. A buffer reused for the
// same view writes no pointer here. TestFillCandidateWritesEveryField
// keeps it in step with route.Candidate.
func fillCandidate(c *route.Candidate, e *viewEntry, x *route.Detail) {
	if c.Detail != x {
		c.Detail = x
	}
	// The same string, not equal contents: comparing them would call
	// memequal per candidate.
	if unsafe.StringData(x.ID) != unsafe.StringData(e.id) || len(x.ID) != len(e.id) {
		x.ID = e.id
	}
	x.SeqMs, x.SlotAgeMs, x.Own, x.Local, x.Written = 0, 0, 0, false, 0
	c.Hash, c.InFlight, c.PendingPrefillBlocks, c.NetworkMs, c.BlockMs = e.hash, e.inFlight, e.pending, e.networkMs, 0
	c.Tier, c.EngineLoad, c.Role, c.Held = e.tier, e.engine, e.role, e.held
	x.Bootstrap = e.bootstrap
	c.Stale = false
	c.LoRA = e.lora
}

// matchBatch is the summaries of one Candidates call, matched together
// through the mesh's Index when a candidate's Match is first asked (the
// candidates' Summary is a cell of its route.Batch).
type matchBatch struct {
	idx  *summary.Index
	sums []*summary.Summary
	keys []uint64 // the replicas' hashes: a replica's summary keeps its column in the Index
	// hints[i] is where the Index answered sums[i] last time: kept from
	// call to call in a CandidateBuffer (a view's replicas keep their
	// places), so the Index need not read each summary and its column
	// (summary.IndexHint); nil in a batch of one call.
	hints []summary.IndexHint
	// plan is the Index's plan of sums, kept with the hints (nil in a
	// batch of one call); the batch Forgets it when sums changes.
	plan *summary.IndexPlan
	rb   route.Batch
	// held is how many summaries sums held before reset: past them its
	// storage is nil (filled and drop keep it so).
	held int
}

// reset readies b for a call over up to n summaries of idx, keeping its
// storage.
func (b *matchBatch) reset(idx *summary.Index, n int) {
	b.idx = idx
	// sums keeps the last call's summaries, so that add writes only
	// those that changed (a pointer written costs a write barrier while
	// the collector marks); filled drops the ones past this call's.
	b.held = len(b.sums)
	b.sums, b.keys = slices.Grow(b.sums[:0], n), slices.Grow(b.keys[:0], n)
	b.rb.Reset(b, n)
}

// MatchBatch is route.BatchMatcher: every summary's match through the
// Index, with the buffer's hints when it has them.
func (b *matchBatch) MatchBatch(dst []int, probes []summary.Probe) []int {
	var hints []summary.IndexHint
	if len(b.hints) >= len(b.sums) {
		hints = b.hints[:len(b.sums)]
	}
	return b.idx.MatchPlanned(dst, b.sums, b.keys, hints, b.plan, probes)
}

// Locate says how to reach a replica: directly when this router owns it,
// else through its owner's API.
func (m *Mesh) Locate(replicaID string) (ownerAPI string, local bool, ok bool) {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	r := m.tab.replicas[replicaID]
	if r == nil {
		return "", false, false
	}
	owner := m.tab.ownerLocked(r)
	switch {
	case owner == "":
		return "", false, false
	case owner == m.cfg.Name:
		return m.cfg.APIAddr, true, true
	}
	mb := m.tab.routers[owner]
	if mb == nil || mb.meta.API == "" {
		return "", false, false
	}
	return mb.meta.API, false, true
}

// Models lists the models of every replica known anywhere in the mesh,
// healthy or not: a model whose replicas are all down is known but
// unavailable (503 with Retry-After), not unknown (404).
func (m *Mesh) Models() []string {
	m.tab.mu.RLock()
	var out []string
	for _, r := range m.tab.replicas {
		owner := m.tab.ownerLocked(r)
		switch {
		case owner == m.cfg.Name:
			out = append(out, r.models...)
		case owner != "" && owner != m.cfg.Name && r.hasState && r.st.Origin == owner:
			out = append(out, r.st.Models...)
		}
	}
	m.tab.mu.RUnlock()
	slices.Sort(out)
	return slices.Compact(out)
}

// ModelParents maps each LoRA adapter served anywhere in the mesh to
// its base model (route.LoRAs.Parent of a replica that serves it, its
// engine's "parent"), for GET /v1/models; the base models are not in
// it. Where replicas disagree (two bases carry adapters of one name),
// the first parent by name stands.
func (m *Mesh) ModelParents() map[string]string {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	var out map[string]string
	for _, r := range m.tab.replicas {
		var models []string
		var lora route.LoRAs
		switch owner := m.tab.ownerLocked(r); {
		case owner == m.cfg.Name:
			models, lora = r.models, r.lora
		case owner != "" && r.hasState && r.st.Origin == owner:
			models, lora = r.st.Models, r.st.LoRA
		}
		if !lora.Known() {
			continue
		}
		for _, a := range models {
			p := lora.Parent(models, a)
			if p == "" {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			if q, ok := out[a]; !ok || p < q {
				out[a] = p
			}
		}
	}
	return out
}

// Record adds blocks to an owned replica's summary; elsewhere it is a
// no-op (one writer per summary).
func (m *Mesh) Record(replicaID string, hashes []uint64) {
	m.tab.mu.RLock()
	r := m.tab.replicas[replicaID]
	if r != nil && r.owned && r.sum != nil {
		r.sum.Add(hashes)
		r.load.held.Store(int64(r.sum.Held()))
		m.tab.mu.RUnlock()
		return
	}
	m.tab.mu.RUnlock()
	if r == nil || !r.declared {
		return
	}
	m.tab.mu.Lock()
	defer m.tab.unlock()
	if m.tab.ownerLocked(r) != m.cfg.Name {
		return
	}
	m.dis.setOwnedLocked(r, true)
	m.dis.ensureSummaryLocked(r)
	if r.sum != nil {
		r.sum.Add(hashes)
		r.load.held.Store(int64(r.sum.Held()))
	}
}

// Forget records that an owned replica does not hold these blocks (its
// engine reported fewer cached tokens than the summary predicted): the
// summary stops claiming them (Match stops at the first) until they are
// recorded again, and cuts the generations the miss shows stale
// (correct.go). The forgets and cuts travel to the copies in the same
// ordered deltas as the inserts. Elsewhere it is a no-op (one writer per
// summary).
func (m *Mesh) Forget(replicaID string, hashes []uint64) {
	m.tab.mu.RLock()
	r := m.tab.replicas[replicaID]
	if r != nil && r.owned && r.sum != nil {
		m.correct(r.sum, hashes)
	}
	m.tab.mu.RUnlock()
}

// Begin accounts a request dispatched to a replica declared here: one
// more in flight and prefillBlocks more pending prefill, until firstByte
// and done (both idempotent). It takes no lock of the mesh's (the proxy
// calls it under its placement lock).
func (m *Mesh) Begin(replicaID string, prefillBlocks float64) (firstByte, done func()) {
	v, ok := m.tab.declaredLoads.Load(replicaID)
	if !ok {
		return func() {}, func() {}
	}
	k := int64(max(prefillBlocks, 0) * 1000)
	l := v.(*replicaLoad)
	l.inFlight.Add(1)
	l.pendingK.Add(k)
	wakeBeacons(m.beaconWake) // after the counts: the loop reads them once woken
	b := &begun{l: l, k: k, wake: m.beaconWake}
	return b.firstByte, b.done
}

// begun is one request counted by Begin; each of its two ends takes
// effect once, and wakes the beacon loop when it changed a count.
type begun struct {
	l      *replicaLoad
	k      int64
	wake   chan struct{} // env.beaconWake
	fb, dn atomic.Bool
}

func (b *begun) firstByte() {
	if b.endPrefill() {
		wakeBeacons(b.wake)
	}
}

// endPrefill takes the request's prefill off the pending count, once; it
// reports whether that changed the count.
func (b *begun) endPrefill() bool {
	if b.fb.CompareAndSwap(false, true) && b.k != 0 {
		b.l.pendingK.Add(-b.k)
		return true
	}
	return false
}

func (b *begun) done() {
	if b.dn.CompareAndSwap(false, true) {
		b.endPrefill()
		b.l.inFlight.Add(-1)
		wakeBeacons(b.wake)
	}
}
