package route

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/summary"
)

// tableMatcher is a BatchMatcher answering fixed matches, counting its
// calls.
type tableMatcher struct {
	ms    []int
	calls int
}

func (t *tableMatcher) MatchBatch(dst []int, _ []summary.Probe) []int {
	t.calls++
	return append(dst[:0], t.ms...)
}

// TestPickReadsBatchCells decides over random views twice, once with
// each summary a fixed matcher and once with the same matches as cells
// of two Batches (candidates of one batch interleaved with the other's,
// as a view that mixes batched and unbatched candidates would be): the
// decisions are the same, each batch is asked once per new probes, and a
// cell asked alone answers what Pick read.
func TestPickReadsBatchCells(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	p := DefaultPolicy()
	var batches [2]Batch
	for round := range 300 {
		// Prompts past 64 blocks too: Pick's loop without calls hands a
		// match past its histogram to the general loop.
		n, blocks := 1+rng.IntN(200), 1+rng.IntN([]int{40, 100}[round%2])
		plain := randomCandidates(rng, n, blocks)
		batched := make([]Candidate, n)
		copy(batched, plain)
		var srcs [2]tableMatcher
		which := make([]int, n)
		for i := range batched {
			if f, ok := batched[i].Summary.(fixedMatch); ok {
				w := rng.IntN(2)
				if round%3 == 0 { // one batch, as the mesh's candidates
					w = 0
				}
				which[i] = len(srcs[w].ms)
				srcs[w].ms = append(srcs[w].ms, int(f))
				batched[i].Summary = fixedMatch(-1 - w) // which batch, resolved below
			}
		}
		for w := range batches {
			batches[w].Reset(&srcs[w], len(srcs[w].ms))
		}
		for i := range batched {
			if f, ok := batched[i].Summary.(fixedMatch); ok {
				batched[i].Summary = batches[-1-int(f)].Cell(which[i])
			}
		}
		hashes := make([]uint64, blocks)
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		req := Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: 1}
		if got, want := p.Pick(req, batched), p.Pick(req, plain); got != want {
			t.Fatalf("round %d: Pick over cells %+v, over fixed matchers %+v", round, got, want)
		}
		for w := range srcs {
			if len(srcs[w].ms) > 0 && srcs[w].calls != 1 {
				t.Fatalf("round %d: batch %d asked %d times, want once", round, w, srcs[w].calls)
			}
		}
		for i := range batched {
			if batched[i].Summary == nil {
				continue
			}
			if got, want := batched[i].Summary.Match(req.Probes), plain[i].Summary.Match(req.Probes); got != want {
				t.Fatalf("round %d candidate %d: cell answers %d, want %d", round, i, got, want)
			}
		}
		if srcs[0].calls > 1 || srcs[1].calls > 1 {
			t.Fatalf("round %d: a batch asked again for the same probes", round)
		}
	}
}

// TestAdmitsCold holds admitsCold, which hashPick asks of every
// candidate, to admits under cold limits, over random candidates and
// limits (a NaN and infinite work bound among them).
func TestAdmitsCold(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for round := range 200 {
		cands := randomCandidates(rng, 64, 8)
		for i := range cands {
			cands[i].match = int32(rng.IntN(9))
			cands[i].Held = int32(rng.IntN(3)) // empty, the common prefix's one block, more
		}
		lim := limits{inFlight: rng.IntN(8), queued: rng.IntN(4), blocks: 8, cold: true,
			work: []float64{0, 0.5, 3, 50, math.Inf(1), math.NaN()}[rng.IntN(6)]}
		for i := range cands {
			if got, want := lim.admitsCold(&cands[i]), lim.admits(&cands[i]); got != want {
				t.Fatalf("round %d: admitsCold(%+v) = %v under %+v, admits %v", round, cands[i], got, lim, want)
			}
		}
	}
}

// TestScanCold holds hashPick's scan for an unstale view without a hot
// prompt to the general one's first pass.
func TestScanCold(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	p := DefaultPolicy()
	for round := range 500 {
		cands := randomCandidates(rng, 1+rng.IntN(64), 8)
		for i := range cands {
			cands[i].Stale = false
			cands[i].match = int32(rng.IntN(9))
		}
		if round%3 == 0 { // many equal waits: the ties' order
			for i := range cands {
				cands[i].PendingPrefillBlocks = 0
			}
		}
		lim := limits{inFlight: rng.IntN(8), queued: rng.IntN(4), blocks: 8, cold: true,
			work: []float64{0, 0.5, 3, 50, math.Inf(1), math.NaN()}[rng.IntN(6)]}
		tier, key, defBm := rng.IntN(2), rng.Uint64(), []float64{10, 0, math.NaN()}[rng.IntN(3)]
		common := rng.IntN(2)
		f, s, s2 := scanCold(cands, tier, key, lim.work, lim.inFlight, int32(common), defBm)
		for pass := range 2 {
			cf := coldFilter{lim: lim, tier: tier, common: common, holdersOnly: pass == 0}
			wf, ws, ws2 := p.scanColdAll(cands, cf, key, defBm)
			if f != wf || s != ws || s2 != ws2 {
				t.Fatalf("round %d pass %d: scanCold = %d, %d, %d; scanColdAll %d, %d, %d", round, pass, f, s, s2, wf, ws, ws2)
			}
		}
	}
}
