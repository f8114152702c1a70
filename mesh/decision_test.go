package mesh

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkDecision is one routing decision at one router over 1,024
// replicas with warm summaries: Candidates, probes of a 32-block prompt
// (new, or the longest held prefix of one), and route.Policy.Pick.
func BenchmarkDecision(b *testing.B) {
	a := newRouter(b, "a", func(c *Config) { c.DefaultCapacityBlocks = 4096 })
	rng := rand.New(rand.NewPCG(1, 2))
	var held [][]uint64
	for i := range 1024 {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 4096})
		h := make([]uint64, 32)
		for range 100 { // 3,200 of 4,096 blocks
			for j := range h {
				h[j] = rng.Uint64()
			}
			a.Record(id, h)
		}
		held = append(held, append([]uint64(nil), h...))
	}
	eventually(b, wait, "all owned", func() error {
		if n := len(a.Candidates("m", nil)); n != 1024 {
			return fmt.Errorf("%d candidates", n)
		}
		return nil
	})
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "new-32-blocks", true: "held-32-blocks"}[warm], func(b *testing.B) {
			p := route.DefaultPolicy()
			cands := make([]route.Candidate, 0, 1024)
			hashes := make([]uint64, 32)
			probes := make([]summary.Probe, 0, 32)
			i := 0
			for b.Loop() {
				if warm {
					copy(hashes, held[i%len(held)])
				} else {
					for j := range hashes {
						hashes[j] = rng.Uint64()
					}
				}
				i++
				cands = a.Candidates("m", cands[:0])
				probes = summary.MakeProbes(probes[:0], hashes)
				p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
			}
		})
	}
}

// BenchmarkCandidates1024 is the view's share of a decision.
func BenchmarkCandidates1024(b *testing.B) {
	a := newRouter(b, "a", nil)
	for i := range 1024 {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		a.DeclareReplica(id)
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 1024})
	}
	eventually(b, wait, "all owned", func() error {
		if n := len(a.Candidates("m", nil)); n != 1024 {
			return fmt.Errorf("%d candidates", n)
		}
		return nil
	})
	cands := make([]route.Candidate, 0, 1024)
	for b.Loop() {
		cands = a.Candidates("m", cands[:0])
	}
}
