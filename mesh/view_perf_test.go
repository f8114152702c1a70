package mesh

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// candidatesRef is Candidates as of commit 4700c0b, kept as the
// reference an optimized Candidates must equal (TestCandidatesEqualReference)
// and beat (BenchmarkCandidates1024Paired). Building each candidate in place
// in a dst grown once measured no faster (p50 24.5 µs against 23.4 µs).
func (m *Mesh) candidatesRef(model string, dst []route.Candidate) []route.Candidate {
	now := time.Now()
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	for _, r := range m.tab.order {
		owner := r.owner
		switch {
		case owner == "":
			continue
		case owner == m.cfg.Name:
			if !r.healthy || !slices.Contains(r.models, model) {
				continue
			}
			c := route.Candidate{Detail: &route.Detail{ID: r.id, Local: true}, Hash: r.hash, InFlight: int32(max(r.load.inFlight.Load(), 0)),
				PendingPrefillBlocks: float64(max(r.load.pendingK.Load(), 0)) / 1000,
				EngineLoad:           r.engine}
			if r.sum != nil {
				c.Summary = r.sum
				c.Held = route.Count32(int(r.load.held.Load()))
			}
			dst = append(dst, c)
		default:
			if !r.hasState || r.st.Origin != owner || !r.st.Healthy || !slices.Contains(r.st.Models, model) {
				continue
			}
			inFlight, pending := remoteCounts(r) // the owner's last state, or its later beacon
			c := route.Candidate{Detail: &route.Detail{ID: r.id}, Hash: r.hash, InFlight: inFlight, PendingPrefillBlocks: pending,
				EngineLoad: r.st.Engine}
			if m.tab.countsLocked(r, now) {
				c.Summary = r.sum
				c.Held = route.Count32(r.sum.Held())
			} else {
				c.Stale = true
			}
			if mb := r.ownerMb; mb != nil {
				c.NetworkMs = float64(mb.rtt.Microseconds()) / 1000
				if mb.meta.Region != m.cfg.Region {
					c.Tier = 1
				}
			}
			dst = append(dst, c)
		}
	}
	return dst
}

// candidatesPrev is Candidates as of commit 259b01a (before the decision's
// compact view, decview.go): the replica structs walked under the table's read
// lock, a new batch allocated per call. It is the "before" that
// pairedDecisions times the current path against.
func (m *Mesh) candidatesPrev(model string, dst []route.Candidate) []route.Candidate {
	now := time.Now()
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	dst = slices.Grow(dst, len(m.tab.order))
	// One allocation for the Details, as Candidates makes (not one per
	// candidate: a thousand objects per call would load the collector,
	// and the decisions timed against these, more than main's did).
	details, n0 := make([]route.Detail, len(m.tab.order)), len(dst)
	var b *matchBatch
	if len(m.tab.order) >= summary.IndexMinSummaries {
		b = &matchBatch{}
		b.reset(&m.view.index, len(m.tab.order))
	}
	bf := b.filling()
	defer func() { b.filled(bf) }()
	for _, r := range m.tab.order {
		owner := r.owner
		switch {
		case owner == "":
			continue
		case owner == m.cfg.Name:
			if !r.healthy || !slices.Contains(r.models, model) {
				continue
			}
			c := route.Candidate{Detail: detail(details, len(dst)-n0, r.id), Hash: r.hash, InFlight: int32(max(r.load.inFlight.Load(), 0)),
				PendingPrefillBlocks: float64(max(r.load.pendingK.Load(), 0)) / 1000,
				EngineLoad:           route.EngineLoad{Running: r.engine.Running, Waiting: r.engine.Waiting, Slots: r.engine.Slots}}
			if r.sum != nil {
				c.Summary = bf.add(r.sum, r.hash)
			}
			dst = append(dst, c)
		default:
			if !r.hasState || r.st.Origin != owner || !r.st.Healthy || !slices.Contains(r.st.Models, model) {
				continue
			}
			c := route.Candidate{Detail: detail(details, len(dst)-n0, r.id), Hash: r.hash, InFlight: route.Count32(int(r.st.InFlight)), PendingPrefillBlocks: r.st.Pending,
				EngineLoad: route.EngineLoad{Running: r.st.Engine.Running, Waiting: r.st.Engine.Waiting, Slots: r.st.Engine.Slots}}
			if m.tab.countsLocked(r, now) {
				c.Summary = bf.add(r.sum, r.hash)
			} else {
				c.Stale = true
			}
			if mb := r.ownerMb; mb != nil {
				c.NetworkMs = float64(mb.rtt.Microseconds()) / 1000
				if mb.meta.Region != m.cfg.Region {
					c.Tier = 1
				}
			}
			dst = append(dst, c)
		}
	}
	return dst
}

// detail is ds[i] with ID id.
func detail(ds []route.Detail, i int, id string) *route.Detail {
	ds[i].ID = id
	return &ds[i]
}

// sameCandidates reports whether a and b are equal candidates, their
// Details compared by value (each view has Details of its own).
func sameCandidates(a, b []route.Candidate) bool {
	return slices.EqualFunc(a, b, func(x, y route.Candidate) bool {
		dx, dy := x.Detail, y.Detail
		x.Detail, y.Detail = nil, nil
		return x == y && (dx == dy || (dx != nil && dy != nil && *dx == *dy))
	})
}

// TestCandidatesEqualReference compares Candidates with candidatesRef at
// a router that owns some replicas (healthy or not, of several models, in
// flight, with and without records) and sees others through two peers,
// one in another region, one of them then cut off (copies that stop counting).
func TestCandidatesEqualReference(t *testing.T) {
	var part partitioner
	ta, _ := part.transport(t, 0)
	a := newRouter(t, "a", func(c *Config) { c.Transport = ta })
	tb, _ := part.transport(t, 0)
	b := newRouter(t, "b", func(c *Config) { c.Transport = tb; joining(a)(c) })
	tc, _ := part.transport(t, 1)
	c := newRouter(t, "c", func(cfg *Config) { cfg.Transport = tc; joining(a)(cfg); cfg.Region = "r2" })
	for i, r := range []*testRouter{a, b, c} {
		for j := range 6 {
			id := fmt.Sprintf("http://%s-%d:8000", r.cfg.Name, j)
			r.DeclareReplica(id)
			models := []string{"m"}
			if j%3 == 1 {
				models = []string{"m", "other"}
			} else if j%3 == 2 {
				models = []string{"other"}
			}
			r.UpdateReplica(id, ReplicaStatus{Models: models, Healthy: j != 4, CapacityBlocks: 256, Load: route.EngineLoad{Running: int32(j), Waiting: int32(i), Slots: 8, HasLoad: j%2 == 1}})
			if j%2 == 0 {
				r.Record(id, chain(uint64(10*i+j), 20))
			}
			if j == 1 {
				_, done := r.Begin(id, 3.5)
				t.Cleanup(done)
			}
		}
	}
	compare := func(what string) {
		t.Helper()
		for _, model := range []string{"m", "other", "none"} {
			var got, want []route.Candidate
			for range 20 { // an RTT or a state may change between the two calls
				got = a.Candidates(model, make([]route.Candidate, 1, 4)[1:])
				want = a.candidatesRef(model, nil)
				if sameCandidates(got, want) {
					break
				}
			}
			if !sameCandidates(got, want) {
				t.Fatalf("%s, model %s: Candidates\n%+v\nreference\n%+v", what, model, got, want)
			}
		}
	}
	eventually(t, wait, "a sees every replica serving m", func() error {
		if n := len(a.candidatesRef("m", nil)); n != 3*3 {
			return fmt.Errorf("%d candidates", n)
		}
		return nil
	})
	compare("all fresh")
	part.set(true)
	eventually(t, wait, "c's copies stop counting at a", func() error {
		if cd, ok := candidate(a.Mesh, "m", "http://c-0:8000"); ok && cd.Summary != nil {
			return fmt.Errorf("c-0 still counts")
		}
		return nil
	})
	compare("c cut off")
	part.set(false)
}

// BenchmarkCandidates1024Paired times Candidates and candidatesRef
// alternately over the same 1,024 replicas, so a loaded machine weighs on
// both alike; it reports the p50 of each.
func BenchmarkCandidates1024Paired(b *testing.B) {
	a := newRouter(b, "a", nil)
	for i := range 1024 {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 1024})
	}
	eventually(b, wait, "all owned", func() error {
		if n := len(a.Candidates("m", nil)); n != 1024 {
			return fmt.Errorf("%d candidates", n)
		}
		return nil
	})
	cands := make([]route.Candidate, 0, 1024)
	cur, ref := newLatencies(), newLatencies()
	i := 0
	for b.Loop() {
		for k := range 2 {
			t0 := time.Now()
			if (i+k)%2 == 0 {
				cands = a.Candidates("m", cands[:0])
				cur.add(time.Since(t0))
			} else {
				cands = a.candidatesRef("m", cands[:0])
				ref.add(time.Since(t0))
			}
		}
		i++
	}
	cur.report(b)
	ref.reportAs(b, "ref-")
}

// BenchmarkDecisionPaired is BenchmarkDecision's new prompts with the
// decision timed alternately over CandidatesInto and over candidatesPrev
// (then route.Policy.Pick either way), fresh probes each time, so a loaded
// machine weighs on both alike; it reports the p50 and p99 of each. It is
// the harness for a change to Candidates or to what it hands Pick
// (touching every summary's header in Candidates so Pick's Match finds it
// in cache measured no faster: p50 287 µs against 284 µs, loaded machine).
func BenchmarkDecisionPaired(b *testing.B) {
	a, rng := owning1024(b)
	pairedDecisions(b, a, rng, func([]route.Candidate) {})
}

// TestCandidatesBatchMatchesEqualSummaries checks the batch path of
// Candidates (enough replicas for the Index to answer): every candidate's
// Match equals its summary's own, on held prefixes, new prompts, a
// replica with forgotten blocks and probes rewritten in place; and Pick
// decides over the batch exactly as over candidatesRef's summaries.
func TestCandidatesBatchMatchesEqualSummaries(t *testing.T) {
	a := newRouter(t, "a", func(c *Config) { c.DefaultCapacityBlocks = 512 })
	const n = summary.IndexMinSummaries + 44
	system := chain(1, 4)
	var convs [][]uint64
	for i := range n {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 512})
		conv := append(slices.Clone(system), chain(uint64(100+i), 1+i%24)...)
		a.Record(id, conv)
		convs = append(convs, conv)
	}
	a.Forget("http://replica-0007:8000", convs[7][len(system)+1:])
	eventually(t, wait, "all owned", func() error {
		if got := len(a.Candidates("m", nil)); got != n {
			return fmt.Errorf("%d candidates", got)
		}
		return nil
	})
	queries := [][]uint64{system, chain(7, 32), chain(8, 32), convs[3], convs[7], append(slices.Clone(convs[200]), chain(9, 5)...)}
	p := route.DefaultPolicy()
	for round := range 8 { // enough calls to bind every summary
		cands := a.Candidates("m", nil)
		probes := make([]summary.Probe, 0, 64)
		for qi, q := range queries {
			probes = summary.MakeProbes(probes[:0], q) // rewritten in place
			for _, c := range cands {
				if _, ok := c.Summary.(*route.BatchCell); !ok {
					t.Fatalf("candidate %s: Summary is %T, want the batch's", c.ID(), c.Summary)
				}
				if got, want := c.Summary.Match(probes), a.MatchReplica(c.ID(), probes); got != want {
					t.Fatalf("round %d query %d, %s: Match = %d, summary's = %d", round, qi, c.ID(), got, want)
				}
			}
			ref := a.candidatesRef("m", nil)
			req := route.Request{Hashes: q, Probes: probes, Root: 1}
			if got, want := p.Pick(req, cands), p.Pick(req, ref); got != want {
				t.Fatalf("round %d query %d: Pick over the batch %+v, over the summaries %+v", round, qi, got, want)
			}
		}
	}
	if st := a.view.index.Stats(); st.Columns < n-1 {
		t.Fatalf("%d of %d summaries in the index (%+v)", st.Columns, n, st)
	}
}

// warmIndex makes decisions until every summary is in the Index (a few
// are bound per decision), so that benchmarks time the steady state.
func warmIndex(m *Mesh, rng *rand.Rand) {
	p := route.DefaultPolicy()
	hashes := make([]uint64, 32)
	var cands []route.Candidate
	for range 4096 {
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		cands = m.Candidates("m", cands[:0])
		p.Pick(route.Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: 1}, cands)
		if m.view.index.Stats().Columns >= len(cands) {
			return
		}
	}
}

// BenchmarkDecisionCopiesPaired is BenchmarkDecisionPaired at a router
// that owns none of the 1,024 replicas: every candidate is a copy
// gossiped by another router (15 in 16 at a router of 16), whose
// Candidates reads the owner's state and the copy's epoch and age.
func BenchmarkDecisionCopiesPaired(b *testing.B) {
	_, a, rng := copying1024(b)
	counted := 0
	n := pairedDecisions(b, a, rng, func(cands []route.Candidate) {
		for _, c := range cands {
			if c.Summary != nil {
				counted++
			}
		}
	})
	b.ReportMetric(float64(counted)/float64(n), "copies-counted")
}

// pairedDecisions times decisions at a over fresh 32-block prompts,
// alternately over CandidatesInto (the current path, as the scale
// harness decides) and over candidatesPrev (the path before the compact
// view; "prev-" metrics), then Pick either way, so a loaded machine
// weighs on both alike; it reports wall and thread-CPU p50 and p99 of
// each, calls seen with every decision's candidates, and returns how many
// decisions it timed.
func pairedDecisions(b *testing.B, a *testRouter, rng *rand.Rand, seen func([]route.Candidate)) int {
	p := route.DefaultPolicy()
	var buf CandidateBuffer
	cands := make([]route.Candidate, 0, 1024)
	hashes := make([]uint64, 32)
	probes := make([]summary.Probe, 0, 32)
	cur, ref := newLatencies(), newLatencies()
	curCPU, refCPU := newLatencies(), newLatencies()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	i := 0
	for b.Loop() {
		for k := range 2 {
			for j := range hashes {
				hashes[j] = rng.Uint64()
			}
			t0, c0 := time.Now(), threadcpu.OrWall()
			now := (i+k)%2 == 0
			if now {
				cands = a.CandidatesInto("m", &buf)
			} else {
				cands = a.candidatesPrev("m", cands[:0])
			}
			probes = summary.MakeProbes(probes[:0], hashes)
			p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
			if now {
				cur.add(time.Since(t0))
				curCPU.add(threadcpu.OrWall() - c0)
			} else {
				ref.add(time.Since(t0))
				refCPU.add(threadcpu.OrWall() - c0)
			}
			seen(cands)
		}
		i++
	}
	cur.report(b)
	ref.reportAs(b, "prev-")
	curCPU.reportAs(b, "cpu-")
	refCPU.reportAs(b, "prev-cpu-")
	return 2 * i
}

// owning1024 starts a router owning 1,024 replicas whose summaries hold
// new prompts (declare1024), waits until it lists them all and warms its
// Index: the decision benchmarks' common start. rng goes on from there.
func owning1024(b *testing.B) (*testRouter, *rand.Rand) {
	a := newRouter(b, "a", func(c *Config) { c.DefaultCapacityBlocks = 4096 })
	rng := rand.New(rand.NewPCG(1, 2))
	declare1024(rng, a)
	eventually(b, wait, "all owned", func() error {
		if n := len(a.Candidates("m", nil)); n != 1024 {
			return fmt.Errorf("%d candidates", n)
		}
		return nil
	})
	warmIndex(a.Mesh, rng)
	return a, rng
}

// copying1024 is an owner of 1,024 replicas (declare1024) and a router a
// that owns none and counts the copies of all of them, its Index warm.
// LAN timing: copies count for 10 s after their owner's last word, so a
// loaded machine does not turn them stale mid-run.
func copying1024(b *testing.B) (owner, a *testRouter, rng *rand.Rand) {
	owner = newRouter(b, "owner", func(c *Config) { c.DefaultCapacityBlocks = 4096; c.Timing = LANTiming() })
	a = newRouter(b, "a", func(c *Config) { c.DefaultCapacityBlocks = 4096; c.Timing = LANTiming(); joining(owner)(c) })
	rng = rand.New(rand.NewPCG(1, 2))
	declare1024(rng, owner)
	eventually(b, 60*time.Second, "a counts every copy", func() error {
		n := 0
		for _, c := range a.candidatesRef("m", nil) {
			if c.Summary != nil {
				n++
			}
		}
		if n != 1024 {
			return fmt.Errorf("%d copies count", n)
		}
		return nil
	})
	warmIndex(a.Mesh, rng)
	return owner, a, rng
}

// declare1024 declares 1,024 replicas of 4,096 blocks at r, serving "m",
// each holding 100 random 32-block prompts.
func declare1024(rng *rand.Rand, r *testRouter) {
	for i := range 1024 {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		r.DeclareReplica(id)
		r.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 4096})
		h := make([]uint64, 32)
		for range 100 {
			for j := range h {
				h[j] = rng.Uint64()
			}
			r.Record(id, h)
		}
	}
}

// BenchmarkDecisionSplit is BenchmarkDecisionPaired's decision (new
// prompts over 1,024 owned replicas: CandidatesInto, then Pick) with its
// parts timed apart, p50 and p99 of each: fill (CandidatesInto), index
// (the first Match, which asks the Index for every summary) and pick
// (Pick with the answers at hand). It is the harness for a change to one
// of them: a loaded machine moves all three, their ratios less.
func BenchmarkDecisionSplit(b *testing.B) {
	a, rng := owning1024(b)
	p := route.DefaultPolicy()
	var buf CandidateBuffer
	hashes := make([]uint64, 32)
	fill, index, pick := newLatencies(), newLatencies(), newLatencies()
	for b.Loop() {
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		probes := summary.MakeProbes(nil, hashes)
		t0 := time.Now()
		cands := a.CandidatesInto("m", &buf)
		t1 := time.Now()
		cands[0].Summary.Match(probes)
		t2 := time.Now()
		p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
		fill.add(t1.Sub(t0))
		index.add(t2.Sub(t1))
		pick.add(time.Since(t2))
	}
	fill.reportAs(b, "fill-")
	index.reportAs(b, "index-")
	pick.reportAs(b, "pick-")
}
