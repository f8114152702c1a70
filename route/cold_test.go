package route

import (
	"testing"

	"github.com/kvmesh/kvmesh/summary"
)

// Issue 22 on llama.cpp: 8 routers before 4 idle replicas, three groups
// of sessions, each group's first turn arriving at a router that had
// written nothing (Detail.Written all 0), the earlier groups' placements
// already in every router's summaries. Every group is cold (no summary
// holds its prefix), so the order of equal waits and equal writes was
// the key's alone, and two groups' keys named the same replica in most
// trials while another replica sat empty. A replica whose summary holds
// nothing beyond the common prefix goes before one that holds more: the
// groups land on three replicas, and each group's next turn, at yet
// another router, retraces its group by summary.
func TestColdPlacementManyRoutersFillEmptyReplicasFirst(t *testing.T) {
	system := chainOf(nil, 1, 1)
	for _, tc := range []struct {
		name   string
		prefix []uint64 // held by every replica from the start
	}{{"no system prompt", nil}, {"a system prompt everyone holds", system}} {
		t.Run(tc.name, func(t *testing.T) {
			shared := 0
			const trials = 40
			for trial := range trials {
				// The replicas' summaries as every router's copy has them
				// once gossip delivered the earlier placements.
				cs := candidates(4)
				for i := range cs {
					s := held(t, tc.prefix)
					cs[i].Summary, cs[i].Held, cs[i].Slots = s, int32(s.Held()), 8
				}
				router := func() []Candidate { // a router that has written nothing
					out := make([]Candidate, len(cs))
					copy(out, cs)
					for i := range out {
						d := *cs[i].Detail
						out[i].Detail = &d
					}
					return out
				}
				var firsts [3][]uint64
				var at [3]int
				used := map[int]bool{}
				for g := range firsts {
					group := chainOf(tc.prefix, 6, uint64(1000+10*trial+g)) // the group's prefix
					firsts[g] = chainOf(group, 2, uint64(5000+10*trial+g))  // its first turn
					d := DefaultPolicy().Pick(request(firsts[g]), router())
					if d.Reason != ReasonFallbackCold && d.Reason != ReasonWarmUp {
						t.Fatalf("trial %d group %d: decision %+v, want a cold placement", trial, g, d)
					}
					at[g] = d.Index
					if used[d.Index] {
						shared++
					}
					used[d.Index] = true
					s := cs[d.Index].Summary.(*summary.Summary)
					s.Add(firsts[g])
					cs[d.Index].Held = int32(s.Held())
				}
				for g := range firsts {
					next := chainOf(firsts[g], 3, uint64(9000+10*trial+g))
					if d := DefaultPolicy().Pick(request(next), router()); d.Index != at[g] || d.Reason != ReasonPrefix {
						t.Fatalf("trial %d group %d: next turn %+v, want its group's replica %d by prefix", trial, g, d, at[g])
					}
				}
			}
			if shared > 0 {
				t.Errorf("%d of %d trials put two groups on one replica while another held nothing", shared, trials)
			}
		})
	}
}

// The preference for an empty replica is a tie-break, and only empty
// counts: in steady state, every cache full and of unequal sizes (the
// summaries hold unequal counts of blocks, none under half the mean, so
// none is warming), cold prompts at routers that have written nothing go
// by the key's rendezvous order, spread over the replicas, not onto the
// one holding least, which "fewest held" would send every router's every
// cold prompt to (and keep sending with unequal cache sizes).
func TestColdPlacementFullCachesDoNotHerd(t *testing.T) {
	cs := candidates(4)
	for i, h := range []int32{3000, 2100, 6000, 4200} {
		cs[i].Summary, cs[i].Held, cs[i].Slots = held(t, chainOf(nil, 4, uint64(700+i))), h, 8
	}
	counts := make([]int, len(cs))
	const prompts = 200
	for k := range prompts {
		req := request(chainOf(nil, 4, uint64(20000+k)))
		d := DefaultPolicy().Pick(req, cs)
		if d.Reason == ReasonWarmUp {
			t.Fatalf("prompt %d: %+v, no replica is warming", k, d)
		}
		if want := keyOrder(req, cs)[0]; d.Index != want {
			t.Fatalf("prompt %d: decision %+v, want the key's first choice %d", k, d, want)
		}
		counts[d.Index]++
	}
	for i, n := range counts {
		if n < prompts/8 || n > prompts/2 {
			t.Errorf("replica %d (held %d) took %d of %d cold prompts (all: %v), want a rendezvous share", i, cs[i].Held, n, prompts, counts)
		}
	}
}
