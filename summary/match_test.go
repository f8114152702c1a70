package summary

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// refMatch is Match as a plain reference: the read lock, the generations
// tested one after the other, the same galloping and bisection. Any
// optimized Match (a lock-free read, another layout of the generations)
// must give exactly its answers; BenchmarkMatch1024Paired measures it
// against this one.
func refMatch(s *Summary, probes []Probe) int {
	if len(probes) == 0 {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	has := func(p Probe) bool {
		key := s.geo.key(p)
		base, bits := s.geo.locate(key)
		newer, older := s.words[s.cur], s.words[1-s.cur]
		if !test(newer, s.geo, base, bits) && !test(older, s.geo, base, bits) {
			return false
		}
		_, forgotten := s.neg[key]
		return !forgotten
	}
	if !has(probes[0]) {
		return 0
	}
	lo, step, hi := 0, 1, len(probes)
	for {
		next := lo + step
		if next >= len(probes) {
			break
		}
		if !has(probes[next]) {
			hi = next
			break
		}
		lo = next
		step *= 2
	}
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if has(probes[mid]) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo + 1
}

// matchQueries returns chained queries against what was added (held
// prefixes with new tails, whole chains, single blocks) and random ones.
func matchQueries(rng *rand.Rand, held [][]uint64, n int) [][]uint64 {
	var qs [][]uint64
	for range n {
		switch rng.IntN(4) {
		case 0: // random hashes
			q := make([]uint64, 1+rng.IntN(64))
			for i := range q {
				q[i] = rng.Uint64()
			}
			qs = append(qs, q)
		default: // a held chain's prefix, then new blocks
			if len(held) == 0 {
				continue
			}
			h := held[rng.IntN(len(held))]
			q := append([]uint64(nil), h[:rng.IntN(len(h)+1)]...)
			for range rng.IntN(40) {
				q = append(q, rng.Uint64())
			}
			if len(q) > 0 {
				qs = append(qs, q)
			}
		}
	}
	return qs
}

// TestMatchEqualsReference drives owners and their copies (full copies
// and deltas) through adds, forgets and rotations, and checks Match
// against refMatch on chained and random queries after every step.
func TestMatchEqualsReference(t *testing.T) {
	const c = 0x5eed
	for _, tc := range []struct {
		capacity int
		rate     float64
	}{{2, 0.01}, {64, 0.5}, {1000, 0.01}, {4096, 0.001}, {4096, 0.2}, {50_000, 1e-5}} {
		t.Run(fmt.Sprintf("cap%d-fp%g", tc.capacity, tc.rate), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.capacity), 7))
			owner, err := New(Params{CapacityBlocks: tc.capacity, FalsePositiveRate: tc.rate}, 3)
			if err != nil {
				t.Fatal(err)
			}
			cp, err := Decode(owner.AppendEncode(nil, c), c)
			if err != nil {
				t.Fatal(err)
			}
			var held [][]uint64
			forgets := 0
			for step := range 40 {
				h := make([]uint64, 1+rng.IntN(48))
				for i := range h {
					h[i] = rng.Uint64()
				}
				// Many blocks per step, so small summaries rotate often.
				for range 1 + rng.IntN(max(1, tc.capacity/200)) {
					h2 := append([]uint64(nil), h...)
					h2[len(h2)-1] = rng.Uint64()
					owner.Add(h2)
				}
				owner.Add(h)
				held = append(held, h)
				if step%5 == 4 && len(held) > 1 { // the engine lost a tail
					old := held[rng.IntN(len(held))]
					forgets += owner.Forget(old[len(old)/2:])
				}
				// The copy follows by delta when the log still has it,
				// else by a full copy.
				if enc, _, ok := owner.AppendDelta(nil, cp.Version()); ok {
					d, err := DecodeDelta(enc)
					if err != nil {
						t.Fatal(err)
					}
					if err := cp.ApplyDelta(d); err != nil {
						t.Fatal(err)
					}
				} else if cp, err = Decode(owner.AppendEncode(nil, c), c); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(cp.AppendEncode(nil, c), owner.AppendEncode(nil, c)) {
					t.Fatalf("step %d: copy differs from owner", step)
				}
				for _, q := range matchQueries(rng, held, 30) {
					p := MakeProbes(nil, q)
					for name, s := range map[string]*Summary{"owner": owner, "copy": cp} {
						if got, want := s.Match(p), refMatch(s, p); got != want {
							t.Fatalf("step %d %s: Match = %d, reference %d (query of %d blocks)", step, name, got, want, len(q))
						}
					}
				}
			}
			if forgets == 0 && tc.capacity >= 64 {
				t.Fatal("no forgets: the locked path went untested")
			}
		})
	}
}

// TestMatchLockFreeUnderWriters races Matches with an owner's adds and
// rotations (run with -race), then checks the quiescent answers.
func TestMatchUnderWriters(t *testing.T) {
	s, err := New(Params{CapacityBlocks: 256, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		t.Fatal(err)
	}
	held := chain(32, 1)
	s.Add(held)
	p := MakeProbes(nil, held)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 { // ~25 rotations
			s.Add(chain(64, uint64(i+2)))
		}
		close(stop)
	}()
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		if m := s.Match(p); m < 0 || m > len(p) {
			t.Fatalf("Match = %d", m)
		}
	}
	wg.Wait()
	for _, q := range [][]uint64{held, chain(64, 201), chain(64, 150)} {
		qp := MakeProbes(nil, q)
		if got, want := s.Match(qp), refMatch(s, qp); got != want {
			t.Fatalf("Match = %d, reference %d", got, want)
		}
	}
}

// BenchmarkMatch1024 is the summary side of one routing decision: the
// prefix match of a 32-block prompt (new, or held whole by one replica)
// on 1,024 replicas of 4,096 blocks holding 3,200 each, called through an
// interface as route.Policy.Pick does. "ref" is refMatch, measured in the
// same run.
func BenchmarkMatch1024(b *testing.B) {
	type matcher interface{ Match([]Probe) int }
	sums, held := summaries1024(b)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, impl := range []string{"ref", "match"} {
		ms := make([]matcher, len(sums))
		for i, s := range sums {
			ms[i] = s
			if impl == "ref" {
				ms[i] = refMatcherFunc(func(p []Probe) int { return refMatch(s, p) })
			}
		}
		for _, warm := range []bool{false, true} {
			name := impl + map[bool]string{false: "/new-32-blocks", true: "/held-32-blocks"}[warm]
			b.Run(name, func(b *testing.B) {
				hashes := make([]uint64, 32)
				probes := make([]Probe, 0, 32)
				i, sink := 0, 0
				for b.Loop() {
					if warm {
						copy(hashes, held[i%len(held)])
					} else {
						for j := range hashes {
							hashes[j] = rng.Uint64()
						}
					}
					i++
					probes = MakeProbes(probes[:0], hashes)
					for _, m := range ms {
						sink += m.Match(probes)
					}
				}
				_ = sink
			})
		}
	}
}

// BenchmarkMatch1024Paired is BenchmarkMatch1024's new prompts with the
// two implementations interleaved: each iteration times one pass of each
// over all summaries, in alternating order, with fresh probes for each so
// neither finds the other's lines in cache. On a shared, loaded machine
// this compares them under the same load; it reports the p50 and p99 of
// both passes.
func BenchmarkMatch1024Paired(b *testing.B) {
	sums, _ := summaries1024(b)
	rng := rand.New(rand.NewPCG(3, 4))
	var ref, opt []time.Duration
	hashes := make([]uint64, 32)
	probes := make([]Probe, 0, 32)
	pass := func(current bool) time.Duration {
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		probes = MakeProbes(probes[:0], hashes)
		t0 := time.Now()
		for _, s := range sums {
			if current {
				s.Match(probes)
			} else {
				refMatch(s, probes)
			}
		}
		return time.Since(t0)
	}
	i := 0
	for b.Loop() {
		first := i%2 == 0
		d1 := pass(first)
		d2 := pass(!first)
		if !first {
			d1, d2 = d2, d1
		}
		opt, ref = append(opt, d1), append(ref, d2)
		i++
	}
	pct := func(d []time.Duration, q float64) float64 {
		slices.Sort(d)
		return float64(d[int(q*float64(len(d)-1))].Nanoseconds()) / 1000
	}
	b.ReportMetric(pct(opt, 0.5), "p50-µs")
	b.ReportMetric(pct(opt, 0.99), "p99-µs")
	b.ReportMetric(pct(ref, 0.5), "ref-p50-µs")
	b.ReportMetric(pct(ref, 0.99), "ref-p99-µs")
}

type refMatcherFunc func([]Probe) int

func (f refMatcherFunc) Match(p []Probe) int { return f(p) }

// summaries1024 returns 1,024 summaries of 4,096 blocks, each holding 100
// random 32-block prompts (3,200 blocks), and the last prompt each holds.
func summaries1024(b *testing.B) (sums []*Summary, held [][]uint64) {
	rng := rand.New(rand.NewPCG(1, 2))
	sums, held = make([]*Summary, 1024), make([][]uint64, 1024)
	for i := range sums {
		s, err := New(Params{CapacityBlocks: 4096, FalsePositiveRate: DefaultFalsePositiveRate}, 1)
		if err != nil {
			b.Fatal(err)
		}
		h := make([]uint64, 32)
		for range 100 {
			for j := range h {
				h[j] = rng.Uint64()
			}
			s.Add(h)
		}
		sums[i], held[i] = s, h
	}
	return sums, held
}
