package mesh

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// viewMismatch compares the published decision view with one computed
// afresh from the replica structs; nil when they agree (a write section
// that just released the table's lock may not have applied its changes yet: callers
// retry).
func viewMismatch(m *Mesh) error {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	want := map[string][]viewEntry{}
	for _, r := range m.tab.order {
		e, models := m.view.entryLocked(r)
		for j, model := range models {
			if !slices.Contains(models[:j], model) {
				want[model] = append(want[model], e)
			}
		}
	}
	m.view.mu.RLock()
	defer m.view.mu.RUnlock()
	got := map[string][]viewEntry{}
	for model, mv := range m.view.models {
		if len(mv.entries) > 0 {
			got[model] = mv.entries
		}
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("published view\n%+v\nfrom the replicas\n%+v", got, want)
	}
	return nil
}

// TestViewFollowsReplicas changes, step by step, what a decision reads
// of a replica this router owns and of one a peer owns; after each step
// the published view equals one built afresh, Candidates equals the
// reference walk of the replica structs, and the candidate shows the
// change.
func TestViewFollowsReplicas(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	const x, y = "http://x:8000", "http://y:8000"
	find := func(model, id string) (route.Candidate, error) {
		for _, c := range a.Candidates(model, nil) {
			if c.ID() == id {
				return c, nil
			}
		}
		return route.Candidate{}, fmt.Errorf("%s is no candidate for %s", id, model)
	}
	absent := func(model, id string) error {
		if _, err := find(model, id); err == nil {
			return fmt.Errorf("%s is still a candidate for %s", id, model)
		}
		return nil
	}
	var done func()
	steps := []struct {
		name  string
		do    func()
		check func() error
	}{
		{"owned, healthy", func() {
			a.DeclareReplica(x)
			a.UpdateReplica(x, ReplicaStatus{Models: []string{"m"}, Healthy: true, Load: route.EngineLoad{Running: 3, Slots: 8, HasLoad: true}})
		}, func() error {
			c, err := find("m", x)
			if err == nil && (c.Running != 3 || c.Slots != 8 || c.Summary == nil) {
				err = fmt.Errorf("candidate %+v", c)
			}
			return err
		}},
		{"owned, unhealthy", func() { a.UpdateReplica(x, ReplicaStatus{Models: []string{"m"}}) }, func() error { return absent("m", x) }},
		{"owned, other model", func() { a.UpdateReplica(x, ReplicaStatus{Models: []string{"other"}, Healthy: true}) }, func() error {
			if err := absent("m", x); err != nil {
				return err
			}
			_, err := find("other", x)
			return err
		}},
		{"owned, load without a write section", func() { _, done = a.Begin(x, 2.5) }, func() error {
			c, err := find("other", x)
			if err == nil && (c.InFlight != 1 || c.PendingPrefillBlocks != 2.5) {
				err = fmt.Errorf("candidate %+v", c)
			}
			return err
		}},
		{"owned, load done", func() { done() }, func() error {
			c, err := find("other", x)
			if err == nil && (c.InFlight != 0 || c.PendingPrefillBlocks != 0) {
				err = fmt.Errorf("candidate %+v", c)
			}
			return err
		}},
		{"peer's, healthy", func() {
			b.DeclareReplica(y)
			b.UpdateReplica(y, ReplicaStatus{Models: []string{"m", "m"}, Healthy: true, Load: route.EngineLoad{Waiting: 2, HasLoad: true}})
			b.Record(y, chain(5, 3))
		}, func() error {
			c, err := find("m", y)
			if err == nil && (c.Waiting != 2 || c.Summary == nil || c.Stale) {
				err = fmt.Errorf("candidate %+v", c)
			}
			return err
		}},
		{"peer's, unhealthy", func() {
			b.UpdateReplica(y, ReplicaStatus{Models: []string{"m"}, Load: route.EngineLoad{Waiting: 2, HasLoad: true}})
		},
			func() error { return absent("m", y) }},
		{"owned, withdrawn", func() { a.WithdrawReplica(x) }, func() error { return absent("other", x) }},
	}
	for _, st := range steps {
		st.do()
		eventually(t, wait, st.name, func() error {
			if err := st.check(); err != nil {
				return err
			}
			if err := viewMismatch(a.Mesh); err != nil {
				return err
			}
			for _, model := range []string{"m", "other"} {
				if got, want := a.Candidates(model, nil), a.candidatesRef(model, nil); !sameCandidates(got, want) {
					return fmt.Errorf("model %s: Candidates\n%+v\nreference\n%+v", model, got, want)
				}
			}
			return nil
		})
	}
}

// batchRouter starts a router owning enough replicas for the batch path
// (summary.IndexMinSummaries + 8), replica i holding chain(i, 4), and
// returns it with their number.
func batchRouter(t *testing.T) (*testRouter, int) {
	t.Helper()
	a := newRouter(t, "a", nil)
	n := summary.IndexMinSummaries + 8
	for i := range n {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true})
		a.Record(id, chain(uint64(i), 4))
	}
	return a, n
}

// fillAll waits until buf's call lists all n of a's replicas.
func fillAll(t *testing.T, a *testRouter, buf *CandidateBuffer, n int) {
	t.Helper()
	eventually(t, wait, "all owned", func() error {
		if got := len(a.CandidatesInto("m", buf)); got != n {
			return fmt.Errorf("%d candidates", got)
		}
		return nil
	})
}

// TestCandidateBufferReused checks that CandidatesInto answers as
// Candidates does and, once grown, reuses its storage.
func TestCandidateBufferReused(t *testing.T) {
	a, n := batchRouter(t)
	var buf CandidateBuffer
	fillAll(t, a, &buf, n)
	first := &a.CandidatesInto("m", &buf)[0]
	probes := summary.MakeProbes(nil, chain(7, 4))
	for round := range 3 {
		cands := a.CandidatesInto("m", &buf)
		if &cands[0] != first {
			t.Fatalf("round %d: the buffer's candidates moved", round)
		}
		for i, c := range cands {
			if got, want := c.Summary.Match(probes), a.MatchReplica(c.ID(), probes); got != want {
				t.Fatalf("round %d, %s: Match %d, summary's %d", round, c.ID(), got, want)
			}
			if i == 7 {
				probes = summary.MakeProbes(nil, chain(uint64(i), 4)) // a held prompt, a new slice
			}
		}
	}
	// AllocsPerRun counts the process's allocations, the mesh's own
	// goroutines' too (one of 15 runs under -race saw one): a call that
	// allocates does in every attempt, so the least of a few tells.
	allocs := math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(20, func() { a.CandidatesInto("m", &buf) }))
	}
	if allocs != 0 {
		t.Fatalf("CandidatesInto allocates %v times per call", allocs)
	}
}

// TestCandidateBufferDropsSummaries: a buffer keeps no summary past
// those of its last call (filled clears only the ones the call before
// set), whether the view shrinks or the call takes no batch.
func TestCandidateBufferDropsSummaries(t *testing.T) {
	a, n := batchRouter(t)
	var buf CandidateBuffer
	fillAll(t, a, &buf, n)
	held := func(what string, want int) {
		t.Helper()
		// The hint set's summaries, which the next call for the view
		// takes as its batch's.
		sums := buf.hintsFor(a.Mesh, "m").sums
		if len(sums) != want {
			t.Fatalf("%s: %d summaries, want %d", what, len(sums), want)
		}
		for i, s := range sums[:cap(sums)] {
			if (s != nil) != (i < want) {
				t.Fatalf("%s: summary %d of %d set: %v", what, i, want, s != nil)
			}
		}
	}
	held("all", n)
	for i := range 5 { // the view shrinks, still batched
		a.UpdateReplica(fmt.Sprintf("http://replica-%04d:8000", i), ReplicaStatus{Models: []string{"m"}, Healthy: false})
	}
	a.CandidatesInto("m", &buf)
	held("5 unhealthy", n-5)
	for i := range n - 9 { // a view below the Index's threshold: no batch
		a.WithdrawReplica(fmt.Sprintf("http://replica-%04d:8000", i))
	}
	a.CandidatesInto("m", &buf)
	held("no batch", 0)
}

// TestPooledCandidatesMatch: candidates lent from the pool answer as
// Candidates' own do, on the batch path, concurrently (the race detector
// checks two requests never share a lent buffer).
func TestPooledCandidatesMatch(t *testing.T) {
	a := newRouter(t, "a", nil)
	const n = summary.IndexMinSummaries + 8
	for i := range n {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true})
		a.Record(id, chain(uint64(i), 4))
	}
	eventually(t, wait, "all owned", func() error {
		if got := len(a.Candidates("m", nil)); got != n {
			return fmt.Errorf("%d candidates", got)
		}
		return nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for round := range 20 {
				cands, release := a.PooledCandidates("m")
				probes := summary.MakeProbes(nil, chain(uint64((w*20+round)%n), 4))
				for _, c := range cands {
					if got, want := c.Summary.Match(probes), a.MatchReplica(c.ID(), probes); got != want {
						errs <- fmt.Errorf("worker %d round %d, %s: Match %d, summary's %d", w, round, c.ID(), got, want)
						release()
						return
					}
				}
				if len(cands) != n {
					errs <- fmt.Errorf("%d candidates, want %d", len(cands), n)
				}
				release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestEqualFullCopyKept hands a copy full copies from its owner: one
// equal to the copy it holds is not installed (the copy, and so its
// column in the Index, stays), while a diverged one at the same version,
// a newer one, and any one the copy asked for replace it.
func TestEqualFullCopyKept(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	const id = "http://x:8000"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 512})
	a.Record(id, chain(1, 40))
	eventually(t, wait, "b's copy matches", func() error { return matches(b.Mesh, id, chain(1, 40)) })
	fp := b.cfg.Contract.Fingerprint()
	reencode := func(s *summary.Summary) *summary.Summary {
		out, err := summary.Decode(s.AppendEncode(nil, fp), fp)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tests := []struct {
		name     string
		full     func(cur *summary.Summary) *summary.Summary
		wantFull bool
		kept     bool
	}{
		{"equal", reencode, false, true},
		{"diverged at the same version", func(cur *summary.Summary) *summary.Summary {
			s, err := summary.New(cur.Params(), cur.Epoch())
			if err != nil {
				t.Fatal(err)
			}
			for s.Version() < cur.Version() {
				s.Add(chain(9+s.Version(), 1))
			}
			return s
		}, false, false},
		{"newer", func(cur *summary.Summary) *summary.Summary {
			s := reencode(cur)
			s.Add(chain(77, 1))
			return s
		}, false, false},
		{"equal but asked for", reencode, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.tab.mu.RLock()
			r := b.tab.replicas[id]
			cur, st := r.sum, r.st
			b.tab.mu.RUnlock()
			s := tc.full(cur)
			if tc.name == "diverged at the same version" && s.Version() != cur.Version() {
				t.Fatalf("versions %d and %d", s.Version(), cur.Version())
			}
			chk := b.rep.compareFulls(1, func(int) string { return id }, func(int) *summary.Summary { return s })
			b.tab.mu.Lock()
			if tc.wantFull {
				r.wantFull = true
			}
			b.rep.handleFullLocked(&st, s, chk[0], r.heard)
			got := r.sum
			b.tab.unlock()
			if kept := got == cur; kept != tc.kept {
				t.Fatalf("copy kept %v, want %v (equal by digest: %v)", kept, tc.kept, chk[0].equal)
			}
			if !tc.kept && got != s {
				t.Fatal("the full copy was not installed")
			}
			// Another write section may have queued changes it has not
			// applied yet.
			eventually(t, wait, "the view in step", func() error { return viewMismatch(b.Mesh) })
		})
	}
}

// TestFillCandidateWritesEveryField fills a candidate that holds
// another one's values in every exported field, its Detail's too (a
// reused buffer), and checks that all of them but Summary (which
// Candidates sets itself) are the entry's after, with the Detail given: a
// field added to route.Candidate or route.Detail fails here until
// fillCandidate writes it too.
func TestFillCandidateWritesEveryField(t *testing.T) {
	var c route.Candidate
	c.Detail = new(route.Detail)
	var setAll func(v reflect.Value)
	setAll = func(v reflect.Value) {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			if !sf.IsExported() || sf.Name == "Summary" || sf.Name == "Detail" {
				continue
			}
			switch f.Kind() {
			case reflect.String:
				f.SetString("another")
			case reflect.Int, reflect.Int8, reflect.Int32, reflect.Int64:
				f.SetInt(int64(100 + i))
			case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				f.SetUint(uint64(100 + i))
			case reflect.Float64:
				f.SetFloat(float64(i) + 100.5)
			case reflect.Bool:
				f.SetBool(true)
			case reflect.Struct: // route.EngineLoad, embedded
				setAll(f)
			default:
				t.Fatalf("field %s of kind %s: teach this test (and fillCandidate) about it", sf.Name, f.Kind())
			}
		}
	}
	setAll(reflect.ValueOf(&c).Elem())
	setAll(reflect.ValueOf(c.Detail).Elem())
	e := viewEntry{id: "x", hash: 1, inFlight: 2, pending: 3.5, networkMs: 4.5, tier: 1, engine: route.EngineLoad{Running: 5, Waiting: 6, Slots: 7},
		lora: route.LoRAAdapter | route.LoRAResident, role: route.RolePrefill, bootstrap: 8998, held: 10}
	var x route.Detail
	x.SeqMs, x.SlotAgeMs = 8, 9 // the proxy's, from the buffer's last use
	fillCandidate(&c, &e, &x)
	want := route.Candidate{Detail: &route.Detail{ID: "x", Bootstrap: 8998}, Held: 10, Hash: 1, InFlight: 2, PendingPrefillBlocks: 3.5, NetworkMs: 4.5,
		EngineLoad: route.EngineLoad{Running: 5, Waiting: 6, Slots: 7}, Tier: 1, LoRA: route.LoRAAdapter | route.LoRAResident, Role: route.RolePrefill}
	if c.Detail != &x || !reflect.DeepEqual(c, want) {
		t.Fatalf("fillCandidate wrote\n%+v (%+v)\nwant\n%+v (%+v)", c, *c.Detail, want, *want.Detail)
	}
}

// TestCandidateBufferKeepsHintsPerModel decides alternately for two
// models with one buffer: each model's candidates keep matching as their
// summaries do, and the buffer keeps a set of Index hints for each, all
// of them filled, instead of one set each model's calls would find wrong.
func TestCandidateBufferKeepsHintsPerModel(t *testing.T) {
	a := newRouter(t, "a", nil)
	const n = 2*summary.IndexMinSummaries + 16 // both models batched
	for i := range n {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		models := []string{"m"}
		if i%2 == 0 {
			models = []string{"m", "n"}
		}
		a.UpdateReplica(id, ReplicaStatus{Models: models, Healthy: true})
		a.Record(id, chain(uint64(i), 4))
	}
	var buf CandidateBuffer
	eventually(t, wait, "all owned", func() error {
		if got := len(a.CandidatesInto("m", &buf)); got != n {
			return fmt.Errorf("%d candidates", got)
		}
		return nil
	})
	for round := range 6 {
		for _, model := range []string{"m", "n"} {
			probes := summary.MakeProbes(nil, chain(uint64(2*round), 4))
			for _, c := range a.CandidatesInto(model, &buf) {
				if got, want := c.Summary.Match(probes), a.MatchReplica(c.ID(), probes); got != want {
					t.Fatalf("round %d, model %s, %s: Match %d, summary's %d", round, model, c.ID(), got, want)
				}
			}
		}
	}
	if len(buf.hints) != 2 {
		t.Fatalf("%d hint sets, want 2", len(buf.hints))
	}
	for _, hs := range buf.hints {
		for i, h := range hs.hints {
			if h == (summary.IndexHint{}) {
				t.Fatalf("model %s: hint %d of %d empty", hs.model, i, len(hs.hints))
			}
		}
	}
}

// TestCandidateBufferHintSetsBounded: a buffer used for more meshes and
// models than maxHintSets keeps that many sets, dropping the least
// recently used.
func TestCandidateBufferHintSetsBounded(t *testing.T) {
	var buf CandidateBuffer
	meshes := []*Mesh{new(Mesh), new(Mesh)}
	for i := range maxHintSets + 5 {
		buf.hintsFor(meshes[i%2], fmt.Sprint(i))
		buf.hintsFor(meshes[0], "kept") // used every time: never dropped
	}
	if len(buf.hints) != maxHintSets {
		t.Fatalf("%d hint sets, want %d", len(buf.hints), maxHintSets)
	}
	kept, last := false, false
	for _, hs := range buf.hints {
		kept = kept || hs.m == meshes[0] && hs.model == "kept"
		last = last || hs.model == fmt.Sprint(maxHintSets+4)
		if hs.model == "0" {
			t.Fatal("the least recently used set was kept")
		}
	}
	if !kept || !last {
		t.Fatalf("recently used sets dropped (kept %v, last %v)", kept, last)
	}
}

// TestCandidatesHeldFollowsOwnedSummary: the held count a decision reads
// of an owned replica (route.Candidate.Held) is its summary's as soon as the
// owner records a request, without a tick.
func TestCandidatesHeldFollowsOwnedSummary(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://x:8000"
	declare(a, id)
	held := func() (fromView, fromSummary int) {
		for _, c := range a.Candidates("m", nil) {
			if c.ID() == id {
				fromView = int(c.Held)
			}
		}
		for _, r := range a.Debug().Replicas {
			if r.ID == id {
				fromSummary = r.Held
			}
		}
		return fromView, fromSummary
	}
	eventually(t, wait, "owned", func() error {
		if len(a.Candidates("m", nil)) != 1 {
			return fmt.Errorf("not a candidate yet")
		}
		return nil
	})
	a.Record(id, chain(3, 40))
	if v, s := held(); v != s || s < 40 {
		t.Fatalf("after a record: the view's held %d, the summary's %d (want at least 40)", v, s)
	}
}

// TestCandidatesPoolSlots: a replica whose engine publishes no slot count
// takes, among the candidates, the count its peers' engines were learnt
// to share (route.PoolSlots).
func TestCandidatesPoolSlots(t *testing.T) {
	a := newRouter(t, "a", nil)
	const x, y = "http://x:8000", "http://y:8000"
	a.DeclareReplica(x)
	a.DeclareReplica(y)
	a.UpdateReplica(x, ReplicaStatus{Models: []string{"m"}, Healthy: true, Load: route.EngineLoad{Running: 4, Waiting: 1, Slots: 4, HasLoad: true}})
	a.UpdateReplica(y, ReplicaStatus{Models: []string{"m"}, Healthy: true, Load: route.EngineLoad{Running: 2, HasLoad: true}})
	got := map[string]int32{}
	for _, c := range a.Candidates("m", nil) {
		got[c.ID()] = c.Slots
	}
	if got[x] != 4 || got[y] != 4 {
		t.Fatalf("slots by replica %v, want 4 for both", got)
	}
}
