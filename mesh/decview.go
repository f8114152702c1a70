package mesh

// The decision's view of the replicas: for every model, a compact array of
// only what Candidates reads of each replica that serves it, kept in step
// with the replica structs by the writers and read under a lock of its
// own.
//
// Why: walking the replica structs (528 bytes each, the fields a
// decision reads spread over several cache lines, plus the summary's
// header and the owner's record for every copy) under the table's read
// lock would make a decision over 1,024 replicas wait behind every write
// section of the gossip (an owner's tick encodes and fingerprints the
// state of every replica it owns under the write lock: 0.3-0.7 ms at 1,024
// replicas, one decision in fifty at a 50 ms tick). The entries here are
// about 100 bytes, contiguous, and their lock is held by writers only to
// copy a few entries in (or swap the arrays), after the table's lock is
// released, never while gossip is decoded, applied or encoded; and no
// writer holding the table's lock waits for it.

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// replicaLoad is the router's own count of a replica's requests (Begin),
// allocated apart from the replica so that a decision reading it for
// every owned replica touches 16 bytes, not the replica's struct.
type replicaLoad struct {
	inFlight atomic.Int64
	pendingK atomic.Int64 // pending prefill blocks × 1000
	// held is the owned summary's Held (route.Candidate.Held), stored as the
	// owner records a request and at every tick: a decision reads it
	// here, beside the counts, not from the summary (a cache miss per
	// owned replica in a decision over cold caches).
	held atomic.Int64
}

// published is the decision's view: the per-model arrays Candidates
// reads, and the Index that matches their summaries in one batch.
type published struct {
	*env
	mu     sync.RWMutex
	models map[string]*modelView // guarded by mu; replaced whole on a rebuild
	// pend is the changes write sections queued (under the table's lock,
	// so in their order) for drain to apply under mu once that lock is
	// released: a writer never waits for a decision's read lock while it
	// holds the table's (a decision's thread switched out mid-read would
	// hold up all the gossip behind it).
	pendMu sync.Mutex
	pend   []viewOp // guarded by pendMu
	// spare is the storage of the ops drain last applied, for pend to
	// reuse (guarded by pendMu): a router under gossip queues ops in
	// every write section.
	spare []viewOp
	upd   []viewOp // publishLocked's scratch, kept from section to section (the table's lock)

	index summary.Index // the summaries bit-sliced, for Candidates' matches (view.go)
	bufs  sync.Pool     // *CandidateBuffer lent by PooledCandidates
}

func newPublished(e *env) *published { return &published{env: e} }

// viewOp is one queued change of the view: a rebuild's arrays to swap in
// (views not nil), or an entry to copy into its slots.
type viewOp struct {
	views map[string]*modelView
	at    []viewSlot
	e     viewEntry
	// lora is the replica's LoRA adapters, which each slot's entry
	// reduces to its model's fit.
	lora route.LoRAs
}

// modelView is the replicas serving one model, in ID order (Candidates'
// order). Its entries are written in place under decisionView.mu.
type modelView struct {
	entries []viewEntry
	// lora is the model's route.LoRAID, which its candidates' LoRA
	// is of.
	lora uint32
}

// viewEntry is one replica as a decision reads it: what candidatesRef
// (the reference, in view_perf_test.go) computes from the replica struct,
// but for the load of an owned replica (live, through load) and the age
// of a copy (heard; Candidates compares it with the time of the call).
type viewEntry struct {
	id   string
	hash uint64
	sum  *summary.Summary
	// load is the live counters of a replica this router owns; nil for a
	// copy, whose load is the owner's last state below.
	load      *replicaLoad
	heard     int64 // copy: the owner's last word, ns after env.t0
	pending   float64
	networkMs float64
	// The count as route.Candidate keeps it (route.Count32).
	inFlight int32
	// held is a copy's blocks remembered (route.Candidate.Held), read when
	// the entry is computed, at each delta; an owner's is read live.
	held int32
	tier int8
	// engine is the engine's load, the owner's own or as it gossips it.
	engine route.EngineLoad
	// role and bootstrap: the replica's role in disaggregated requests,
	// and a prefill replica's bootstrap port.
	role      route.Role
	bootstrap uint16
	// ok: healthy, with an owner whose word this router has (else the
	// replica is no candidate, but keeps its place in the arrays so that
	// health flapping does not rebuild them).
	ok bool
	// counts: a copy whose summary counts for routing as long as its
	// owner's last word is recent (table.countsLocked without the age).
	counts bool
	// lora is the replica's word on the model of the array the entry is
	// in, as a LoRA adapter (its LoRAs' Fit, computed when the entry is
	// written, not per decision).
	lora route.LoRAFit
}

// viewSlot is where a replica's entry sits in one model's array.
type viewSlot struct {
	mv *modelView
	i  int
}

// entryLocked computes r's entry and the models it serves (nil when it
// is no candidate for any: no owner, or no word from its owner).
func (v *published) entryLocked(r *replica) (viewEntry, []string) {
	e := viewEntry{id: r.id, hash: r.hash}
	owner := r.owner
	switch {
	case owner == "":
		return e, nil
	case owner == v.cfg.Name:
		e.ok, e.sum, e.load = r.healthy, r.sum, r.load
		e.engine, e.role, e.bootstrap = r.engine, r.role, r.bootstrap
		return e, r.models
	case !r.hasState || r.st.Origin != owner:
		return e, nil
	}
	e.ok = r.st.Healthy
	e.inFlight, e.pending = remoteCounts(r)
	e.engine, e.role, e.bootstrap = r.st.Engine, r.st.Role, r.st.Bootstrap
	if r.copyCountsLocked() && !r.heard.IsZero() {
		e.counts, e.sum, e.heard = true, r.sum, int64(r.heard.Sub(v.t0))
		e.held = route.Count32(r.sum.Held())
	}
	if mb := r.ownerMb; mb != nil {
		e.networkMs = float64(mb.rtt.Microseconds()) / 1000
		if mb.meta.Region != v.cfg.Region {
			e.tier = 1
		}
	}
	return e, r.st.Models
}

// loraLocked is r's LoRA adapters as its entry's owner tells them: this
// router's health checks for a replica it owns, the owner's last state
// for another's (entryLocked's owners).
func (v *published) loraLocked(r *replica) route.LoRAs {
	switch {
	case r.owner == v.cfg.Name:
		return r.lora
	case r.owner != "" && r.hasState && r.st.Origin == r.owner:
		return r.st.LoRA
	}
	return route.LoRAs{}
}

// publishLocked queues the entries of the replicas t's write section
// touched for drain: in place when each serves the models it served, else
// arrays built anew (a replica came, went or changed models) to swap in.
// It reports whether it queued anything: nothing when the section
// touched nothing. The caller holds t.mu.
func (v *published) publishLocked(t *table) bool {
	if len(t.viewDirty) == 0 && !t.viewRebuild {
		return false
	}
	upd := v.upd[:0]
	rebuild := t.viewRebuild
	for _, r := range t.viewDirty {
		r.viewDirty = false
		if rebuild {
			continue
		}
		e, models := v.entryLocked(r)
		if !slices.Equal(models, r.viewModels) {
			rebuild = true
			continue
		}
		upd = append(upd, viewOp{at: r.viewAt, e: e, lora: v.loraLocked(r)})
	}
	clear(t.viewDirty)
	t.viewDirty, t.viewRebuild = t.viewDirty[:0], false
	if rebuild {
		clear(upd)
		upd = append(upd[:0], viewOp{views: v.buildLocked(t)})
	}
	v.pendMu.Lock()
	v.pend = append(v.pend, upd...)
	v.pendMu.Unlock()
	clear(upd) // pend holds them now
	v.upd = upd[:0]
	return true
}

// drain applies the queued changes, in order, under the view's lock.
// table.unlock calls it once the table's lock is released, after a
// section that queued changes. Whoever takes the lock first applies
// everything queued by then: a later write section's changes never go in
// before an earlier one's.
func (v *published) drain() {
	v.pendMu.Lock()
	n := len(v.pend)
	v.pendMu.Unlock()
	if n == 0 {
		return
	}
	v.mu.Lock()
	v.pendMu.Lock()
	ops := v.pend
	v.pend, v.spare = v.spare[:0], nil
	v.pendMu.Unlock()
	for _, op := range ops {
		if op.views != nil {
			v.models = op.views
			continue
		}
		for _, s := range op.at {
			s.mv.entries[s.i] = op.e
			s.mv.entries[s.i].lora = op.lora.Fit(s.mv.lora)
		}
	}
	v.mu.Unlock()
	// After the view's lock, which decisions wait for: ops is this
	// call's alone now.
	clear(ops) // the entries' summaries and the old arrays may go
	v.pendMu.Lock()
	v.spare = ops[:0]
	v.pendMu.Unlock()
}

// buildLocked builds every model's array from t's replicas.
func (v *published) buildLocked(t *table) map[string]*modelView {
	views := map[string]*modelView{}
	for _, r := range t.order {
		e, models := v.entryLocked(r)
		lora := v.loraLocked(r)
		// A new slots slice: queued changes hold the old one.
		r.viewModels, r.viewAt = slices.Clone(models), nil
		for j, model := range models {
			if slices.Contains(models[:j], model) {
				continue // a peer's state may name a model twice
			}
			mv := views[model]
			if mv == nil {
				mv = &modelView{lora: route.LoRAID(model)}
				views[model] = mv
			}
			r.viewAt = append(r.viewAt, viewSlot{mv, len(mv.entries)})
			e.lora = lora.Fit(mv.lora)
			mv.entries = append(mv.entries, e)
		}
	}
	return views
}
