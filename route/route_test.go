package route

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/summary"
)

// held builds a real summary holding the given chains.
func held(t testing.TB, chains ...[]uint64) *summary.Summary {
	t.Helper()
	s, err := summary.New(summary.Params{CapacityBlocks: 10000, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		s.Add(c)
	}
	return s
}

func chainOf(prefix []uint64, n int, seed uint64) []uint64 {
	out := append([]uint64(nil), prefix...)
	for i := 0; i < n; i++ {
		out = append(out, seed<<20+uint64(i)+1)
	}
	return out
}

func request(h []uint64) Request {
	return Request{Hashes: h, Probes: summary.MakeProbes(nil, h), Root: 7}
}

func candidates(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i].Detail = &Detail{ID: fmt.Sprintf("http://replica-%d:8000", i)}
		c[i].Hash = HashID(c[i].ID())
	}
	return c
}

func TestPickPrefersTheHolder(t *testing.T) {
	system := chainOf(nil, 1, 1)   // everyone holds it
	conv := chainOf(system, 10, 2) // only replica 2 holds it
	next := chainOf(conv, 5, 3)    // the next turn
	cs := candidates(4)
	for i := range cs {
		cs[i].Summary = held(t, system)
	}
	cs[2].Summary = held(t, conv)
	d := DefaultPolicy().Pick(request(next), cs)
	if d.Index != 2 || d.Reason != ReasonPrefix || d.Match != 11 || d.CommonMatch != 1 {
		t.Fatalf("decision %+v, want replica 2 by prefix with match 11 over common 1", d)
	}
}

func TestPickSpillsFromAnOverloadedHolder(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	cs := candidates(4)
	for i := range cs {
		cs[i].Summary = held(t)
	}
	cs[1].Summary = held(t, conv)
	cs[3].Summary = held(t, conv[:6])
	cs[1].InFlight, cs[1].Running, cs[1].Waiting = 10, 4, 6 // the engine queues: bound ceil(2*7/4)=4 on its queue
	cs[0].InFlight = 1
	cs[2].InFlight = 1
	d := DefaultPolicy().Pick(request(chainOf(conv, 3, 4)), cs)
	if d.Index != 3 {
		t.Fatalf("decision %+v, want a move to the other holder (3)", d)
	}
	// Nobody else holds it: spill to anyone under the bound.
	cs[3].Summary = held(t)
	d = DefaultPolicy().Pick(request(chainOf(conv, 3, 4)), cs)
	if d.Index == 1 {
		t.Fatalf("decision %+v, want a move away from 1", d)
	}
}

func TestPickFallsBack(t *testing.T) {
	system := chainOf(nil, 1, 1)
	req := request(chainOf(system, 8, 9))
	tests := []struct {
		name  string
		setup func(cs []Candidate)
		want  Reason
	}{
		{"no summaries", func(cs []Candidate) {}, ReasonFallbackCold},
		{"all stale", func(cs []Candidate) {
			for i := range cs {
				cs[i].Stale = true
			}
		}, ReasonFallbackStale},
		{"only the common prefix", func(cs []Candidate) {
			for i := range cs {
				cs[i].Summary = held(t, system)
			}
		}, ReasonFallbackCold},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(8)
			tc.setup(cs)
			d := DefaultPolicy().Pick(req, cs)
			if d.Reason != tc.want {
				t.Fatalf("reason %s, want %s", d.Reason, tc.want)
			}
		})
	}
}

// Two routers that cannot talk, with the same view of load and no
// summaries, place every cold request on the same replica, and requests
// that share a prefix beyond the key land together.
func TestFallbackAgreesAcrossIndependentRouters(t *testing.T) {
	routerA, routerB := DefaultPolicy(), DefaultPolicy()
	viewA, viewB := candidates(16), candidates(16)
	// B lists the replicas in another order: order must not matter.
	for i, j := 0, len(viewB)-1; i < j; i, j = i+1, j-1 {
		viewB[i], viewB[j] = viewB[j], viewB[i]
	}
	spread := map[string]int{}
	for conv := uint64(0); conv < 200; conv++ {
		first := chainOf(nil, 3, conv+100)
		a := routerA.Pick(request(first), viewA)
		b := routerB.Pick(request(first), viewB)
		if viewA[a.Index].ID() != viewB[b.Index].ID() {
			t.Fatalf("conversation %d: routers disagree (%s vs %s)", conv, viewA[a.Index].ID(), viewB[b.Index].ID())
		}
		later := routerB.Pick(request(chainOf(first, 5, conv+1000)), viewB)
		if viewB[later.Index].ID() != viewA[a.Index].ID() {
			t.Fatalf("conversation %d: a later turn hashed elsewhere", conv)
		}
		spread[viewA[a.Index].ID()]++
	}
	if len(spread) < 14 {
		t.Fatalf("200 cold conversations used only %d of 16 replicas", len(spread))
	}
}

func TestFallbackRespectsTheLoadBound(t *testing.T) {
	cs := candidates(4)
	req := request(chainOf(nil, 3, 1))
	first := DefaultPolicy().Pick(req, cs).Index
	cs[first].InFlight = 5 // bound ceil(1.25*6/4) = 2
	d := DefaultPolicy().Pick(req, cs)
	if d.Index == first {
		t.Fatal("picked a replica over the load bound")
	}
}

func TestFallbackStaysInTheNearestTier(t *testing.T) {
	cs := candidates(6)
	for i := 3; i < 6; i++ {
		cs[i].Tier = 1
	}
	for s := uint64(0); s < 50; s++ {
		if d := DefaultPolicy().Pick(request(chainOf(nil, 2, s)), cs); d.Index >= 3 {
			t.Fatalf("cold request placed in a far tier (%d)", d.Index)
		}
	}
}

func TestPickIsDeterministicAndHandlesEmpty(t *testing.T) {
	if d := DefaultPolicy().Pick(request(nil), nil); d.Index != -1 || d.Reason != ReasonNone {
		t.Fatalf("no candidates: %+v", d)
	}
	cs := candidates(5)
	d := DefaultPolicy().Pick(Request{Root: 3}, cs)
	for i := 0; i < 10; i++ {
		if again := DefaultPolicy().Pick(Request{Root: 3}, cs); again != d {
			t.Fatalf("same input, different decision: %+v vs %+v", again, d)
		}
	}
}

// A holder keeps a warm request until its queued prefill costs more than
// recomputing the missing blocks elsewhere, weighted by RecomputeWeight.
func TestPickWeighsQueueAgainstRecompute(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	req := request(chainOf(conv, 2, 5)) // 12 blocks, 10 held by replica 0
	cs := candidates(4)
	for i := range cs {
		cs[i].Summary = held(t)
	}
	cs[0].Summary = held(t, conv)
	w := DefaultPolicy().RecomputeWeight
	tests := []struct {
		pending float64
		holder  bool
	}{
		{0, true},
		{w * 9, true},   // 9w+2w < 12w
		{w * 11, false}, // 11w+2w > 12w
	}
	for _, tc := range tests {
		cs[0].PendingPrefillBlocks = tc.pending
		d := DefaultPolicy().Pick(req, cs)
		if (d.Index == 0) != tc.holder || d.Reason != ReasonPrefix {
			t.Errorf("holder queue %v blocks: decision %+v, want holder=%v", tc.pending, d, tc.holder)
		}
	}
}

// Cold requests are held to the queued-prefill bound; with every summary
// fresh they take the shortest wait, ties in rendezvous order.
func TestColdPlacementFollowsLoadOnlyWhenAllIsFresh(t *testing.T) {
	req := request(chainOf(nil, 4, 9))
	cs := candidates(6)
	first := DefaultPolicy().Pick(req, cs).Index // no summaries: strict
	cs[first].PendingPrefillBlocks = 3
	if d := DefaultPolicy().Pick(req, cs); d.Index != first {
		t.Fatalf("without summaries a small queue moved the cold request (%d, want %d)", d.Index, first)
	}
	for i := range cs {
		cs[i].Summary = held(t)
	}
	if d := DefaultPolicy().Pick(req, cs); d.Index == first || d.Reason != ReasonFallbackCold {
		t.Fatalf("with fresh summaries: %+v, want the second choice", d)
	}
	cs[first].PendingPrefillBlocks = 0
	if d := DefaultPolicy().Pick(req, cs); d.Index != first {
		t.Fatalf("equal queues: %d, want the first choice %d", d.Index, first)
	}
}

// A stale replica's cache and load are unknown: if consistent hashing
// names it, the request goes there (as on routers that know as little), and
// its old load does not hold it back.
func TestStaleHomeFallsBackToHashing(t *testing.T) {
	system := chainOf(nil, 1, 1)
	cs := candidates(6)
	req := request(chainOf(system, 6, 77))
	home := DefaultPolicy().Pick(req, cs).Index
	for i := range cs {
		cs[i].Summary = held(t, system)
	}
	other := (home + 1) % len(cs)
	cs[other].Summary = held(t, chainOf(system, 3, 77)) // a fresh partial holder
	cs[home].Summary, cs[home].Stale, cs[home].InFlight = nil, true, 50
	d := DefaultPolicy().Pick(req, cs)
	if d.Index != home || d.Reason != ReasonFallbackStale {
		t.Fatalf("decision %+v, want the stale home %d by fallback-stale", d, home)
	}
	// When the home is fresh the partial holder wins by prefix.
	cs[home].Summary, cs[home].Stale, cs[home].InFlight = held(t, system), false, 0
	if d := DefaultPolicy().Pick(req, cs); d.Index != other || d.Reason != ReasonPrefix {
		t.Fatalf("decision %+v, want the partial holder %d by prefix", d, other)
	}
}

func TestCommonPrefixVote(t *testing.T) {
	tests := []struct {
		hist  []int32
		fresh int
		want  int
	}{
		{[]int32{0, 8}, 8, 1},             // everyone holds block 0
		{[]int32{3, 5}, 8, 1},             // a majority does
		{[]int32{5, 3}, 8, 0},             // a minority does
		{[]int32{0, 4, 0, 4}, 8, 3},       // half hold three blocks
		{[]int32{0, 5, 0, 3}, 8, 1},       // a minority holds three
		{[]int32{1, 1}, 2, 0},             // of two replicas, one holder is not common
		{[]int32{0, 2}, 2, 1},             // both are
		{[]int32{1, 0, 0, 0, 0, 0}, 1, 0}, // nobody holds anything
		{nil, 0, 0},
	}
	for _, tc := range tests {
		h := make([]int32, 65)
		copy(h, tc.hist)
		if got := commonPrefix(h, nil, tc.fresh); got != tc.want {
			t.Errorf("hist %v: common %d, want %d", tc.hist, got, tc.want)
		}
	}
}

// With no global system prompt, a cold key is still deep enough to tell
// conversations apart, and the same whether or not summaries exist.
func TestColdKeyDoesNotDependOnTheView(t *testing.T) {
	p := DefaultPolicy()
	r := request(chainOf(chainOf(nil, 1, 1), 6, 3))
	if p.key(r, 0) != p.key(r, 1) {
		t.Fatal("a one-block common prefix moves the key")
	}
	if p.key(r, 4) != r.Hashes[4] || p.key(request(r.Hashes[:1]), 0) != r.Hashes[0] {
		t.Fatal("key is not the block after the common prefix, nor the last block of a short prompt")
	}
}

// A prompt of no full block is keyed by its whole text, cold and hot,
// and by its root when that is unknown.
func TestShortPromptKey(t *testing.T) {
	p := DefaultPolicy()
	short := Request{Root: 7, Whole: 99}
	if p.key(short, 0) != 99 || p.HeatKey(short) != 99 {
		t.Fatalf("short prompt keyed %d, heat %d; want its Whole hash", p.key(short, 0), p.HeatKey(short))
	}
	if r := (Request{Root: 7}); p.key(r, 0) != 7 || p.HeatKey(r) != 7 {
		t.Fatal("a short prompt of unknown text is not keyed by its root")
	}
	long := request(chainOf(nil, 3, 1))
	long.Whole = 99
	if p.key(long, 0) == 99 || p.HeatKey(long) == 99 {
		t.Fatal("a prompt of full blocks is keyed by its Whole hash")
	}
}

// The chat of issue 7: 4 replicas running 4 sequences each, 3 requests in
// the cluster. A conversation's second turn stays on the replica holding
// it while that replica can start it, however the in-flight count looks
// against the mean.
func TestSecondTurnStaysWhileTheHolderCanStartIt(t *testing.T) {
	system := chainOf(nil, 1, 1)
	conv := chainOf(system, 3, 2)
	next := request(chainOf(conv, 2, 3))
	tests := []struct {
		name     string
		inFlight []int // holder is replica 0
		slots    int
		waiting  int
		want     int
		reason   Reason
	}{
		{"slots known, holder runs 2 of 4", []int{2, 1, 0, 0}, 4, 0, 0, ReasonPrefix},
		{"slots known, holder runs 3 of 4", []int{3, 0, 0, 0}, 4, 0, 0, ReasonPrefix},
		{"slots unknown, nothing waiting", []int{2, 1, 0, 0}, 0, 0, 0, ReasonPrefix},
		{"slots unknown, 3 in flight on the holder", []int{3, 0, 0, 0}, 0, 0, 0, ReasonPrefix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary = held(t, system)
				cs[i].InFlight, cs[i].Slots, cs[i].Running = int32(tc.inFlight[i]), int32(tc.slots), int32(tc.inFlight[i])
			}
			cs[0].Summary = held(t, conv)
			cs[0].Waiting = int32(tc.waiting)
			d := DefaultPolicy().Pick(next, cs)
			if d.Index != tc.want || d.Reason != tc.reason {
				t.Fatalf("decision %+v, want replica %d by %s", d, tc.want, tc.reason)
			}
		})
	}
}

// A holder whose slots are full keeps a warm request only while the wait
// for a slot costs less than recomputing elsewhere (both weighted by
// RecomputeWeight, so the comparison is plain time); the move goes to the
// next holder first.
func TestPickSpillsWhenTheHolderQueuesForSlots(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	req := request(chainOf(conv, 2, 5)) // 12 blocks
	tests := []struct {
		name        string
		seqMs       float64
		otherHolder bool
		want        int
		reason      Reason
	}{
		// 1 ahead × 100 ms / 4 slots = 25 ms < 10 blocks × 20 ms (and
		// 5 in flight is within the guard, ceil(2 × (4+6+4) / 4) = 7).
		{"short wait: stay", 100, false, 0, ReasonPrefix},
		// 1 ahead × 40 s / 4 = 10 s > 200 ms: move to anyone free.
		{"long wait: move", 40000, false, -1, ReasonPrefix},
		// Replica 3 holds 8 of the blocks: it recomputes least.
		{"long wait: next holder first", 40000, true, 3, ReasonPrefix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].InFlight = held(t), 4, tc.seqMs, 2
			}
			cs[0].Summary, cs[0].InFlight = held(t, conv), 4
			if tc.otherHolder {
				cs[3].Summary = held(t, conv[:8])
			}
			d := DefaultPolicy().Pick(req, cs)
			if tc.want >= 0 && d.Index != tc.want || tc.want < 0 && d.Index == 0 || d.Reason != tc.reason {
				t.Fatalf("decision %+v, want replica %d (-1: not 0) by %s", d, tc.want, tc.reason)
			}
		})
	}
}

// At a one-slot holder running a request past the mean slot time, the age
// alone says the slot frees at once (the mean less the age), and the
// request would queue behind what is, with heavy-tailed answers, a long
// decode. The owner's estimate of when it ends (Detail.FreeMs) is what
// the wait is priced by: a long one sends the request to an idle replica,
// a short one keeps it.
func TestPickPricesTheOwnersEstimateOfTheRunningAnswer(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	req := request(chainOf(conv, 2, 5)) // 12 blocks; a move recomputes 10
	for _, tc := range []struct {
		name   string
		freeMs float64
		stay   bool
	}{
		{"age only", 0, true},
		{"owner expects it to end soon", 500, true},
		// 30 s > 16 × 10 blocks × 20 ms = 3.2 s.
		{"owner expects a long answer", 30000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A busy cluster (29 of 32 slots taken), so that a copy
			// weighs nearly RecomputeWeight (TestPickWeighsACopyByTheSlotsInUse).
			cs := candidates(8)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].InFlight, cs[i].Detail.SeqMs = held(t), 4, 3, 1000
			}
			cs[0].Summary, cs[0].InFlight = held(t, conv), 4
			cs[0].Detail.SlotAgeMs, cs[0].Detail.FreeMs = 3000, tc.freeMs
			d := DefaultPolicy().Pick(req, cs)
			if (d.Index == 0) != tc.stay {
				t.Fatalf("decision %+v, want stay at 0: %v", d, tc.stay)
			}
		})
	}
}

// A holder whose slots are all taken, expected to free one in 1.5 s: on
// a cluster of idle replicas the request moves (recomputing 10 blocks
// costs it 200 ms, and the others little: few compete for the slots); on
// a cluster whose slots are mostly taken the copy keeps nearly its full
// weight (about RecomputeWeight × 200 ms, against the wait and the
// holder's own 2 blocks) and it stays.
func TestPickWeighsACopyByTheSlotsInUse(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	req := request(chainOf(conv, 2, 5)) // 12 blocks; a move recomputes 10
	for _, tc := range []struct {
		name         string
		slots, other int32 // every replica's slots; in flight at the non-holders
		stay         bool
	}{
		{"idle cluster: move", 1, 0, false},
		{"busy cluster: stay", 4, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(8)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].InFlight, cs[i].Detail.SeqMs = held(t), tc.slots, tc.other, 1000
			}
			cs[0].Summary, cs[0].InFlight = held(t, conv), tc.slots
			cs[0].Detail.SlotAgeMs, cs[0].Detail.FreeMs = 500, 1500
			d := DefaultPolicy().Pick(req, cs)
			if (d.Index == 0) != tc.stay {
				t.Fatalf("decision %+v, want stay at 0: %v", d, tc.stay)
			}
		})
	}
}

func TestSlotEstimate(t *testing.T) {
	tests := []struct {
		name    string
		scrapes [][2]int // running, waiting
		want    int
	}{
		{"never queued: unknown", [][2]int{{1, 0}, {3, 0}, {2, 0}}, 0},
		{"queued at 4", [][2]int{{1, 0}, {4, 2}, {2, 0}}, 4},
		{"ran more than the estimate", [][2]int{{4, 1}, {6, 0}}, 6},
		{"queue with nothing running says nothing", [][2]int{{0, 3}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var e SlotEstimate
			for _, s := range tc.scrapes {
				e = e.Observe(s[0], s[1])
			}
			if e.Slots != tc.want {
				t.Fatalf("slots %d, want %d", e.Slots, tc.want)
			}
		})
	}
}

func TestKeepHint(t *testing.T) {
	tests := []struct {
		name     string
		inFlight int
		slots    int
		waiting  int
		pending  float64
		want     bool
	}{
		{"free slot", 3, 4, 0, 0, true},
		{"slots full", 4, 4, 0, 0, false},
		{"unknown slots, engine queues", 2, 0, 1, 0, false},
		{"unknown slots, nothing waiting", 2, 0, 0, 0, true},
		// The others queue 10 blocks each: mean (40+30)/4 = 17.5, bound 21.9.
		{"prefill queue far over the mean", 1, 4, 0, 40, false},
		{"prefill queue within the bound", 1, 4, 0, 12, true}, // mean 10.5, bound 13.1
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			cs[0].InFlight, cs[0].Slots, cs[0].Waiting, cs[0].Running = int32(tc.inFlight), int32(tc.slots), int32(tc.waiting), int32(tc.inFlight)
			cs[0].PendingPrefillBlocks = tc.pending
			for i := 1; i < len(cs); i++ {
				cs[i].PendingPrefillBlocks = 10
			}
			if got := DefaultPolicy().KeepHint(cs, 0); got != tc.want {
				t.Fatalf("KeepHint = %v, want %v", got, tc.want)
			}
		})
	}
}

// Cold placement skips a replica that would queue the request for a slot
// and one lacking the prefix half the replicas hold (a hot prompt).
func TestColdPlacementSkipsFullReplicasAndNonHolders(t *testing.T) {
	hot := chainOf(nil, 6, 1)
	req := request(chainOf(hot, 1, 9))
	cs := candidates(4)
	for i := range cs {
		cs[i].Slots = 4
	}
	first := DefaultPolicy().Pick(req, cs).Index
	cs[first].InFlight = 4
	if d := DefaultPolicy().Pick(req, cs); d.Index == first {
		t.Fatalf("cold request placed on a replica with no free slot: %+v", d)
	}
	cs[first].InFlight = 0
	for i := range cs {
		cs[i].Summary = held(t)
	}
	holders := map[int]bool{(first + 1) % 4: true, (first + 2) % 4: true}
	for i := range holders {
		cs[i].Summary = held(t, hot)
	}
	d := DefaultPolicy().Pick(req, cs)
	if !holders[d.Index] || d.Reason != ReasonFallbackCold || d.CommonMatch != 6 {
		t.Fatalf("decision %+v, want a holder of the hot prompt %v by fallback-cold", d, holders)
	}
}

// A client routing key places every request of the client alike on
// routers that see no summaries, whatever the prompts: the cold key is the
// client's.
func TestClientKeyPlacesAlikeAcrossRouters(t *testing.T) {
	viewA, viewB := candidates(8), candidates(8)
	for i, j := 0, len(viewB)-1; i < j; i, j = i+1, j-1 {
		viewB[i], viewB[j] = viewB[j], viewB[i]
	}
	for k := uint64(1); k <= 50; k++ {
		a := request(chainOf(nil, 4, k))
		b := request(chainOf(nil, 6, k+1000)) // another prompt, same client
		a.ClientKey, b.ClientKey = k*7919, k*7919
		da, db := DefaultPolicy().Pick(a, viewA), DefaultPolicy().Pick(b, viewB)
		if viewA[da.Index].ID() != viewB[db.Index].ID() || da.Key != a.ClientKey {
			t.Fatalf("client %d: %s vs %s (key %x)", k, viewA[da.Index].ID(), viewB[db.Index].ID(), da.Key)
		}
	}
}

// One block of summary match beyond the common prefix (what a single
// false positive produces) does not override a client key; two do, and
// without a key one does.
func TestClientKeyNeedsTwoBlocksOfEvidence(t *testing.T) {
	prompt := chainOf(nil, 2, 77)
	for _, tc := range []struct {
		name    string
		key     uint64
		held    int // blocks of prompt held by candidate 0's summary
		warm    bool
		atFirst bool // the decision goes to candidate 0
	}{
		{"key, one block", 7919, 1, false, false},
		{"key, two blocks", 7919, 2, true, true},
		{"no key, one block", 0, 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(8)
			for i := range cs {
				cs[i].Summary = held(t)
			}
			req := request(prompt)
			req.ClientKey = tc.key
			home := DefaultPolicy().Pick(req, cs) // every summary empty: by the key alone
			if home.Index == 0 {
				cs[0], cs[1] = cs[1], cs[0] // make candidate 0 another than the key's home
				home = DefaultPolicy().Pick(req, cs)
			}
			cs[0].Summary = held(t, prompt[:tc.held])
			d := DefaultPolicy().Pick(req, cs)
			if warm := d.Reason != ReasonFallbackCold; warm != tc.warm || (d.Index == 0) != tc.atFirst {
				t.Fatalf("decision %+v (home %d), want warm=%v at candidate 0=%v", d, home.Index, tc.warm, tc.atFirst)
			}
			if !tc.warm && d.Index != home.Index {
				t.Fatalf("cold decision %d, not the key's home %d", d.Index, home.Index)
			}
		})
	}
}

// Concurrent requests for a prefix whose only holder cannot start them
// at once make a second copy worth its recompute (weight 1); one request
// alone waits. "Cannot start" is a full engine or, in a prefill-bound
// one (many slots, one prefill lane), prefill queued: the request waits
// behind it as it would for a slot. The move still has to pay: the
// copy's prefill at an idle replica (21 blocks, 420 ms) against the
// holder's wait plus the request's own block there, which a busy
// replica prices at RecomputeWeight (320 ms).
func TestHotPrefixReplicatesWhenItsHolderIsFull(t *testing.T) {
	hot := chainOf(nil, 20, 4)
	req := request(chainOf(hot, 1, 5))
	tests := []struct {
		name       string
		slots      int32
		inFlight   int32   // at the holder
		queued     float64 // prefill blocks queued at the holder
		concurrent int
		holder     bool
	}{
		{"slots full, lone: waits", 4, 5, 0, 1, true}, // 2 ahead: 2 s of slot wait
		{"slots full, wanted by others: copy", 4, 5, 0, 3, false},
		{"lane busy, lone: waits", 256, 3, 100, 1, true}, // 2 s of prefill queued
		{"lane busy, wanted by others: copy", 256, 3, 100, 3, false},
		{"lane busy briefly, wanted by others: waits", 256, 3, 3, 3, true}, // 60 ms
		{"holder idle, wanted by others: stays", 256, 3, 0, 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The other replicas run 3 requests each, a slot free: with
			// 4 slots most of the cluster's are taken, so that a lone
			// request's copy weighs nearly RecomputeWeight
			// (TestPickWeighsACopyByTheSlotsInUse).
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].InFlight, cs[i].Detail.SeqMs = held(t), tc.slots, 3, 4000
			}
			cs[0].Summary, cs[0].InFlight, cs[0].PendingPrefillBlocks = held(t, hot), tc.inFlight, tc.queued
			r := req
			r.Concurrent = tc.concurrent
			d := DefaultPolicy().Pick(r, cs)
			if (d.Index == 0) != tc.holder {
				t.Errorf("decision %+v, want holder=%v", d, tc.holder)
			}
		})
	}
}

// The wait for a slot at a full engine: one slot frees every SeqMs/Slots
// on average, unless the router knows when the oldest running sequence
// began — then the first frees SeqMs after it began (slots that filled
// in one burst free together, late), and the rest one every SeqMs/Slots.
func TestSlotWaitMs(t *testing.T) {
	p := DefaultPolicy()
	tests := []struct {
		name string
		c    Candidate
		want float64
	}{
		{"free slot", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 3, Detail: &Detail{SeqMs: 4000}}, 0},
		{"one ahead, age unknown", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 4, Detail: &Detail{SeqMs: 4000}}, 1000},
		{"one ahead, full since 1 s", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 4, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 1000}}, 3000},
		{"one ahead, oldest past the mean", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 4, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 5000}}, 0},
		{"three ahead, full since 3.5 s", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 6, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 3500}}, 2500},
		{"age without a measured SeqMs is ignored", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 4, Detail: &Detail{SlotAgeMs: 1000}}, p.DefaultSeqMs / 4},
		{"unknown slots, engine queues", Candidate{EngineLoad: EngineLoad{Waiting: 1, Running: 2}, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 3000}}, 3000},
		// The owner's estimate of the first end outranks the age: a
		// request past the mean of heavy-tailed answers runs on.
		{"one ahead, owner expects a long answer", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 4, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 5000, FreeMs: 6000}}, 6000},
		{"three ahead, owner's estimate", Candidate{EngineLoad: EngineLoad{Slots: 4}, InFlight: 6, Detail: &Detail{SeqMs: 4000, SlotAgeMs: 5000, FreeMs: 6000}}, 8000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.slotWaitMs(&tc.c); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("wait %v ms, want %v", got, tc.want)
			}
		})
	}
}

// With every replica's slots full the request queues wherever it goes, and
// the slot waits still rank those queues: a warm request, lone or not,
// leaves a holder whose queue is longer than the recompute a move costs,
// and stays at one whose queue is not.
func TestPickAllFullWeighsTheWaitAgainstTheRecompute(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	tests := []struct {
		name       string
		concurrent int
		holderIn   int32 // the holder's requests in flight (4 slots)
		othersFree bool
		stay       bool
	}{
		{"all full, lone, 3 ahead at the holder: move", 1, 6, false, false},
		{"all full, unknown concurrency: move", 0, 6, false, false},
		{"all full, wanted by others: move", 3, 6, false, false},
		{"all full, lone, 2 ahead at the holder: move", 1, 5, false, false},
		{"all full, lone, 1 ahead everywhere: stay", 1, 4, false, true},
		{"another can start: move", 1, 6, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request(chainOf(conv, 2, 5))
			req.Concurrent = tc.concurrent
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].InFlight = held(t), 4, 40000, 4
				if tc.othersFree {
					cs[i].InFlight = 3
				}
			}
			// k ahead at the holder: k × 10 s; 1 ahead elsewhere: 10 s +
			// 16 × 10 blocks × 20 ms of recompute. Its queue of at most 2
			// is within the guard, ceil(2 × (2+4) / 4) = 3.
			cs[0].Summary, cs[0].InFlight = held(t, conv), tc.holderIn
			d := DefaultPolicy().Pick(req, cs)
			if (d.Index == 0) != tc.stay {
				t.Fatalf("decision %+v, want stay at the holder %v", d, tc.stay)
			}
		})
	}
}

// A warm request that leaves its holder goes to a replica this router
// owns, whose load it sees exactly, before one whose free slot it knows
// only from another router's gossip (a slot the other routers see free
// too), while one it owns can start the request; when every one it owns
// would queue it for a slot, a remote one its view shows idle competes
// on cost (a busy one stays far); a router that owns none of the
// candidates, or a view without ownership, takes the cheapest; and a
// remote replica stays the hot-spot guard's last resort when no near one
// is under its bound.
func TestPickMovesToAnOwnedReplicaBeforeARemoteOne(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	const holder, remote, owned = 0, 1, 2
	everything := []int{0, 1, 2, 3, 4, 5, 6, 7}
	tests := []struct {
		name       string
		local      []int // the candidates this router owns
		guard      bool  // the holder and the owned replica queue past the guard
		noDetail   bool
		ownedFree  bool // the owned replica has a free slot, as the remote one does
		remoteBusy bool // the remote replica has prefill queued (not idle)
		want       int
	}{
		{"owns a non-holder that can start it: it takes the move", []int{owned}, false, false, true, false, owned},
		{"owns only a full non-holder: a remote idle one", []int{owned}, false, false, false, false, remote},
		{"owns only a full non-holder, the remote one busy: the owned one", []int{owned}, false, false, false, true, owned},
		{"owns the full holder only: a remote idle one", []int{holder}, false, false, false, false, remote},
		{"owns the full holder only, the remote one busy: stays", []int{holder}, false, false, false, true, holder},
		{"owns nothing: the cheapest", nil, false, false, false, false, remote},
		{"owns everything (one router): the cheapest", everything, false, false, false, false, remote},
		{"no Details: the cheapest", nil, false, true, false, false, remote},
		{"near ones past the guard: a remote idle one", []int{owned}, true, false, false, false, remote},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request(chainOf(conv, 2, 5))
			cs := candidates(8)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].InFlight = held(t), 4, 40000, 4
			}
			// The holder: 3 ahead, 30 s. The remote non-holder can start
			// it at once; the owned one and the others wait for one slot
			// (10 s): every non-holder beats the holder by more than the
			// 3.2 s of recompute, the remote one most. The holder's queue
			// of 2 is within the guard, ceil(2 × (2+8) / 8) = 3.
			cs[holder].Summary, cs[holder].InFlight = held(t, conv), 6
			cs[remote].InFlight = 3
			if tc.ownedFree {
				cs[owned].InFlight = 3
			}
			if tc.remoteBusy {
				// One block queued: 20 ms more than the owned one's
				// recompute, and no longer idle.
				cs[remote].PendingPrefillBlocks = 1
			}
			if tc.guard {
				// Both queue 4, past the bound ceil(2 × (8+8) / 8) = 4.
				cs[holder].InFlight, cs[owned].InFlight = 8, 8
			}
			for _, i := range tc.local {
				cs[i].Detail.Local = true
			}
			if tc.noDetail {
				for i := range cs {
					cs[i].Detail = nil
				}
			}
			if d := DefaultPolicy().Pick(req, cs); d.Index != tc.want {
				t.Fatalf("decision %+v, want %d", d, tc.want)
			}
		})
	}
}

// A stem is what the last request of a heat key matched; the next request
// forks from it when it holds the stem and does not extend that request
// (a sibling: same template, another question), and does not when it is
// longer (a conversation's next turn holds its previous turn and more).
func TestStemFork(t *testing.T) {
	stem := chainOf(nil, 24, 1)
	prev := request(chainOf(stem, 1, 2))
	rec := StemOf(prev, 24)
	tests := []struct {
		name string
		rec  Stem
		req  Request
		want int
	}{
		{"sibling of the same length", rec, request(chainOf(stem, 1, 3)), 24},
		{"shorter sibling", rec, request(stem), 24},
		{"next turn extends it", rec, request(chainOf(prev.Hashes, 3, 4)), 0},
		{"another prompt", rec, request(chainOf(nil, 25, 5)), 0},
		{"shorter than the stem", rec, request(stem[:10]), 0},
		{"nothing remembered", Stem{}, request(chainOf(stem, 1, 3)), 0},
		{"previous request matched nothing", StemOf(prev, 0), request(chainOf(stem, 1, 3)), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rec.Fork(tc.req); got != tc.want {
				t.Fatalf("Fork = %d, want %d", got, tc.want)
			}
		})
	}
}

// A forked stem whose only holder is full moves to a replica that can
// start it at once when its prefill is shorter than the wait (its copy
// serves the stem's other requests); a conversation's history does not
// (weight RecomputeWeight), nor does the stem when free slots are scarce
// (fewer than half the replicas could start it) or the holder can start it.
func TestForkedStemLeavesAFullHolder(t *testing.T) {
	stem := chainOf(nil, 20, 6)
	req := request(chainOf(stem, 1, 7))
	tests := []struct {
		name       string
		fork       int
		fullOthers int // other replicas with every slot taken
		holderFree bool
		stay       bool
	}{
		{"no fork known: a conversation's history", 0, 0, false, true},
		{"forked stem, most replicas free", 20, 0, false, false},
		{"forked stem, half the replicas free", 20, 1, false, false},
		{"forked stem, free slots scarce", 20, 2, false, true},
		{"forked stem, holder can start it", 20, 0, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The other replicas run 3 requests each, a slot free: most
			// of the cluster's slots are taken, so that a history's copy
			// weighs nearly RecomputeWeight
			// (TestPickWeighsACopyByTheSlotsInUse).
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].InFlight, cs[i].Detail.SeqMs = held(t), 4, 3, 4000
			}
			// Three requests ahead at the holder: 3 s of slot wait, more
			// than the stem's 400 ms of prefill, less than 13 times it.
			cs[0].Summary, cs[0].InFlight = held(t, stem), 6
			if tc.holderFree {
				cs[0].InFlight = 3
			}
			for i := 1; i <= tc.fullOthers; i++ {
				cs[i].InFlight = 4
			}
			r := req
			r.ForkBlocks = tc.fork
			d := DefaultPolicy().Pick(r, cs)
			if (d.Index == 0) != tc.stay {
				t.Fatalf("decision %+v, want stay at the holder = %v", d, tc.stay)
			}
		})
	}
}

// A hot prefix's copy costs only its prefill on an idle replica; on one
// with prefill queued (or no free slot) the copy would delay the requests
// queued there, and weighs RecomputeWeight like any recompute.
func TestHotPrefixCopiesOnlyToAnIdleReplica(t *testing.T) {
	hot := chainOf(nil, 20, 4)
	req := request(chainOf(hot, 1, 5))
	req.Concurrent = 3
	for _, tc := range []struct {
		name    string
		pending float64 // prefill queued at the non-holders
		holder  bool
	}{{"idle non-holders", 0, false}, {"non-holders with prefill queued", 10, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].PendingPrefillBlocks = held(t), 4, 4000, tc.pending
			}
			// 2 ahead at the holder: 2 s of slot wait, more than the
			// copy's 420 ms and the 200 ms of prefill queued elsewhere.
			cs[0].Summary, cs[0].InFlight, cs[0].PendingPrefillBlocks = held(t, hot), 5, 0
			d := DefaultPolicy().Pick(req, cs)
			if (d.Index == 0) != tc.holder {
				t.Fatalf("decision %+v, want holder=%v", d, tc.holder)
			}
		})
	}
}

// A hot prompt (a common prefix longer than one block) whose holders
// cannot start the request is copied only to an idle replica with room
// in its KV cache; when none is the request queues at the holder with
// the shortest wait.
func TestColdHotPromptCopiesOnlyToAnIdleReplica(t *testing.T) {
	hot := chainOf(nil, 20, 8)
	req := request(chainOf(hot, 1, 9))
	for _, tc := range []struct {
		name    string
		idle    bool   // replica 3 idle
		kvUsage uint16 // replica 3's KV usage
		want    int
	}{
		{"no idle replica", false, 0, 1},
		{"an idle replica", true, 0, 3},
		{"an idle replica, KV usage known", true, kvWatermark - 1, 3},
		{"an idle replica, KV cache at the watermark", true, kvWatermark, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs = held(t), 4, 4000
			}
			// The holders: full, prefill queued, 1 the shorter wait.
			cs[0].Summary, cs[0].InFlight, cs[0].PendingPrefillBlocks = held(t, hot), 6, 10
			cs[1].Summary, cs[1].InFlight, cs[1].PendingPrefillBlocks = held(t, hot), 5, 10
			// 2 has a free slot and a little prefill queued; 3 is full
			// or idle.
			cs[2].InFlight, cs[2].PendingPrefillBlocks = 2, 2
			cs[3].InFlight = 4
			if tc.idle {
				cs[3].InFlight = 0
			}
			cs[3].KVUsage = tc.kvUsage
			d := DefaultPolicy().Pick(req, cs)
			if d.Reason != ReasonFallbackCold || d.CommonMatch != 20 || d.Index != tc.want {
				t.Fatalf("decision %+v, want replica %d by fallback-cold over common 20", d, tc.want)
			}
		})
	}
}

// With every replica full, the prefill queued at the holder is part of
// the wait a move saves: a request moves to a replica holding less of it
// when that prefill costs more than the extra recompute (1.2 s against
// 3 blocks × 16 × 20 ms = 0.96 s), and stays when it costs less.
func TestPickAllFullCountsQueuedPrefill(t *testing.T) {
	conv := chainOf(nil, 12, 10)
	req := request(chainOf(conv, 2, 11))
	req.Concurrent = 1
	for _, tc := range []struct {
		pending float64
		want    int
	}{{60, 1}, {40, 0}} {
		cs := candidates(4)
		for i := range cs {
			cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].InFlight = held(t), 4, 4000, 5
		}
		cs[0].Summary, cs[0].PendingPrefillBlocks = held(t, conv), tc.pending // the holder
		cs[1].Summary = held(t, conv[:9])                                     // holds 9 of 14: 3 more to recompute
		if d := DefaultPolicy().Pick(req, cs); d.Index != tc.want {
			t.Fatalf("%v blocks queued at the holder: decision %+v, want %d", tc.pending, d, tc.want)
		}
	}
}

// The hot-spot guard spills a request off an overloaded holder, but a
// spill that would copy the prefix onto a busy replica (prefill queued,
// or no free slot) only moves the queue and adds the copy to it: the
// request stays. An idle replica takes the copy.
func TestSpillCopiesOnlyToAnIdleReplica(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	for _, tc := range []struct {
		name    string
		pending float64 // prefill queued at the non-holders
		stay    bool
	}{{"busy non-holders", 5, true}, {"idle non-holders", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].InFlight, cs[i].PendingPrefillBlocks = held(t), 1, tc.pending
			}
			cs[1].Summary, cs[1].PendingPrefillBlocks = held(t, conv), 0
			// Over the bound on its queue, with a wait (7 × 1000 / 4 ms)
			// shorter than the recompute a move costs: a spill.
			cs[1].InFlight, cs[1].Running, cs[1].Waiting, cs[1].Detail.SeqMs = 10, 4, 6, 1000
			d := DefaultPolicy().Pick(request(chainOf(conv, 3, 4)), cs)
			if (d.Index == 1) != tc.stay || (!tc.stay && d.Reason != ReasonSpill) {
				t.Fatalf("decision %+v, want stay at the holder = %v", d, tc.stay)
			}
		})
	}
}

// keyOrder is cs's indexes in the rendezvous order of req's key, the
// key's first choice first.
func keyOrder(req Request, cs []Candidate) []int {
	key := DefaultPolicy().Pick(req, cs).Key
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Compare(weight(key, cs[b].Hash), weight(key, cs[a].Hash))
	})
	return order
}

// Among replicas of equal wait, a cold request takes the one of the key's
// first two rendezvous choices with fewer requests in flight (fewer
// arrivals queue behind its prefill), not the least loaded of all (routers
// on one snapshot would herd there).
func TestColdPlacementTwoChoicesByInFlight(t *testing.T) {
	req := request(chainOf(nil, 4, 12))
	cs := candidates(5)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8 // free slots: the in-flight guard does not apply
	}
	order := keyOrder(req, cs)
	first, second := order[0], order[1]
	for _, tc := range []struct {
		name          string
		first, second int32 // in flight
		want          int
	}{{"second less loaded", 3, 1, second}, {"first less loaded", 1, 3, first}, {"equal", 2, 2, first}} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range cs {
				cs[i].InFlight = 0 // the others: least loaded of all, not chosen
			}
			cs[first].InFlight, cs[second].InFlight = tc.first, tc.second
			if d := DefaultPolicy().Pick(req, cs); d.Index != tc.want || d.Reason != ReasonFallbackCold {
				t.Fatalf("decision %+v, want %d by fallback-cold", d, tc.want)
			}
		})
	}
}

// Among replicas of equal wait, a cold request goes to the one this
// router wrote the fewest prefill blocks to recently (Detail.Written),
// whatever the key's rendezvous order: new prompts that share no prefix
// spread their cache footprint rather than pile on the replicas their
// keys happen to name. Equal writes keep the key's order; a shorter wait
// still beats fewer writes; and without every summary counting the key
// alone places it (the next turn must retrace it by the key).
func TestColdPlacementPrefersTheLeastWritten(t *testing.T) {
	req := request(chainOf(nil, 4, 12))
	cs := candidates(5)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8
	}
	order := keyOrder(req, cs)
	setWritten := func(w ...float64) {
		for i := range cs {
			cs[i].Detail.Written, cs[i].PendingPrefillBlocks = 0, 0
		}
		for k, x := range w {
			cs[order[k]].Detail.Written = x
		}
	}
	pick := func() Decision { return DefaultPolicy().Pick(req, cs) }

	setWritten(0, 0, 0, 0, 0)
	if d := pick(); d.Index != order[0] || d.Reason != ReasonFallbackCold {
		t.Fatalf("equal writes: decision %+v, want the key's first choice %d", d, order[0])
	}
	setWritten(300, 200, 100, 100, 400)
	if d := pick(); d.Index != order[2] {
		t.Fatalf("writes %v: decision %+v, want %d (fewest written, first in key order among them)", []float64{300, 200, 100, 100, 400}, d, order[2])
	}
	setWritten(300, 200, 100, 100, 400)
	cs[order[2]].PendingPrefillBlocks, cs[order[3]].PendingPrefillBlocks = 5, 5
	if d := pick(); d.Index != order[1] {
		t.Fatalf("the least written queue prefill: decision %+v, want %d (shortest wait first)", d, order[1])
	}
	setWritten(300, 200, 100, 100, 400)
	cs[order[4]].Summary = nil // one summary does not count
	if d := pick(); d.Index != order[0] {
		t.Fatalf("a summary missing: decision %+v, want the key's first choice %d", d, order[0])
	}
}

// The two choices at equal waits are the first two in the order cold
// placement ranks by, fewest written first: of the least written replica
// and the runner-up, the one with fewer requests in flight. With
// Detail.Written filled every replica's writes differ, and a runner-up
// only among equal writes would leave the least written the only choice,
// however busy: a burst of cold prompts would queue at its slots while a
// replica written a little more sat idle.
func TestColdPlacementTwoChoicesInTheWrittenOrder(t *testing.T) {
	req := request(chainOf(nil, 4, 12))
	cs := candidates(5)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8
	}
	order := keyOrder(req, cs)
	for k, x := range []float64{300, 200, 100, 150, 400} {
		cs[order[k]].Detail.Written = x
	}
	pick := func(least, runnerUp int32) Decision {
		for i := range cs {
			cs[i].InFlight = 0
		}
		cs[order[2]].InFlight, cs[order[3]].InFlight = least, runnerUp
		return DefaultPolicy().Pick(req, cs)
	}
	if d := pick(5, 1); d.Index != order[3] || d.Reason != ReasonFallbackCold {
		t.Fatalf("least written busier: decision %+v, want the runner-up in written order %d", d, order[3])
	}
	if d := pick(1, 5); d.Index != order[2] {
		t.Fatalf("runner-up busier: decision %+v, want the least written %d", d, order[2])
	}
	if d := pick(3, 3); d.Index != order[2] {
		t.Fatalf("equal in flight: decision %+v, want the least written %d", d, order[2])
	}
}

// A hot prompt whose holders are all in a farther tier, while every
// replica of the nearest tier is busy: cold placement found no one to take
// it (a stale-holder case the fault suite hit after a router's kill -9,
// index -1) and must place it in the nearest tier anyway.
func TestColdPlacementHotPromptHeldOnlyFarther(t *testing.T) {
	hot := chainOf(nil, 3, 1)
	req := request(chainOf(hot, 1, 2))
	cs := candidates(5)
	for i := range cs {
		cs[i].Slots, cs[i].InFlight = 1, 2 // busy: no free slot
		cs[i].Tier, cs[i].Summary = 1, held(t, hot)
	}
	for _, i := range []int{0, 1} { // the nearest tier lacks the hot prompt
		cs[i].Tier, cs[i].Summary = 0, held(t, chainOf(nil, 2, 8))
	}
	d := DefaultPolicy().Pick(req, cs)
	if d.Index != 0 && d.Index != 1 {
		t.Fatalf("decision %+v, want replica 0 or 1 (the nearest tier)", d)
	}
}

// TestCandidateNilDetail: a candidate without a Detail (a view that
// leaves it out) reads as the zero Detail through its accessors, and a
// decision over such candidates, full engines included (the slot wait
// reads SeqMs and SlotAgeMs), does not panic.
func TestCandidateNilDetail(t *testing.T) {
	var c Candidate
	if c.ID() != "" || c.SeqMs() != 0 || c.SlotAgeMs() != 0 {
		t.Fatalf("nil Detail reads %q %v %v, want the zero Detail", c.ID(), c.SeqMs(), c.SlotAgeMs())
	}
	cands := []Candidate{
		{Hash: HashID("a"), EngineLoad: EngineLoad{Slots: 2, Running: 2, Waiting: 3}, InFlight: 5},
		{Hash: HashID("b"), EngineLoad: EngineLoad{Slots: 2, Running: 2, Waiting: 1}, InFlight: 3},
	}
	d := DefaultPolicy().Pick(Request{Hashes: []uint64{1, 2, 3}}, cands)
	if d.Index < 0 || d.Index >= len(cands) {
		t.Fatalf("decision %+v over candidates without a Detail", d)
	}
}

// The first turns of issue 7's chat arrive at once at three routers over
// four replicas (router k owns replicas j with j mod 3 == k). A router
// sees its own replicas exactly, with the requests the others just sent
// there, and the others' replicas only with its own requests (no gossip
// yet). Placing by that view, routers pushed their bursts onto the
// replicas they do not own, five onto one replica of four slots; each
// spreading its own requests puts three on every replica, in any
// interleaving of the decisions and whatever the keys.
func TestColdBurstSpreadsAcrossRouters(t *testing.T) {
	const replicas, routers, perRouter, blocks = 4, 3, 4, 4
	for _, tc := range []struct {
		name       string
		slots      int32
		sequential bool // each router's burst after the previous one's
	}{
		{"slots unknown, interleaved", 0, false},
		{"slots known, interleaved", 4, false},
		{"slots unknown, one router after another", 0, true},
		{"slots known, one router after another", 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for trial := range 50 {
				var at [replicas]int32
				var own [routers][replicas]int32
				view := func(k int) []Candidate {
					cs := candidates(replicas)
					for j := range cs {
						n := own[k][j]
						if j%routers == k {
							n = at[j]
						}
						cs[j].Summary, cs[j].Slots, cs[j].Detail.Local, cs[j].HasLoad = held(t), tc.slots, j%routers == k, true
						cs[j].InFlight, cs[j].PendingPrefillBlocks, cs[j].Detail.Own = n, float64(blocks*n), own[k][j]
					}
					return cs
				}
				for i := range routers * perRouter {
					k := i % routers
					if tc.sequential {
						k = i / perRouter
					}
					req := request(chainOf(nil, blocks, uint64(1000*trial+i+1)))
					d := DefaultPolicy().Pick(req, view(k))
					if d.Reason != ReasonFallbackCold {
						t.Fatalf("trial %d: decision %+v, want fallback-cold", trial, d)
					}
					at[d.Index]++
					own[k][d.Index]++
				}
				for j, n := range at {
					if n != routers {
						t.Fatalf("trial %d: replica %d got %d of the burst (all: %v), want %d each", trial, j, n, at, routers)
					}
				}
			}
		})
	}
}

// A cold request whose key's first choice is idle goes by the key, as on
// any router (the next turn retraces it before gossip), however this
// router's own requests are spread. Only when it is busy in a
// burst onto an idle cluster (every engine last reported nothing running
// or waiting) does it spread by its own requests; once an engine reports
// work, the shortest wait decides again.
func TestColdSpreadOnlyWhenTheKeysFirstChoiceIsBusy(t *testing.T) {
	req := request(chainOf(nil, 4, 12))
	cs := candidates(5)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8 // free slots: the in-flight guard does not apply
	}
	order := keyOrder(req, cs)
	first, second, third, fourth, fifth := order[0], order[1], order[2], order[3], order[4]
	// fourth is this router's; the others are not.
	for _, tc := range []struct {
		name     string
		inFlight map[int]int32 // each with 4 blocks of queued prefill
		own      map[int]int32
		running  bool // the first choice's engine reports a sequence running
		noLoad   int  // 1+ the index of an engine that publishes no counts (0: none)
		want     int
	}{
		{"all idle", nil, nil, false, 0, first},
		{"first busy with this router's request: the other idle ones by the key", map[int]int32{first: 1},
			map[int]int32{first: 1}, false, 0, second},
		{"all busy, the least of this router's own on its replica", map[int]int32{first: 1, second: 1, third: 1, fourth: 2, fifth: 1},
			map[int]int32{first: 1, second: 1, third: 1, fifth: 1}, false, 0, fourth},
		{"all busy, equal shares and waits: the key's order", map[int]int32{first: 1, second: 1, third: 1, fourth: 1, fifth: 1},
			map[int]int32{first: 1, second: 1, third: 1, fourth: 1, fifth: 1}, false, 0, first},
		{"an engine reports a sequence running: shortest wait", map[int]int32{first: 2, second: 1, third: 1, fourth: 2, fifth: 1},
			map[int]int32{first: 1, second: 1, third: 1, fifth: 1}, true, 0, second},
		{"an engine publishes no counts: shortest wait", map[int]int32{first: 2, second: 1, third: 1, fourth: 2, fifth: 1},
			map[int]int32{first: 1, second: 1, third: 1, fifth: 1}, false, 1 + fifth, second},
		{"the first choice's engine publishes no counts: shortest wait", map[int]int32{first: 1, second: 1, third: 1, fourth: 2, fifth: 1},
			map[int]int32{first: 1, second: 1, third: 1, fifth: 1}, false, 1 + first, first},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range cs {
				cs[i].InFlight, cs[i].Detail.Own, cs[i].Detail.Local = tc.inFlight[i], tc.own[i], i == fourth
				cs[i].Running, cs[i].HasLoad = 0, tc.noLoad != 1+i
				if tc.running && i == first {
					cs[i].Running = 1
				}
				cs[i].PendingPrefillBlocks = float64(4 * tc.inFlight[i])
			}
			if d := DefaultPolicy().Pick(req, cs); d.Index != tc.want || d.Reason != ReasonFallbackCold {
				t.Fatalf("decision %+v, want %d by fallback-cold", d, tc.want)
			}
		})
	}
}

// TestBurst: the burst rule's condition holds only when every engine of
// the tier (stale ones aside: their load is unknown, not counted) last
// reported nothing running or waiting in counts it publishes, and the
// tier mixes this router's replicas with others.
func TestBurst(t *testing.T) {
	type c struct {
		tier             int8
		local, stale     bool
		hasLoad          bool
		running, waiting int32
	}
	for _, tc := range []struct {
		name  string
		cands []c
		want  bool
	}{
		{"idle, mixed", []c{{local: true, hasLoad: true}, {hasLoad: true}}, true},
		{"one engine publishes no counts", []c{{local: true, hasLoad: true}, {hasLoad: true}, {}}, false},
		{"this router's engine publishes no counts", []c{{local: true}, {hasLoad: true}}, false},
		{"no engine publishes counts", []c{{local: true}, {}}, false},
		{"the engine without counts is stale", []c{{local: true, hasLoad: true}, {hasLoad: true}, {stale: true}}, true},
		{"the engine without counts is in another tier", []c{{local: true, hasLoad: true}, {hasLoad: true}, {tier: 1}}, true},
		{"a sequence running", []c{{local: true, hasLoad: true}, {hasLoad: true, running: 1}}, false},
		{"a request waiting", []c{{local: true, hasLoad: true, waiting: 1}, {hasLoad: true}}, false},
		{"only this router's", []c{{local: true, hasLoad: true}, {local: true, hasLoad: true}}, false},
		{"only others'", []c{{hasLoad: true}, {hasLoad: true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(len(tc.cands))
			for i, x := range tc.cands {
				cs[i].Tier, cs[i].Stale, cs[i].HasLoad, cs[i].Running, cs[i].Waiting = x.tier, x.stale, x.hasLoad, x.running, x.waiting
				cs[i].Detail.Local = x.local
			}
			if got := burst(cs, 0); got != tc.want {
				t.Fatalf("burst = %v, want %v", got, tc.want)
			}
		})
	}
}

// In a lightly loaded cluster of engines whose slots the router does not
// know (vLLM publishes no max-num-seqs), a conversation's next turn with
// a long new question (the holder has less than half of it) stays on its
// holder while the holder has fewer requests in flight than it has been
// seen running with nothing waiting (MinSlots): the in-flight bound,
// twice the mean with one more request in all, is one request here and
// would move the turn whenever the previous one is still finishing. With
// nothing learned the bound still applies, and a holder at what it was
// seen running, far above the mean, still spills.
func TestNextTurnStaysOnAHolderSeenRunningMore(t *testing.T) {
	system := chainOf(nil, 3, 1)
	conv := chainOf(system, 2, 2)
	next := request(chainOf(conv, 6, 3)) // the holder has 5 of 11 blocks
	pick := func(holderInFlight int32, minSlots uint8) Decision {
		cs := candidates(8)
		for i := range cs {
			cs[i].Summary = held(t, system)
			cs[i].HasLoad = true
		}
		cs[0].Summary = held(t, conv)
		cs[0].InFlight, cs[0].Running, cs[0].MinSlots = holderInFlight, holderInFlight, minSlots
		cs[5].InFlight, cs[5].Running = 1, 1
		return DefaultPolicy().Pick(next, cs)
	}
	for _, inFlight := range []int32{1, 2} {
		if d := pick(inFlight, 4); d.Index != 0 {
			t.Errorf("holder with %d in flight, seen running 4: decision %+v, want the holder (0)", inFlight, d)
		}
		if d := pick(inFlight, 0); d.Index == 0 {
			t.Errorf("holder with %d in flight, nothing learned: decision %+v, want the in-flight bound to move it", inFlight, d)
		}
	}
	if d := pick(4, 4); d.Index == 0 {
		t.Errorf("holder at the 4 it was seen running, 5 in flight in all: decision %+v, want a spill", d)
	}
}

// Every replica full: a warm request compares the holder's queue with the
// others' by one slot time, the mean of the candidates' SeqMs, not each
// replica's own running mean. The holder's last answers were short (its
// SeqMs 4 s against the others' 40 s, one slot each): priced by its own
// it looks 3 ahead × 4 s = 12 s away, below a move to a replica 1 ahead
// (40 s and 16 × 10 blocks × 20 ms of recompute), and the request would
// queue there behind three answers; pooled (31 s per slot), 93 s against
// 34 s, and it moves. With every SeqMs equal the pool changes nothing;
// the holder 1 ahead like the others keeps it either way.
func TestPickPricesFullQueuesByThePooledSlotTime(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	tests := []struct {
		name      string
		holderSeq float64
		holderIn  int32 // 1 slot
		stay      bool
	}{
		{"holder's short last answers, 3 ahead: move", 4000, 3, false},
		{"alike, 3 ahead: move", 40000, 3, false},
		{"holder's short last answers, 1 ahead like the others: stay", 4000, 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request(chainOf(conv, 2, 5))
			req.Concurrent = 1
			cs := candidates(4)
			for i := range cs {
				cs[i].Summary, cs[i].Slots, cs[i].Detail.SeqMs, cs[i].InFlight = held(t), 1, 40000, 1
			}
			cs[0].Summary, cs[0].InFlight, cs[0].Detail.SeqMs = held(t, conv), tc.holderIn, tc.holderSeq
			d := DefaultPolicy().Pick(req, cs)
			if (d.Index == 0) != tc.stay {
				t.Fatalf("decision %+v, want stay at the holder %v", d, tc.stay)
			}
		})
	}
}

func TestPooledSeqMs(t *testing.T) {
	cs := candidates(5)
	for i, s := range []float64{1000, 3000, 0, math.Inf(1), 5000} {
		cs[i].Detail.SeqMs = s
	}
	cs[1].Stale = true
	if got := pooledSeqMs(cs); got != 3000 { // 1000 and 5000: no measure, infinity and stale left out
		t.Fatalf("pooled %v, want 3000", got)
	}
	if got := pooledSeqMs(candidates(3)); got != 0 {
		t.Fatalf("pooled with no SeqMs %v, want 0", got)
	}
	// A thousand candidates: 64 read at an even stride.
	many := candidates(1024)
	for i := range many {
		many[i].Detail.SeqMs = float64(1 + i%16)
	}
	if got := pooledSeqMs(many); got != 1 { // stride 16 reads every i ≡ 0 (mod 16)
		t.Fatalf("pooled over 1024 %v, want 1", got)
	}
}

func TestPoolSlots(t *testing.T) {
	type eng struct {
		slots, running int32
		minSlots       uint8
		stale          bool
	}
	for _, tc := range []struct {
		name string
		in   []eng
		want []int32
	}{
		{"the count the others share", []eng{{slots: 4}, {}, {slots: 4}, {running: 2}}, []int32{4, 4, 4, 4}},
		{"known counts differ: no guess", []eng{{slots: 4}, {}, {slots: 8}}, []int32{4, 0, 8}},
		{"none known", []eng{{}, {running: 3}}, []int32{0, 0}},
		{"seen running more: bigger", []eng{{slots: 4}, {minSlots: 6}, {running: 5}}, []int32{4, 0, 0}},
		{"stale neither gives nor takes", []eng{{slots: 4}, {stale: true}, {slots: 8, stale: true}, {}}, []int32{4, 0, 8, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := candidates(len(tc.in))
			for i, e := range tc.in {
				cs[i].Slots, cs[i].Running, cs[i].MinSlots, cs[i].Stale = e.slots, e.running, e.minSlots, e.stale
			}
			PoolSlots(cs)
			for i, w := range tc.want {
				if cs[i].Slots != w {
					t.Errorf("candidate %d: slots %d, want %d", i, cs[i].Slots, w)
				}
			}
		})
	}
}

// A one-slot engine that publishes no count has it learnt only at its
// first queue. Until then its holder, busy with a long answer, looks as
// if it could start a next turn at once; with the count learnt at
// another replica pooled in, the wait is priced and the turn moves.
func TestPickPricesAPooledSlotCount(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	req := request(chainOf(conv, 2, 5)) // 12 blocks; a move recomputes 10
	for _, pool := range []bool{false, true} {
		cs := candidates(4)
		for i := range cs {
			cs[i].Summary, cs[i].HasLoad, cs[i].Detail.SeqMs = held(t), true, 40000
		}
		cs[0].Summary, cs[0].InFlight, cs[0].Running, cs[0].MinSlots = held(t, conv), 1, 1, 1
		cs[3].Slots = 1 // learnt at its first queue
		if pool {
			PoolSlots(cs)
		}
		d := DefaultPolicy().Pick(req, cs)
		if stay := d.Index == 0; stay == pool {
			t.Errorf("pooled %v: decision %+v; want the holder only without the pooled count", pool, d)
		}
	}
}
