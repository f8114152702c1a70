package route

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/summary"
)

// fixedMatch is a Matcher that answers a fixed match, whatever the probes.
type fixedMatch int

func (f fixedMatch) Match([]summary.Probe) int { return int(f) }

// randomCandidates is a view of n candidates drawn to provoke the warm
// pass's edge cases: few distinct loads, block times and network costs,
// so that costs tie often; duplicate IDs (equal rendezvous weights, so
// that only the index breaks a tie); stale and summary-less candidates;
// full engines with known and unknown slots; matches of every length up
// to blocks, mostly short; a third of the replicas owned by the deciding
// router (the others far when they lack the prefix).
func randomCandidates(rng *rand.Rand, n, blocks int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		c := &cs[i]
		c.Detail = &Detail{ID: fmt.Sprintf("r%d", rng.IntN(n+n/8+1))}
		c.Hash = HashID(c.ID())
		c.InFlight = int32(rng.IntN(6))
		c.PendingPrefillBlocks = float64(rng.IntN(4)) * []float64{0, 0.5, 3, 40}[rng.IntN(4)]
		c.NetworkMs = []float64{0, 0, 0.3, 2, 7.5}[rng.IntN(5)]
		c.BlockMs = []float64{0, 0, 10, 20, 33.3}[rng.IntN(5)]
		c.Tier = []int8{0, 0, 0, 1}[rng.IntN(4)]
		c.Running, c.Waiting = int32(rng.IntN(5)), []int32{0, 0, 0, 1, 3}[rng.IntN(5)]
		c.Slots = []int32{0, 2, 4, 8}[rng.IntN(4)]
		if c.Slots == 0 { // seen running up to this many with nothing waiting
			c.MinSlots = []uint8{0, 0, 1, 3}[rng.IntN(4)]
		}
		c.Detail.SeqMs = []float64{0, 500, 4000}[rng.IntN(3)]
		c.Detail.SlotAgeMs = []float64{0, 0, 100, 6000}[rng.IntN(4)]
		c.Detail.Local = rng.IntN(3) == 0 // a third owned here: far candidates
		switch r := rng.IntN(20); {
		case r == 0:
			c.Stale = true
		case r == 1: // no summary
		default:
			m := 0
			switch k := rng.IntN(10); {
			case k < 5:
			case k < 8:
				m = rng.IntN(3)
			default:
				m = rng.IntN(blocks + 1)
			}
			c.Summary = fixedMatch(m)
		}
	}
	return cs
}

// TestPickSkipsOnlyWhatCannotWin checks that the pruned warm pass decides
// exactly as pricing every candidate in order does, over random candidate
// sets (and with an idle view, a loaded one, forked stems, concurrent
// requests and client keys), and that it is taken often enough for the
// comparison to mean something.
func TestPickSkipsOnlyWhatCannotWin(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	policies := []Policy{DefaultPolicy(), {LoadFactor: 1.25, InFlightFactor: 2, KeyBlocks: 2, MinExcessBlocks: 1,
		DefaultBlockMs: 20, RecomputeWeight: 1, DefaultSeqMs: 800}}
	rounds := 20000
	if testing.Short() || raceEnabled {
		rounds = 2000
	}
	warm := 0
	for round := range rounds {
		p := policies[round%len(policies)]
		n := pruneMin + rng.IntN(pruneMax-pruneMin+1)
		if round%5 == 0 {
			n = pruneMin + rng.IntN(64)
		}
		blocks := 1 + rng.IntN(40)
		cands := randomCandidates(rng, n, blocks)
		h := make([]uint64, blocks)
		for i := range h {
			h[i] = rng.Uint64()
		}
		req := Request{Hashes: h, Probes: summary.MakeProbes(nil, h), Root: 7}
		if rng.IntN(4) == 0 {
			req.Concurrent = 1 + rng.IntN(4)
		}
		if rng.IntN(4) == 0 {
			req.ForkBlocks = rng.IntN(blocks + 1)
		}
		if rng.IntN(8) == 0 {
			req.ClientKey = rng.Uint64()
		}
		want := p.pick(req, cands, nil)
		ms := make([]int32, len(cands))
		got := p.pick(req, cands, ms)
		if got != want {
			t.Fatalf("round %d (%d candidates, %d blocks, %+v): pruned %+v, every candidate priced %+v", round, n, blocks, req, got, want)
		}
		if pub := p.Pick(req, cands); pub != want {
			t.Fatalf("round %d: Pick %+v, every candidate priced %+v", round, pub, want)
		}
		if want.Reason == ReasonPrefix || want.Reason == ReasonSpill {
			warm++
		}
	}
	if warm < rounds/4 {
		t.Fatalf("only %d of %d decisions were warm", warm, rounds)
	}

	// A full tie that the pruned pass meets out of order: the holder of
	// the longest match (priced first) and, before it, a twin of it (the
	// same ID, so the same weight) lacking one block but nearer by
	// exactly that block's weighted recompute. Pricing in order keeps the
	// lower index.
	p := DefaultPolicy()
	cands := candidates(pruneMin)
	for i := range cands {
		cands[i].Summary = fixedMatch(0)
	}
	cands[3].Detail.ID, cands[3].Hash, cands[3].Summary = cands[9].ID(), cands[9].Hash, fixedMatch(4)
	cands[9].Summary = fixedMatch(5)
	cands[9].NetworkMs = p.RecomputeWeight * p.DefaultBlockMs
	req := request(chainOf(nil, 8, 1))
	want := p.pick(req, cands, nil)
	if got := p.pick(req, cands, make([]int32, len(cands))); got != want || want.Index != 3 {
		t.Fatalf("tie: pruned %+v, every candidate priced %+v (want index 3)", got, want)
	}
}

// BenchmarkPickPaired is one Pick over 1,024 candidates whose summaries
// answer at once (a batch's answers, as the mesh's Index gives them),
// every one holding a 1-block system prompt and one a 16-block
// conversation of the 32-block request, loads varied: the pruned warm
// pass and pricing every candidate, timed alternately, with their p50 and
// p99 (and the thread's CPU time on Linux), so a loaded machine weighs on
// both alike.
func BenchmarkPickPaired(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	cands := candidates(1024)
	for i := range cands {
		c := &cands[i]
		c.InFlight, c.Slots, c.PendingPrefillBlocks = int32(rng.IntN(6)), 8, float64(rng.IntN(3))
		c.Summary = fixedMatch(1)
	}
	cands[517].Summary = fixedMatch(16)
	h := make([]uint64, 32)
	for i := range h {
		h[i] = rng.Uint64()
	}
	req := Request{Hashes: h, Probes: summary.MakeProbes(nil, h), Root: 7}
	p := DefaultPolicy()
	var ms [pruneMax]int32
	var pruned, all [2][]time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		for k := range 2 {
			t0, c0 := time.Now(), threadcpu.OrWall()
			var d Decision
			if k == 0 {
				d = p.pick(req, cands, ms[:])
				pruned[0], pruned[1] = append(pruned[0], time.Since(t0)), append(pruned[1], threadcpu.OrWall()-c0)
			} else {
				d = p.pick(req, cands, nil)
				all[0], all[1] = append(all[0], time.Since(t0)), append(all[1], threadcpu.OrWall()-c0)
			}
			if d.Index != 517 {
				b.Fatalf("picked %d (%s)", d.Index, d.Reason)
			}
		}
	}
	reportQuantiles(b, "", pruned[0])
	reportQuantiles(b, "all-", all[0])
	reportQuantiles(b, "cpu-", pruned[1])
	reportQuantiles(b, "all-cpu-", all[1])
}

// reportQuantiles adds the p50 and p99 of ds, in µs, to the benchmark's
// metrics, their names prefixed.
func reportQuantiles(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1000 }
	b.ReportMetric(at(0.50), prefix+"p50-µs")
	b.ReportMetric(at(0.99), prefix+"p99-µs")
}

// TestCandidateSize holds route.Candidate at the 88 bytes its comment
// counts on (on 64-bit platforms): a field added to it is a kilobyte more
// per pass of a decision over a thousand replicas; put what a decision
// rarely reads in Detail.
func TestCandidateSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes counted for 64-bit platforms")
	}
	if got := unsafe.Sizeof(Candidate{}); got != 88 {
		t.Fatalf("Candidate is %d bytes, want 88", got)
	}
}

// BenchmarkPickHotPrefix is BenchmarkPickPaired's 1,024 candidates with
// the holder's prefill lane busy (a free slot, blocks queued), decided
// alternately for a lone request (Concurrent 0) and for one of a prefix
// that three requests want at once (Concurrent 3, one holder): the second
// takes the concurrent-copy rule's cheap weight, since no holder is idle
// (here it leaves the holder for an idle replica), and its warm pass
// prunes less. The two are timed side by side: 9.2 against 22 µs of CPU
// at p50 on the 2-core machine (2026-12-05).
func BenchmarkPickHotPrefix(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	cands := candidates(1024)
	for i := range cands {
		c := &cands[i]
		c.InFlight, c.Slots, c.PendingPrefillBlocks = int32(rng.IntN(6)), 8, float64(rng.IntN(3))
		c.Summary = fixedMatch(1)
	}
	cands[517].Summary, cands[517].InFlight, cands[517].PendingPrefillBlocks = fixedMatch(16), 2, 8
	h := make([]uint64, 32)
	for i := range h {
		h[i] = rng.Uint64()
	}
	p := DefaultPolicy()
	var ms [pruneMax]int32
	var cpu [2][]time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		for k, conc := range [2]int{0, 3} {
			req := Request{Hashes: h, Probes: summary.MakeProbes(nil, h), Root: 7, Concurrent: conc}
			c0 := threadcpu.OrWall()
			d := p.pick(req, cands, ms[:])
			cpu[k] = append(cpu[k], threadcpu.OrWall()-c0)
			if d.Index < 0 {
				b.Fatalf("Concurrent %d: no pick (%s)", conc, d.Reason)
			}
		}
	}
	reportQuantiles(b, "lone-cpu-", cpu[0])
	reportQuantiles(b, "hot-cpu-", cpu[1])
}
