package proxy

import (
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/route"
)

// Decisions computed on one view are caught up at commit with the
// placements committed since that view, each where it went (one more in
// flight, its prefill, one more own where this router decided it), and
// a collision on the chosen replica is reported so the decision is made
// again.
func TestPlaceBookCatchUp(t *testing.T) {
	cands := func() []route.Candidate {
		cs := make([]route.Candidate, 4)
		for i := range cs {
			cs[i].Detail = &route.Detail{ID: fmt.Sprintf("r%d", i)}
		}
		cs[3].Stale = true
		return cs
	}
	type placed struct {
		id     string
		blocks float64
		own    bool
	}
	for _, tc := range []struct {
		name     string
		before   []placed // committed before the view was read
		since    []placed // committed after
		chosen   string
		hit      bool
		inFlight []int32
		own      []int32
		pending  []float64
	}{
		{"nothing since", []placed{{"r0", 4, true}}, nil, "r0", false, []int32{0, 0, 0, 0}, []int32{0, 0, 0, 0}, []float64{0, 0, 0, 0}},
		{"an own placement on the chosen replica", nil, []placed{{"r1", 4, true}}, "r1", true,
			[]int32{0, 1, 0, 0}, []int32{0, 1, 0, 0}, []float64{0, 4, 0, 0}},
		{"elsewhere, and a forwarded one", []placed{{"r1", 4, true}}, []placed{{"r0", 4, true}, {"r2", 3, false}}, "r1", false,
			[]int32{1, 0, 1, 0}, []int32{1, 0, 0, 0}, []float64{4, 0, 3, 0}},
		{"a stale replica's load stays unknown", nil, []placed{{"r3", 4, true}}, "r3", false,
			[]int32{0, 0, 0, 0}, []int32{0, 0, 0, 0}, []float64{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b placeBook
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, p := range tc.before {
				b.recordLocked(p.id, p.blocks, p.own)
			}
			snap := b.seq.Load()
			for _, p := range tc.since {
				b.recordLocked(p.id, p.blocks, p.own)
			}
			cs := cands()
			if hit := b.catchUpLocked(cs, snap, tc.chosen); hit != tc.hit {
				t.Fatalf("hit %v, want %v", hit, tc.hit)
			}
			for i, c := range cs {
				if c.InFlight != tc.inFlight[i] || c.Detail.Own != tc.own[i] || c.PendingPrefillBlocks != tc.pending[i] {
					t.Fatalf("%s: in flight %d, own %d, pending %v; want %d, %d, %v", c.ID(), c.InFlight, c.Detail.Own,
						c.PendingPrefillBlocks, tc.inFlight[i], tc.own[i], tc.pending[i])
				}
			}
		})
	}
}

// More placements since a view than the log holds: the newest are caught
// up, no older entry is read twice or for another sequence.
func TestPlaceBookCatchUpWraps(t *testing.T) {
	var b placeBook
	cs := []route.Candidate{{Detail: &route.Detail{ID: "r0"}}}
	b.mu.Lock()
	defer b.mu.Unlock()
	for range placeLogLen + 10 {
		b.recordLocked("r0", 1, true)
	}
	if !b.catchUpLocked(cs, 0, "r0") || cs[0].InFlight != placeLogLen {
		t.Fatalf("caught up %d placements, want the %d the log holds", cs[0].InFlight, placeLogLen)
	}
}
