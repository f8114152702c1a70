package summary

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Prototypes measured against refMatch, for the design record and for
// route (which calls Match per candidate): neither is used in production.

// interleaved is a summary's generations laid out block by block, newer
// then older (DESIGN.md's "interleave the two generations so one probe
// costs one miss"): a probe's two 64-byte blocks are one aligned 128-byte
// pair, which the adjacent-line prefetcher fetches together.
type interleaved struct {
	geo   geometry
	words []uint64
}

func interleave(s *Summary) interleaved {
	newer, older := s.words[s.cur], s.words[1-s.cur]
	w := make([]uint64, 2*len(newer))
	for b := 0; b < len(newer); b += 8 {
		copy(w[2*b:2*b+8], newer[b:b+8])
		copy(w[2*b+8:2*b+16], older[b:b+8])
	}
	return interleaved{geo: s.geo, words: w}
}

func (v interleaved) match(probes []Probe) int {
	has := func(p Probe) bool {
		key := v.geo.key(p)
		base, bits := v.geo.locate(key)
		return test(v.words, v.geo, 2*base, bits) || test(v.words, v.geo, 2*base+8, bits)
	}
	if len(probes) == 0 || !has(probes[0]) {
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

// BenchmarkMatch1024Prototypes is BenchmarkMatch1024Paired with three
// arms timed in rotating order per iteration, each on fresh new-prompt
// probes: refMatch per summary, the interleaved layout per summary, and
// the probe-major batch over all summaries. It checks that all three agree.
func BenchmarkMatch1024Prototypes(b *testing.B) {
	sums, _ := summaries1024(b)
	rng := rand.New(rand.NewPCG(3, 4))
	inter := make([]interleaved, len(sums))
	for i, s := range sums {
		inter[i] = interleave(s)
	}
	var batch protoBatch
	out := make([]int, 0, len(sums))
	lat := make([][]time.Duration, 3)
	hashes := make([]uint64, 32)
	probes := make([]Probe, 0, 32)
	check := MakeProbes(nil, chain(32, 99))
	for i, s := range sums { // agreement, on held and new prompts
		for _, q := range [][]Probe{check, MakeProbes(nil, chain(32, uint64(i)+1000))} {
			want := refMatch(s, q)
			if got := inter[i].match(q); got != want {
				b.Fatalf("interleaved: %d, reference %d", got, want)
			}
			if got := batch.Match(out[:0], sums[i:i+1], q)[0]; got != want {
				b.Fatalf("batch: %d, reference %d", got, want)
			}
		}
	}
	it := 0
	for b.Loop() {
		for k := range 3 {
			arm := (it + k) % 3
			for j := range hashes {
				hashes[j] = rng.Uint64()
			}
			probes = MakeProbes(probes[:0], hashes)
			t0 := time.Now()
			switch arm {
			case 0:
				for _, s := range sums {
					refMatch(s, probes)
				}
			case 1:
				for i := range inter {
					inter[i].match(probes)
				}
			case 2:
				out = batch.Match(out[:0], sums, probes)
			}
			lat[arm] = append(lat[arm], time.Since(t0))
		}
		it++
	}
	for arm, name := range []string{"ref", "interleaved", "batch"} {
		d := lat[arm]
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1000, name+"-p50-µs")
		b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1000, name+"-p99-µs")
	}
}

// protoBatch (a prototype for route, measured in
// BenchmarkMatch1024Prototypes) matches one request against many summaries probe-major: every
// summary's first probe, then every summary's next probe, and so on, each
// summary galloping then bisecting exactly as Match does. A decision over
// a thousand replicas is bound by cache misses; Match per summary puts an
// indirect call, its branches and the key derivation between one
// summary's loads and the next, while a round of Batch issues the loads of
// every summary back to back (they overlap) and derives each probe's
// block and bit positions once per geometry, not once per summary.
//
// The zero protoBatch is ready; reuse one (one goroutine at a time) to keep
// its scratch space.
type protoBatch struct {
	st   []batchState
	geos []geoLocs
}

type batchState struct {
	s          *Summary
	locs       []loc
	cur        int32
	lo, hi, t  int32 // probes[lo] held (lo -1: none yet), probes[hi] not; t is the next to test
	step       int32
	galloping  bool
	fallback   bool
	done       bool
	matchFinal int32
}

// loc is a probe's place in one geometry: its block's first word and its
// bit positions.
type loc struct{ base, bits uint64 }

type geoLocs struct {
	g    geometry
	locs []loc
}

// Match appends to dst, for each summary of sums, the value of
// sums[i].Match(probes) (0 for a nil summary).
func (b *protoBatch) Match(dst []int, sums []*Summary, probes []Probe) []int {
	start := len(dst)
	for range sums {
		dst = append(dst, 0)
	}
	out := dst[start:]
	n := int32(len(probes))
	if n == 0 {
		return dst
	}
	b.st, b.geos = b.st[:0], b.geos[:0]
	active := 0
	for i, s := range sums {
		b.st = append(b.st, batchState{s: s, done: true})
		if s == nil {
			continue
		}
		if len(s.neg) != 0 {
			b.st[i].fallback = true
			continue
		}
		b.st[i] = batchState{s: s, locs: b.locsOf(s.geo, probes), cur: int32(s.cur),
			lo: -1, hi: n, t: 0, step: 1, galloping: true}
		active++
	}
	for active > 0 {
		for i := range b.st {
			st := &b.st[i]
			if st.done {
				continue
			}
			l := st.locs[st.t]
			if st.s.heldAt(st.cur, l) {
				st.lo = st.t
			} else {
				st.hi = st.t
				st.galloping = false
			}
			switch {
			case st.lo < 0: // the first probe is not held
				st.done = true
			case st.galloping:
				st.t = st.lo + st.step
				st.step *= 2
				if st.t < n {
					continue
				}
				st.galloping = false
				fallthrough
			default:
				if st.hi-st.lo > 1 {
					st.t = int32(uint32(st.lo+st.hi) >> 1)
					continue
				}
				st.done = true
			}
			st.matchFinal = st.lo + 1
			active--
		}
	}
	for i := range b.st {
		st := &b.st[i]
		switch {
		case st.s == nil:
		case st.fallback:
			out[i] = st.s.Match(probes)
		default:
			out[i] = int(st.matchFinal)
		}
	}
	return dst
}

// locsOf returns the probes' locations in geometry g, derived once per
// geometry per batch.
func (b *protoBatch) locsOf(g geometry, probes []Probe) []loc {
	for i := range b.geos {
		if b.geos[i].g == g {
			return b.geos[i].locs
		}
	}
	var locs []loc
	if len(b.geos) < cap(b.geos) {
		locs = b.geos[:len(b.geos)+1][len(b.geos)].locs[:0]
	}
	for _, p := range probes {
		base, bits := g.locate(g.key(p))
		locs = append(locs, loc{base, bits})
	}
	b.geos = append(b.geos, geoLocs{g: g, locs: locs})
	return locs
}

// heldAt is a probe test at a precomputed location (read lock not taken:
// a prototype for single-threaded benchmarks only).
func (s *Summary) heldAt(cur int32, l loc) bool {
	return test(s.words[cur], s.geo, l.base, l.bits) || test(s.words[1-cur], s.geo, l.base, l.bits)
}
