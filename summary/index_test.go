package summary

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// indexFixture is n owners sharing some chains (so matches of every length
// occur), their copies kept by deltas or full copies, and the held chains.
type indexFixture struct {
	owners, copies []*Summary
	held           [][]uint64
}

const indexContract = 0x1dec

func newIndexFixture(t testing.TB, rng *rand.Rand, n int, p Params) *indexFixture {
	t.Helper()
	f := &indexFixture{}
	for i := range n {
		s, err := New(p, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		f.owners = append(f.owners, s)
		f.copies = append(f.copies, mustDecode(t, s))
	}
	return f
}

func mustDecode(t testing.TB, s *Summary) *Summary {
	t.Helper()
	cp, err := Decode(s.AppendEncode(nil, indexContract), indexContract)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// step adds chains (some shared by many owners, with their own tails),
// forgets a few tails, cuts a few owners, and brings the copies up to date
// (by delta, or a full copy: a new *Summary, so the Index must rebind).
func (f *indexFixture) step(t testing.TB, rng *rand.Rand) {
	t.Helper()
	shared := make([]uint64, 1+rng.IntN(40))
	for i := range shared {
		shared[i] = rng.Uint64()
	}
	f.held = append(f.held, shared)
	for i, s := range f.owners {
		if rng.IntN(3) == 0 {
			h := append([]uint64(nil), shared[:rng.IntN(len(shared)+1)]...)
			for range rng.IntN(20) {
				h = append(h, rng.Uint64())
			}
			s.Add(h)
			if len(h) > 0 {
				f.held = append(f.held, h)
			}
		}
		switch rng.IntN(40) {
		case 0:
			old := f.held[rng.IntN(len(f.held))]
			s.Forget(old[len(old)/2:])
		case 1:
			s.Cut(CutOlder)
		}
		if rng.IntN(10) == 0 {
			f.copies[i] = mustDecode(t, s)
			continue
		}
		if enc, _, ok := s.AppendDelta(nil, f.copies[i].Version()); ok {
			d, err := DecodeDelta(enc)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.copies[i].ApplyDelta(d); err != nil {
				t.Fatal(err)
			}
		} else {
			f.copies[i] = mustDecode(t, s)
		}
	}
}

// check compares Index.Match (MatchHinted with hints, when not nil:
// the caller keeps them from call to call) with Summary.Match on every
// summary of sums for queries from the held chains and random ones, and
// MatchPlanned's answers too with plan, when not nil (the caller keeps it
// for sums, and Forgets it when sums changes); it returns how many
// summaries the index answered (bound, no negative record).
func checkIndex(t *testing.T, x *Index, sums []*Summary, keys []uint64, hints []IndexHint, plan *IndexPlan, qs [][]uint64, what string) int {
	t.Helper()
	got := make([]int, len(sums))
	for _, q := range qs {
		p := MakeProbes(nil, q)
		for _, planned := range []bool{true, false} { // planned first: the other may rebind
			switch {
			case !planned:
				got = x.MatchHinted(got, sums, keys, hints, p)
			case plan == nil:
				continue
			default:
				for i := range got {
					got[i] = -1 // every answer is written
				}
				got = x.MatchPlanned(got, sums, keys, hints, plan, p)
			}
			for i, s := range sums {
				want := 0
				if s != nil {
					want = refMatch(s, p)
				}
				if got[i] != want {
					t.Fatalf("%s: summary %d: Index.Match (planned %v) = %d, Summary.Match = %d (query of %d blocks)", what, i, planned, got[i], want, len(q))
				}
			}
		}
	}
	n := 0
	for _, s := range sums {
		if x.mirrorOf(s) != nil && s.negN.Load() == 0 {
			n++
		}
	}
	return n
}

// TestIndexMatchEqualsSummaryMatch drives owners and copies through adds,
// rotations, forgets, cuts, deltas and full copies (new summaries), with
// a minority of another geometry and a nil summary among them, and checks
// that the Index answers exactly as Summary.Match after every step, and
// that it does answer most of them itself once bound.
func TestIndexMatchEqualsSummaryMatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		p     Params
		other int // summaries of another geometry
	}{
		{"300x64-blocks", 300, Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 20},
		{"300x1000-blocks", 300, Params{CapacityBlocks: 1000, FalsePositiveRate: 0.05}, 0},
		{"100x64-blocks-too-few", 100, Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.n), 9))
			f := newIndexFixture(t, rng, tc.n, tc.p)
			g := newIndexFixture(t, rng, tc.other, Params{CapacityBlocks: 128, FalsePositiveRate: 0.01})
			var x Index
			maxIndexed := 0
			hints := map[string][]IndexHint{} // per side, kept across steps as a view keeps them
			plans := map[string]*IndexPlan{"owners": {}, "copies": {}}
			for step := range 40 {
				f.step(t, rng)
				if tc.other > 0 {
					g.step(t, rng)
				}
				for _, side := range []struct {
					name string
					sums []*Summary
				}{{"owners", f.owners}, {"copies", f.copies}} {
					sums := append(slices.Clone(side.sums), g.copies...)
					sums = append(sums, nil)
					qs := matchQueries(rng, f.held, 12)
					var keys []uint64
					if side.name == "copies" { // owners and copies alternate in one Index: keys only for copies
						keys = make([]uint64, len(sums))
						for i := range keys {
							keys[i] = uint64(i) + 1<<40
						}
					}
					if len(hints[side.name]) != len(sums) {
						hints[side.name] = make([]IndexHint, len(sums))
					}
					plans[side.name].Forget() // sums is the step's: a summary may be new
					n := checkIndex(t, &x, sums, keys, hints[side.name], plans[side.name], qs, fmt.Sprintf("step %d %s", step, side.name))
					maxIndexed = max(maxIndexed, n)
				}
			}
			switch {
			case tc.n < minIndexed && maxIndexed != 0:
				t.Fatalf("%d summaries indexed, want none below %d", maxIndexed, minIndexed)
			case tc.n >= minIndexed && maxIndexed < tc.n*3/4:
				t.Fatalf("at most %d of %d summaries answered by the index", maxIndexed, tc.n)
			}
		})
	}
}

// TestIndexReclaimsColumns replaces every summary with a new one many
// times (as full copies do), with and without keys: with keys a new
// summary takes over its key's column (one shard throughout); without,
// columns of summaries no longer asked are reclaimed and the shards stay
// bounded; answers stay exact either way.
func TestIndexReclaimsColumns(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		t.Run(map[bool]string{true: "keys", false: "no-keys"}[keyed], func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			p := Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}
			f := newIndexFixture(t, rng, 300, p)
			var keys []uint64
			if keyed {
				keys = make([]uint64, len(f.copies))
				for i := range keys {
					keys[i] = rng.Uint64()
				}
			}
			var x Index
			hints := make([]IndexHint, len(f.copies))
			var plan IndexPlan
			for round := range 6 {
				f.step(t, rng)
				for i := range f.copies {
					if rng.IntN(2) == 0 {
						f.copies[i] = mustDecode(t, f.owners[i])
					}
				}
				plan.Forget()
				eligible := 0 // summaries with forgotten blocks are matched directly
				for _, c := range f.copies {
					if c.negN.Load() == 0 {
						eligible++
					}
				}
				bound := 0
				for call := 0; call < reclaimAfter+10 && bound < eligible; call++ {
					bound = checkIndex(t, &x, f.copies, keys, hints, &plan, matchQueries(rng, f.held, 1), fmt.Sprintf("round %d", round))
				}
				if bound < eligible {
					t.Fatalf("round %d: %d of %d bound", round, bound, eligible)
				}
			}
			st := x.Stats()
			switch {
			case keyed && st.Shards != 1:
				t.Fatalf("%+v: want one shard for 300 keys", st)
			case st.Shards*shardCols > 2*300+2*shardCols: // claimLocked's bound
				t.Fatalf("%+v: too many shards for 300 summaries", st)
			}
		})
	}
}

// TestIndexUnderWriters races Index.Match with the owners' adds and
// rotations and with rebinding (run with -race), then checks the
// quiescent answers.
func TestIndexUnderWriters(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	f := newIndexFixture(t, rng, 300, Params{CapacityBlocks: 256, FalsePositiveRate: 0.01})
	held := chain(32, 1)
	for _, s := range f.owners {
		s.Add(held)
	}
	var x Index
	p := MakeProbes(nil, held)
	got := make([]int, len(f.owners))
	for range 50 { // bind them all
		x.Match(got, f.owners, nil, p)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(stop)
		for i := range 40 { // several rotations of every owner
			for _, s := range f.owners {
				s.Add(chain(16, uint64(i+2)))
			}
		}
	}()
	// A second reader, with keys and copies replaced as it goes (their
	// columns change hands under the first reader).
	wg.Add(1)
	go func() {
		defer wg.Done()
		keys := make([]uint64, len(f.copies))
		for i := range keys {
			keys[i] = uint64(i)
		}
		got := make([]int, len(f.copies))
		hints := make([]IndexHint, len(f.copies))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cp, err := Decode(f.owners[i%len(f.owners)].AppendEncode(nil, indexContract), indexContract)
			if err != nil {
				t.Error(err)
				return
			}
			f.copies[i%len(f.copies)] = cp
			for _, m := range x.MatchHinted(got, f.copies, keys, hints, p) {
				if m < 0 || m > len(p) {
					t.Errorf("Match = %d", m)
					return
				}
			}
		}
	}()
	var plan IndexPlan
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		// With a plan: the owners are the same summaries throughout,
		// whose columns may change hands under it.
		for _, m := range x.MatchPlanned(got, f.owners, nil, nil, &plan, p) {
			if m < 0 || m > len(p) {
				t.Fatalf("Match = %d", m)
			}
		}
	}
	wg.Wait()
	n := checkIndex(t, &x, f.owners, nil, nil, nil, [][]uint64{held, chain(16, 41), chain(16, 30), chain(40, 999)}, "quiescent")
	if n == 0 {
		t.Fatal("nothing indexed")
	}
}

// BenchmarkMatch1024Index is the summary side of a decision over 1,024
// replicas (as BenchmarkMatch1024Paired: 4,096 blocks, 3,200 held each,
// new 32-block prompts), Summary.Match per summary against one
// Index.Match over all, timed alternately; it reports p50/p99 of each.
func BenchmarkMatch1024Index(b *testing.B) {
	sums, held := summaries1024(b)
	rng := rand.New(rand.NewPCG(3, 4))
	var x Index
	out := make([]int, len(sums))
	for range 1024 / maxBindsPerMatch * 2 { // bind every summary
		x.Match(out, sums, nil, MakeProbes(nil, held[0]))
	}
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "new-32-blocks", true: "held-32-blocks"}[warm], func(b *testing.B) {
			var ref, idx []time.Duration
			hashes := make([]uint64, 32)
			probes := make([]Probe, 0, 32)
			i := 0
			for b.Loop() {
				for k := range 2 {
					if warm {
						copy(hashes, held[rng.IntN(len(held))])
					} else {
						for j := range hashes {
							hashes[j] = rng.Uint64()
						}
					}
					probes = MakeProbes(probes[:0], hashes)
					t0 := time.Now()
					if (i+k)%2 == 0 {
						x.Match(out, sums, nil, probes)
						idx = append(idx, time.Since(t0))
					} else {
						for j, s := range sums {
							out[j] = s.Match(probes)
						}
						ref = append(ref, time.Since(t0))
					}
				}
				i++
			}
			pct := func(d []time.Duration, q float64) float64 {
				slices.Sort(d)
				return float64(d[int(q*float64(len(d)-1))].Nanoseconds()) / 1000
			}
			b.ReportMetric(pct(idx, 0.5), "p50-µs")
			b.ReportMetric(pct(idx, 0.99), "p99-µs")
			b.ReportMetric(pct(ref, 0.5), "match-p50-µs")
			b.ReportMetric(pct(ref, 0.99), "match-p99-µs")
		})
	}
}

// TestTranspose64 checks the bit transpose against its definition.
func TestTranspose64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 20 {
		var a, orig [64]uint64
		for i := range a {
			a[i] = rng.Uint64() & (rng.Uint64() | rng.Uint64()<<1)
		}
		orig = a
		transpose64(&a)
		for i := range 64 {
			for j := range 64 {
				if orig[i]>>j&1 != a[j]>>i&1 {
					t.Fatalf("bit %d of row %d is not bit %d of row %d", j, i, i, j)
				}
			}
		}
	}
}

// TestIndexHandsColumnsOver replaces 256 of 300 keyed summaries at once
// (as a push/pull's full copies do) with summaries whose words differ
// from the old ones by nothing, a few blocks, a rotation, or everything:
// one Match binds every replacement in its predecessor's column (only the
// differing bits rewritten; refilling stale columns would bind two words
// of them, 128, per call) and answers exactly as Summary.Match, then and
// after further writes.
func TestIndexHandsColumnsOver(t *testing.T) {
	p := Params{CapacityBlocks: 256, FalsePositiveRate: 0.01}
	tests := []struct {
		name    string
		replace func(rng *rand.Rand, i int, owner, other *Summary) *Summary
	}{
		{"equal", func(_ *rand.Rand, _ int, owner, _ *Summary) *Summary { return mustDecode(t, owner) }},
		{"a few more blocks", func(rng *rand.Rand, _ int, owner, _ *Summary) *Summary {
			owner.Add([]uint64{rng.Uint64(), rng.Uint64()})
			return mustDecode(t, owner)
		}},
		{"rotated", func(rng *rand.Rand, _ int, owner, _ *Summary) *Summary {
			for range 200 {
				owner.Add([]uint64{rng.Uint64()})
			}
			return mustDecode(t, owner)
		}},
		{"another summary", func(_ *rand.Rand, _ int, _, other *Summary) *Summary { return mustDecode(t, other) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			f := newIndexFixture(t, rng, 300, p)
			for range 3 {
				f.step(t, rng)
			}
			keys := make([]uint64, len(f.copies))
			for i := range keys {
				keys[i] = uint64(i) + 7
			}
			var x Index
			hints := make([]IndexHint, len(f.copies))
			var plan IndexPlan
			for range 3 {
				checkIndex(t, &x, f.copies, keys, hints, &plan, matchQueries(rng, f.held, 1), "binding")
			}
			for i := range 256 {
				f.copies[i] = tc.replace(rng, i, f.owners[i], f.owners[(i+1)%len(f.owners)])
			}
			plan.Forget()
			negs := 0
			for _, s := range f.copies {
				if s.negN.Load() != 0 {
					negs++
				}
			}
			q := matchQueries(rng, f.held, 1)[:1]
			if bound := checkIndex(t, &x, f.copies, keys, hints, &plan, q, "replaced"); bound != len(f.copies)-negs {
				t.Fatalf("%d of %d summaries bound after one Match", bound, len(f.copies)-negs)
			}
			if st := x.Stats(); st.Shards != 1 {
				t.Fatalf("%+v: want the 300 keys in one shard", st)
			}
			for i, s := range f.copies[:256] {
				s.Add([]uint64{uint64(i) << 20})
				if i%16 == 0 { // a negative record: hints must send it to Summary.Match
					s.Forget(f.held[0])
				}
			}
			// The same summaries, some now with a negative record: the
			// plan must send those to Summary.Match.
			checkIndex(t, &x, f.copies, keys, hints, &plan, matchQueries(rng, f.held, 4), "written after")
			checkIndex(t, &x, f.copies, keys, nil, nil, matchQueries(rng, f.held, 4), "without hints")
		})
	}
}

// TestIndexPlanAfterHandOver: a plan made for a set of summaries is not
// used once another caller's summary takes over the column of one of
// them (a newer copy of a replica's summary, under its key), though the
// set itself is the same: the old summary is no longer what the column
// holds.
func TestIndexPlanAfterHandOver(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	p := Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}
	f := newIndexFixture(t, rng, 300, p)
	for range 3 {
		f.step(t, rng)
	}
	keys := make([]uint64, len(f.copies))
	for i := range keys {
		keys[i] = uint64(i) + 11
	}
	var x Index
	old := slices.Clone(f.copies)
	var plan IndexPlan
	for range 3 {
		checkIndex(t, &x, old, keys, nil, &plan, matchQueries(rng, f.held, 1), "binding")
	}
	// Another caller's set: the same keys, each summary replaced by an
	// empty one (the columns are handed over).
	newer := make([]*Summary, len(old))
	for i := range newer {
		s, err := New(p, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		newer[i] = s
	}
	checkIndex(t, &x, newer, keys, nil, nil, matchQueries(rng, f.held, 2), "newer")
	// Chains the old summaries hold, so that the newer columns' answers
	// differ (the first query's planned call is the one at stake: the
	// unplanned call after it takes the columns back).
	checkIndex(t, &x, old, keys, nil, &plan, f.held[len(f.held)-8:], "the planned set after")
}
