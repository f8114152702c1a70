package mesh

import (
	"fmt"
	"github.com/kvmesh/kvmesh/route"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkOffer times the owner's side of a heartbeat tick: offer
// encodes the full states of 1,024 owned replicas once and assembles each
// of 8 peers' batches from them (no delta: the encode path alone).
func BenchmarkOffer(b *testing.B) { benchOffer(b, nil) }

// benchOffer is BenchmarkOffer with mod applied to the cuts and peers.
func benchOffer(b *testing.B, mod func([]cut, []*peer)) {
	m := newRouter(b, "a", nil)
	sum, err := summary.New(summary.Params{CapacityBlocks: 2048, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		b.Fatal(err)
	}
	cuts := make([]cut, 1024)
	for i := range cuts {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		cuts[i] = cut{r: &replica{id: id}, sum: sum, ok: true, changed: true,
			st: stateMsg{header: header{Origin: "a", Boot: 1, Seq: uint64(i)}, Replica: id, Owned: true, Healthy: true,
				Capacity: 2048, Epoch: 1, Version: 9, InFlight: 2, Engine: route.EngineLoad{Running: 3, Waiting: 1, Slots: 8, HasLoad: true},
				Models: []string{"m"}, DeclaredBy: []string{"a"}}}
	}
	now := time.Now()
	peers := make([]*peer, 8)
	for i := range peers {
		peers[i] = &peer{name: fmt.Sprint("p", i), wake: make(chan struct{}, 1), fullSome: map[string]bool{}, lastFull: now}
	}
	if mod != nil {
		mod(cuts, peers)
	}
	for b.Loop() {
		m.dis.offer(now, peers, cuts, nil)
		for _, p := range peers {
			p.q, p.qBytes = p.q[:0], 0
		}
		m.dis.queued.Store(0)
	}
}
