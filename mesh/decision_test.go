package mesh

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkDecision is one routing decision at one router over 1,024
// replicas with warm summaries: Candidates, probes of a 32-block prompt
// (32 KB of text: new, or the longest held prefix of one), and
// route.Policy.Pick. Besides the mean it reports the p50 and p99 of single
// decisions (issue 9: p99 ≤ 100 µs), over the last decisions timed one by one.
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
	warmIndex(a.Mesh, rng)
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "new-32-blocks", true: "held-32-blocks"}[warm], func(b *testing.B) {
			b.ReportAllocs()
			p := route.DefaultPolicy()
			var buf CandidateBuffer
			var cands []route.Candidate
			hashes := make([]uint64, 32)
			probes := make([]summary.Probe, 0, 32)
			lat := newLatencies()
			i := 0
			for b.Loop() {
				t0 := time.Now()
				if warm {
					copy(hashes, held[i%len(held)])
				} else {
					for j := range hashes {
						hashes[j] = rng.Uint64()
					}
				}
				i++
				cands = a.CandidatesInto("m", &buf)
				probes = summary.MakeProbes(probes[:0], hashes)
				p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
				lat.add(time.Since(t0))
			}
			lat.report(b)
		})
	}
}

// latencies keeps the last samples of a benchmark's single operations in a
// ring allocated up front, so the timing allocates nothing per operation.
type latencies struct {
	ring []time.Duration
	n    int
}

func newLatencies() *latencies { return &latencies{ring: make([]time.Duration, 1<<16)} }

func (l *latencies) add(d time.Duration) {
	l.ring[l.n&(len(l.ring)-1)] = d
	l.n++
}

// report adds p50 and p99, in µs, to the benchmark's metrics.
func (l *latencies) report(b *testing.B) { l.reportAs(b, "") }

// reportAs is report with the metrics' names prefixed.
func (l *latencies) reportAs(b *testing.B, prefix string) {
	s := slices.Clone(l.ring[:min(l.n, len(l.ring))])
	if len(s) == 0 {
		return
	}
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1000 }
	b.ReportMetric(at(0.50), prefix+"p50-µs")
	b.ReportMetric(at(0.99), prefix+"p99-µs")
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

// BenchmarkDecisionCold is BenchmarkDecision's new prompts with 32 MB of
// other data read between decisions (untimed), as when the deciding
// thread comes back to caches other work has filled (a loaded machine,
// sixteen routers in one process): every line a decision touches is then
// a miss, so this is the figure a smaller working set improves. It
// reports the wall and thread-CPU p50 and p99.
func BenchmarkDecisionCold(b *testing.B) {
	a, rng := owning1024(b)
	p := route.DefaultPolicy()
	var buf CandidateBuffer
	hashes := make([]uint64, 32)
	probes := make([]summary.Probe, 0, 32)
	sweep := make([]uint64, 32<<20/8)
	sink := uint64(0)
	wall, cpu := newLatencies(), newLatencies()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		b.StopTimer()
		sink += coldPrompt(sweep, hashes, rng)
		b.StartTimer()
		probes = timedDecision(a, p, &buf, hashes, probes, wall, cpu)
	}
	wall.report(b)
	cpu.reportAs(b, "cpu-")
	if sink == 1 {
		b.Log(sink)
	}
}

// BenchmarkDecisionMarking is BenchmarkDecision's new prompts while the
// collector runs cycle after cycle (a goroutine calling runtime.GC), as
// in a busy router whose heap churns: while it marks, every pointer a
// decision writes to the heap goes through the write barrier, which is
// what this figure shows (copying the candidates whole made these
// decisions' p99 two to three times the quiet one's). It reports the
// wall and thread-CPU p50 and p99, and the cycles run.
func BenchmarkDecisionMarking(b *testing.B) {
	a, rng := owning1024(b)
	stopChurn := collectorChurn()
	p := route.DefaultPolicy()
	var buf CandidateBuffer
	hashes := make([]uint64, 32)
	probes := make([]summary.Probe, 0, 32)
	wall, cpu := newLatencies(), newLatencies()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	runtime.LockOSThread()
	for b.Loop() {
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		probes = timedDecision(a, p, &buf, hashes, probes, wall, cpu)
	}
	runtime.UnlockOSThread()
	stopChurn()
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(ms1.NumGC-ms0.NumGC), "gc-cycles")
	wall.report(b)
	cpu.reportAs(b, "cpu-")
}

// timedDecision makes one decision for a new prompt (CandidatesInto,
// probes, Pick) on a locked thread and adds its wall and thread-CPU time
// to wall and cpu; it returns probes for reuse.
func timedDecision(a *testRouter, p route.Policy, buf *CandidateBuffer, hashes []uint64, probes []summary.Probe, wall, cpu *latencies) []summary.Probe {
	// The CPU clock (a system call) is read outside the wall clock's
	// window, as the scale harness does: the kernel switches a thread out
	// on its way back from one.
	c0 := threadcpu.OrWall()
	t0 := time.Now()
	cands := a.CandidatesInto("m", buf)
	probes = summary.MakeProbes(probes[:0], hashes)
	p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
	wall.add(time.Since(t0))
	cpu.add(threadcpu.OrWall() - c0)
	return probes
}

// BenchmarkDecisionRotating is the scale harness's decision in the lab:
// new 32-block prompts decided at four routers in turn (each owning
// 1,024 replicas) with one CandidateBuffer, 8 MB of other data read
// between decisions (untimed), as the harness's sixteen routers' ingest
// does. It reports the thread-CPU p50 and p99 of the whole decision and
// of its parts: fill (CandidatesInto and the probes), index (the first
// Match, which asks the Index for every summary) and pick (Pick with the
// answers at hand). "marking" has a goroutine run the collector cycle
// after cycle meanwhile (BenchmarkDecisionMarking): the decisions of the
// harness's mark phases were its slowest.
func BenchmarkDecisionRotating(b *testing.B) {
	var rs []*testRouter
	var rng *rand.Rand
	for range 4 {
		var a *testRouter
		a, rng = owning1024(b)
		rs = append(rs, a)
	}
	b.Run("quiet", func(b *testing.B) { rotating(b, rs, rng, false) })
	b.Run("marking", func(b *testing.B) { rotating(b, rs, rng, true) })
}

// collectorChurn runs the collector cycle after cycle on a goroutine of
// its own until the returned stop is called (which waits for it).
func collectorChurn() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				runtime.GC()
			}
		}
	}()
	return func() { close(quit); <-done }
}

func rotating(b *testing.B, rs []*testRouter, rng *rand.Rand, marking bool) {
	if marking {
		defer collectorChurn()()
	}
	p := route.DefaultPolicy()
	var buf CandidateBuffer
	hashes := make([]uint64, 32)
	var probes []summary.Probe
	sweep := make([]uint64, 8<<20/8)
	sink := uint64(0)
	whole, fill, index, pick := newLatencies(), newLatencies(), newLatencies(), newLatencies()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	i := 0
	for b.Loop() {
		b.StopTimer()
		sink += coldPrompt(sweep, hashes, rng)
		a := rs[i%len(rs)]
		i++
		b.StartTimer()
		c0 := threadcpu.OrWall()
		cands := a.CandidatesInto("m", &buf)
		probes = summary.MakeProbes(probes[:0], hashes)
		c1 := threadcpu.OrWall()
		cands[0].Summary.Match(probes)
		c2 := threadcpu.OrWall()
		p.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
		c3 := threadcpu.OrWall()
		whole.add(c3 - c0)
		fill.add(c1 - c0)
		index.add(c2 - c1)
		pick.add(c3 - c2)
	}
	whole.reportAs(b, "cpu-")
	fill.reportAs(b, "fill-cpu-")
	index.reportAs(b, "index-cpu-")
	pick.reportAs(b, "pick-cpu-")
	if sink == 1 {
		b.Log(sink)
	}
}

// coldPrompt readies a decision on a cold machine: it writes one word of
// each cache line of sweep (evicting the caches, as a router's other
// work does between decisions) and draws a new prompt into hashes. The
// sum it returns keeps the sweep from being optimized away.
func coldPrompt(sweep, hashes []uint64, rng *rand.Rand) (sum uint64) {
	for i := 0; i < len(sweep); i += 8 {
		sweep[i]++
		sum += sweep[i]
	}
	for j := range hashes {
		hashes[j] = rng.Uint64()
	}
	return sum
}
