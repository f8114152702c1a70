package summary

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkApplyDeltaIndexed is a router's gossip ingest at issue 9's
// scale point: 1,024 owners' deltas of 32 new blocks each (a new 32 KB
// prompt), applied to the copies of routers whose copies are all bound
// in their router's Index (as a router's are once it has decided), so
// every add also sets its bits in the Index's rows. Each router's rows
// and copies are ~19 MB, beyond a core's own caches, as they are in a
// router that also decides and encodes. It reports the apply's time per
// key, p50 and mean; "unbound" is the same copies without an Index.
func BenchmarkApplyDeltaIndexed(b *testing.B) {
	for _, indexed := range []bool{true, false} {
		b.Run(map[bool]string{true: "indexed", false: "unbound"}[indexed], func(b *testing.B) {
			benchApplyDelta(b, 4, indexed)
		})
	}
}

func benchApplyDelta(b *testing.B, routers int, indexed bool) {
	const n, blocks = 1024, 32
	p := Params{CapacityBlocks: 4096, FalsePositiveRate: DefaultFalsePositiveRate}
	rng := rand.New(rand.NewPCG(7, 8))
	owners := make([]*Summary, n)
	copies := make([][]*Summary, routers)
	idx := make([]Index, routers)
	h := make([]uint64, blocks)
	for i := range owners {
		s, err := New(p, uint64(i+1))
		if err != nil {
			b.Fatal(err)
		}
		for range 40 { // ~1,300 blocks held: a generation part full
			for j := range h {
				h[j] = rng.Uint64()
			}
			s.Add(h)
		}
		owners[i] = s
	}
	enc := make([]byte, 0, 1<<20)
	for r := range copies {
		copies[r] = make([]*Summary, n)
		for i, o := range owners {
			enc = o.AppendEncode(enc[:0], 1)
			c, err := Decode(enc, 1)
			if err != nil {
				b.Fatal(err)
			}
			copies[r][i] = c
		}
		if indexed {
			out := make([]int, n)
			probes := MakeProbes(nil, h)
			for range n/maxBindsPerMatch + 1 {
				idx[r].Match(out, copies[r], nil, probes)
			}
			if st := idx[r].Stats(); st.Columns != n {
				b.Fatalf("%d columns bound, want %d", st.Columns, n)
			}
		}
	}
	var took []time.Duration
	var total time.Duration
	keys := 0
	i := 0
	var buf []byte
	for b.Loop() {
		o := owners[i%n]
		for j := range h {
			h[j] = rng.Uint64()
		}
		from := o.Version()
		o.Add(h)
		buf, _, _ = o.AppendDelta(buf[:0], from)
		d, err := DecodeDelta(buf)
		if err != nil {
			b.Fatal(err)
		}
		for r := range copies {
			t0 := time.Now()
			if err := copies[r][i%n].ApplyDelta(d); err != nil {
				b.Fatal(err)
			}
			dt := time.Since(t0)
			took = append(took, dt)
			total += dt
		}
		keys += int(d.Count) * routers
		i++
	}
	slices.Sort(took)
	per := float64(blocks) // keys per delta (a rotation adds one entry, rarely)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/per, "p50-ns/key")
	b.ReportMetric(float64(total.Nanoseconds())/float64(max(keys, 1)), "mean-ns/key")
	b.ReportMetric(0, "ns/op")
}

// TestIndexMirrorsLargeWrites binds owners and copies, then writes
// through each path that mirrors into the Index: Add, ApplyDelta and
// Apply, each with hundreds of fresh bits and rotations in the middle,
// and checks that the Index answers as Summary.Match for the blocks
// added, those rotated out and new ones.
func TestIndexMirrorsLargeWrites(t *testing.T) {
	const n = IndexMinSummaries
	p := Params{CapacityBlocks: 256, FalsePositiveRate: 0.01} // a rotation every 192 adds
	rng := rand.New(rand.NewPCG(5, 6))
	f := newIndexFixture(t, rng, n, p)
	applied := make([]*Summary, n) // copies fed by Apply instead of ApplyDelta
	for i, s := range f.owners {
		applied[i] = mustDecode(t, s)
	}
	var owners, copies, apps Index
	all := [][]*Summary{f.owners, f.copies, applied}
	idx := []*Index{&owners, &copies, &apps}
	bind := func() {
		for k, sums := range all {
			for range n/maxBindsPerMatch + 1 {
				idx[k].Match(nil, sums, nil, MakeProbes(nil, chain(4, 1)))
			}
		}
	}
	bind()
	var held [][]uint64
	for round := range 3 {
		for i, s := range f.owners {
			from := s.Version()
			h := make([]uint64, 100+rng.IntN(200)) // 700-2,100 bits, 0-2 rotations
			for j := range h {
				h[j] = rng.Uint64()
			}
			s.Add(h)
			held = append(held, h[:8], h[len(h)-8:])
			d, _, ok := s.AppendDelta(nil, from)
			if !ok {
				t.Fatal("no delta")
			}
			dd, err := DecodeDelta(d)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.copies[i].ApplyDelta(dd); err != nil {
				t.Fatal(err)
			}
			es, ok := s.Since(from)
			if !ok {
				t.Fatal("no entries")
			}
			if err := applied[i].Apply(s.Epoch(), from, es); err != nil {
				t.Fatal(err)
			}
		}
		qs := append(matchQueries(rng, held, 40), held[len(held)-20:]...)
		for k, sums := range all {
			if got := checkIndex(t, idx[k], sums, nil, nil, nil, qs, fmt.Sprintf("round %d, side %d", round, k)); got != n {
				t.Fatalf("round %d, side %d: %d of %d summaries bound", round, k, got, n)
			}
		}
		bind()
	}
}
