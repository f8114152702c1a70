package route

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkDecision measures one whole routing decision from canonical
// text: hashing the prompt, probing every replica's summary and picking.
// Every replica holds a common system prompt and a distinct set of other
// conversations; one holds this request's conversation.
func BenchmarkDecision(b *testing.B) {
	c := summary.DefaultContract()
	for _, size := range []int{8 << 10, 32 << 10} {
		text := bytes.Repeat([]byte("lorem ipsum dolor sit amet "), size/27+1)[:size]
		hashes := c.AppendHashes(nil, c.Root("m", ""), text)
		for _, replicas := range []int{8, 64, 1024} {
			cs := candidates(replicas)
			for i := range cs {
				s, err := summary.New(summary.Params{CapacityBlocks: 4096, FalsePositiveRate: 0.01}, 1)
				if err != nil {
					b.Fatal(err)
				}
				s.Add(hashes[:1])
				for conv := 0; conv < 100; conv++ {
					s.Add(chainOf(hashes[:1], 30, uint64(i*1000+conv)))
				}
				cs[i].Summary = s
				cs[i].InFlight = int32(i % 7)
			}
			cs[replicas/2].Summary.(*summary.Summary).Add(hashes[:len(hashes)/2])
			cs[replicas/2].InFlight = 0
			b.Run(fmt.Sprintf("%dKB/%dreplicas", size>>10, replicas), func(b *testing.B) {
				p := DefaultPolicy()
				var h []uint64
				var probes []summary.Probe
				for b.Loop() {
					h = c.AppendHashes(h[:0], c.Root("m", ""), text)
					probes = summary.MakeProbes(probes[:0], h)
					d := p.Pick(Request{Hashes: h, Probes: probes}, cs)
					if d.Index != replicas/2 {
						b.Fatalf("picked %d (%s), want the holder %d", d.Index, d.Reason, replicas/2)
					}
				}
			})
		}
	}
}

// BenchmarkPickCold is Pick for a new prompt over 1,024 candidates as the
// scale harness's router sees them (copies a few network costs apart, no
// load, no slots known, every summary fresh and holding none of it): the
// cold path, the first pass and hashPick's over every candidate. The
// summaries are plain matchers (fixed: the simulator's kind, a call
// each) or cells of one Batch (batch: the mesh's).
//
// batch-nowarm is batch with the warm-up share off: the difference is
// the warm-up's pass over the candidates, made for the half of the cold
// requests in its share (here no replica is warming, the pass finds none).
func BenchmarkPickCold(b *testing.B) {
	for _, batched := range []bool{false, true} {
		name := "fixed"
		if batched {
			name = "batch"
		}
		b.Run(name, func(b *testing.B) { pickCold(b, batched, DefaultPolicy().WarmShare) })
	}
	b.Run("batch-nowarm", func(b *testing.B) { pickCold(b, true, 0) })
}

func pickCold(b *testing.B, batched bool, warmShare float64) {
	cs := make([]Candidate, 1024)
	var batch Batch
	src := &tableMatcher{ms: make([]int, len(cs))}
	batch.Reset(src, len(cs))
	for i := range cs {
		id := fmt.Sprintf("http://replica-%04d:8000", i)
		cs[i] = Candidate{Detail: &Detail{ID: id}, Hash: HashID(id), NetworkMs: []float64{0.05, 0.08, 0.11, 0.2}[i%4],
			Summary: fixedMatch(0)}
		if batched {
			cs[i].Summary = batch.Cell(i)
		}
	}
	p := DefaultPolicy()
	p.WarmShare = warmShare
	hashes := make([]uint64, 32)
	var probes []summary.Probe
	n := uint64(0)
	var cpu []time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		for j := range hashes {
			n++
			hashes[j] = n * 0x9e3779b97f4a7c15
		}
		probes = summary.MakeProbes(probes[:0], hashes)
		c0 := threadcpu.OrWall()
		d := p.Pick(Request{Hashes: hashes, Probes: probes, Root: 1}, cs)
		cpu = append(cpu, threadcpu.OrWall()-c0)
		if d.Reason != ReasonFallbackCold {
			b.Fatalf("reason %s, want %s", d.Reason, ReasonFallbackCold)
		}
	}
	reportQuantiles(b, "cpu-", cpu)
}

// BenchmarkPickLoRA is Pick for a LoRA adapter's request over 1,024
// candidates (no summary holds it): loaded on 8 of them, one of which
// can start it (the scorer keeps the 8), and loaded nowhere (it keeps the
// one to load it on). The base model's Pick over the same candidates is
// BenchmarkPickCold.
func BenchmarkPickLoRA(b *testing.B) {
	for _, loaded := range []int{8, 0} {
		b.Run(fmt.Sprintf("loaded-on-%d", loaded), func(b *testing.B) {
			cs := make([]Candidate, 1024)
			for i := range cs {
				id := fmt.Sprintf("http://replica-%04d:8000", i)
				cs[i] = Candidate{Detail: &Detail{ID: id}, Hash: HashID(id), Summary: fixedMatch(0),
					EngineLoad: EngineLoad{Slots: 4, HasLoad: true}, InFlight: 4, LoRA: LoRAAdapter | LoRARoom | LoRAFree}
				if i%128 == 0 && i/128 < loaded {
					cs[i].LoRA |= LoRAResident
				}
			}
			cs[0].InFlight = 1
			cs[5].InFlight = 1
			hashes := chainOf(nil, 8, 9)
			req := Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: 1, Model: ModelKey("sql-lora")}
			p := DefaultPolicy()
			var cpu []time.Duration
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for b.Loop() {
				c0 := threadcpu.OrWall()
				d := p.Pick(req, cs)
				cpu = append(cpu, threadcpu.OrWall()-c0)
				if d.Index < 0 || d.LoRA == "" {
					b.Fatalf("%+v", d)
				}
			}
			reportQuantiles(b, "cpu-", cpu)
		})
	}
}
