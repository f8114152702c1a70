package route

import (
	"testing"
)

// TestWarmUpShare: a replica holding less than half its tier's mean of
// blocks takes the cold requests in the warm share whose keys would have
// gone elsewhere, and only those (the rest go as before); it stops when
// it can no longer start one at once, when it holds half the mean, when
// every replica is empty (a cluster starting), when its summary is stale,
// and with WarmShare 0.
func TestWarmUpShare(t *testing.T) {
	cs := candidates(4)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8
		cs[i].Held = 1000
	}
	const fresh = 3
	cs[fresh].Held = 0
	pol := DefaultPolicy()
	var inShare, outShare []Request
	for seed := uint64(100); len(inShare) < 40 || len(outShare) < 40; seed++ {
		req := request(chainOf(nil, 4, seed))
		if pol.inWarmShare(pol.key(req, 0)) {
			inShare = append(inShare, req)
		} else {
			outShare = append(outShare, req)
		}
	}
	base := pol
	base.WarmShare = 0
	for _, req := range inShare {
		if d := pol.Pick(req, cs); d.Index != fresh || d.Reason != ReasonWarmUp {
			t.Fatalf("a cold request in the share: %+v, want the warming replica %d by warm-up", d, fresh)
		}
	}
	for _, req := range outShare {
		want := base.Pick(req, cs)
		if d := pol.Pick(req, cs); d.Index != want.Index || d.Reason != ReasonFallbackCold {
			t.Fatalf("a cold request outside the share: %+v, want %+v as without warm-up", d, want)
		}
	}
	req := inShare[0]
	check := func(what string, want bool) {
		t.Helper()
		if d := pol.Pick(req, cs); (d.Reason == ReasonWarmUp) != want {
			t.Errorf("%s: decision %+v, warm-up %v", what, d, want)
		}
	}
	cs[fresh].InFlight = 8 // no free slot
	check("the warming replica full", false)
	cs[fresh].InFlight, cs[fresh].PendingPrefillBlocks = 0, 3 // prefill queued over the cold bound (mean 0.75 × 1.25)
	check("the warming replica queues prefill", false)
	cs[fresh].PendingPrefillBlocks = 0
	cs[fresh].Held = 400 // mean 850: under half of it
	check("holding under half the mean", true)
	cs[fresh].Held = 450 // mean 862.5: over half of it
	check("holding over half the mean", false)
	for i := range cs {
		cs[i].Held = 0
	}
	check("every replica empty", false)
	for i := range cs {
		cs[i].Held = 1000
	}
	cs[fresh].Held, cs[fresh].Stale = 0, true
	check("its summary stale", false)
	cs[fresh].Stale = false
	check("warming again", true)
	if d := base.Pick(req, cs); d.Reason == ReasonWarmUp {
		t.Errorf("WarmShare 0: %+v", d)
	}
	// A second warming replica: the emptier takes it.
	cs[0].Held = 10
	if d := pol.Pick(req, cs); d.Index != fresh {
		t.Errorf("two warming replicas: %+v, want the emptier %d", d, fresh)
	}
}

// TestWarmUpLeavesWarmRequests: a request a replica holds beyond the
// common prefix goes to its holder, warming replica or not.
func TestWarmUpLeavesWarmRequests(t *testing.T) {
	h := chainOf(nil, 6, 7)
	cs := candidates(3)
	for i := range cs {
		cs[i].Summary, cs[i].Slots = held(t), 8
		cs[i].Held = 1000
	}
	cs[1].Summary = held(t, h)
	cs[2].Held = 0
	for seed := uint64(0); seed < 50; seed++ {
		req := request(append(append([]uint64(nil), h...), chainOf(nil, 1, 900+seed)...))
		if d := DefaultPolicy().Pick(req, cs); d.Index != 1 {
			t.Fatalf("a warm request: %+v, want its holder", d)
		}
	}
}
