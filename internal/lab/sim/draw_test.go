package sim

import (
	"context"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// A seed always draws the same cell, and the cells cover the envelope.
func TestDrawCellEnvelope(t *testing.T) {
	if !reflect.DeepEqual(DrawCellSeed(7), DrawCellSeed(7)) {
		t.Fatal("seed 7 draws two different cells")
	}
	if reflect.DeepEqual(DrawCellSeed(7), DrawCellSeed(8)) {
		t.Fatal("seeds 7 and 8 draw the same cell")
	}
	var loLoad, hiLoad, loMNS, hiMNS, loCache, hiCache, oneGroup, manyGroups bool
	procs := map[string]bool{}
	dists := map[string]bool{}
	for s := uint64(1); s <= 400; s++ {
		c := DrawCellSeed(s)
		if c.Seed != s {
			t.Fatalf("cell of seed %d says seed %d", s, c.Seed)
		}
		switch {
		case c.Load < 0.2 || c.Load > 0.95:
			t.Fatalf("seed %d: load %v outside 0.2-0.95", s, c.Load)
		case c.MaxNumSeqs < 1 || c.MaxNumSeqs > 256:
			t.Fatalf("seed %d: max-num-seqs %d outside 1-256", s, c.MaxNumSeqs)
		case c.CacheFraction < 0.1 || c.CacheFraction > 2:
			t.Fatalf("seed %d: cache %v outside 0.1-2", s, c.CacheFraction)
		case c.Workload.Groups < 1 || c.Workload.Groups > 64:
			t.Fatalf("seed %d: %d groups", s, c.Workload.Groups)
		}
		if err := c.Workload.Validate(); err != nil {
			t.Fatalf("seed %d: %v", s, err)
		}
		loLoad, hiLoad = loLoad || c.Load < 0.3, hiLoad || c.Load > 0.85
		loMNS, hiMNS = loMNS || c.MaxNumSeqs <= 2, hiMNS || c.MaxNumSeqs >= 128
		loCache, hiCache = loCache || c.CacheFraction < 0.15, hiCache || c.CacheFraction > 1.5
		oneGroup, manyGroups = oneGroup || c.Workload.Groups == 1, manyGroups || c.Workload.Groups >= 32
		procs[c.Workload.Arrivals.Process] = true
		dists[c.Workload.Question.Dist] = true
	}
	if !(loLoad && hiLoad && loMNS && hiMNS && loCache && hiCache && oneGroup && manyGroups) {
		t.Errorf("400 draws miss an edge of the envelope: load %v %v, mns %v %v, cache %v %v, groups %v %v",
			loLoad, hiLoad, loMNS, hiMNS, loCache, hiCache, oneGroup, manyGroups)
	}
	if len(procs) != 3 || !dists[trace.LengthLognormal] || !dists[trace.LengthPareto] {
		t.Errorf("arrival processes %v, question distributions %v", procs, dists)
	}
}

func TestLossTolerance(t *testing.T) {
	tests := []struct {
		mesh, base float64
		lost       bool
	}{
		{100, 100, false},
		{104, 100, false},   // 4 %
		{106, 100, true},    // 6 % and 6 ms
		{10, 8, false},      // 25 % but 2 ms
		{1040, 1000, false}, // 40 ms but 4 %
		{1060, 1000, true},
	}
	for _, tc := range tests {
		if got := Lost(tc.mesh, tc.base); got != tc.lost {
			t.Errorf("Lost(%v, %v) = %v, want %v", tc.mesh, tc.base, got, tc.lost)
		}
	}
	mesh := PolicyReport{Name: PolicyMesh, TTFTP50Ms: 100, TTFTP99Ms: 900}
	bases := []PolicyReport{
		{Name: PolicyRoundRobin, TTFTP50Ms: 120, TTFTP99Ms: 2000},
		{Name: PolicyLeastLoaded, TTFTP50Ms: 98, TTFTP99Ms: 700},
		{Name: PolicyConsistentHash, TTFTP50Ms: 90, TTFTP99Ms: 800},
	}
	got := Losses(mesh, bases)
	want := []Loss{{"p50", PolicyConsistentHash, 100, 90}, {"p99", PolicyLeastLoaded, 900, 700}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("losses %+v, want %+v", got, want)
	}
}

// A random cell runs the baselines and the mesh on its generated workload,
// the same way twice, and its line names each loss.
func TestRunRandomCell(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	c := DrawCellSeed(3)
	c.Workload.Requests = 300
	a, err := RunRandomCell(context.Background(), DefaultConfig(), c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunRandomCell(context.Background(), DefaultConfig(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("a cell runs differently twice")
	}
	if a.Requests != 300 || a.Mesh.Name != PolicyMesh || len(a.Baselines) != len(Baselines) {
		t.Fatalf("%d requests, mesh %q, %d baselines", a.Requests, a.Mesh.Name, len(a.Baselines))
	}
	for i, p := range a.Baselines {
		if p.Name != Baselines[i] || p.Requests != 300 {
			t.Fatalf("baseline %d: %s with %d requests", i, p.Name, p.Requests)
		}
	}
	a.Losses = []Loss{{"p99", PolicyLeastLoaded, 1200, 1000}}
	var out strings.Builder
	if err := WriteRandomLine(&out, a); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "LOSS-p99-vs-least-loaded(+20%,+200ms)") || !strings.HasPrefix(out.String(), "3 ") {
		t.Fatalf("line %q", out.String())
	}
	b.Losses = nil
	s := SummarizeRandom([]RandomResult{a, b})
	if s.Cells != 2 || s.Lost != 1 || s.ByBaseline[PolicyLeastLoaded] != 1 || s.ByMeasure["p99"] != 1 {
		t.Fatalf("summary %+v", s)
	}
}

// The summary's ratios are geometric means over the cells of kvmesh-mesh's
// TTFT over the best baseline's on each measure, each TTFT floored at 1 ms:
// a cell at half the best baseline's and one at twice it average to 1x.
func TestSummarizeRandomRatios(t *testing.T) {
	cell := func(mesh50, mesh99 float64, base ...[2]float64) RandomResult {
		r := RandomResult{Mesh: PolicyReport{Name: PolicyMesh, TTFTP50Ms: mesh50, TTFTP99Ms: mesh99}}
		for _, b := range base {
			r.Baselines = append(r.Baselines, PolicyReport{TTFTP50Ms: b[0], TTFTP99Ms: b[1]})
		}
		return r
	}
	s := SummarizeRandom([]RandomResult{
		// p50: half the best (40 of round-robin's 80, least-loaded's 90);
		// p99: twice the best (400 of least-loaded's 200).
		cell(40, 400, [2]float64{80, 300}, [2]float64{90, 200}),
		// p50: 1x (0 and 0.5 ms both floored to 1 ms); p99: half.
		cell(0, 100, [2]float64{0.5, 200}),
	})
	if math.Abs(s.P50Ratio-math.Sqrt(0.5)) > 1e-12 || math.Abs(s.P99Ratio-1) > 1e-12 {
		t.Fatalf("ratios p50 %v p99 %v, want %v and 1", s.P50Ratio, s.P99Ratio, math.Sqrt(0.5))
	}
	var out strings.Builder
	if err := s.Write(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "p50 0.707x, p99 1.000x") {
		t.Fatalf("summary line %q", out.String())
	}
}
