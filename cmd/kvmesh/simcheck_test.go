package main

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/lab/sim"
)

// The check fails on a lost gate in a gated cell, names it, and runs but
// does not count a known loss.
func TestCheckLosses(t *testing.T) {
	cell := func(workload string, load float64, mns int, cache, p99, hit float64) sim.Cell {
		c := sim.Cell{Workload: workload, Load: load, MaxNumSeqs: mns, CacheFraction: cache}
		c.Mesh.TTFTP50Ms, c.Mesh.TTFTP99Ms, c.Mesh.HitRatio = 100, p99, hit
		c.BaseP50 = sim.Named{Name: "round-robin", Value: 200}
		c.BaseP99 = sim.Named{Name: "least-loaded", Value: 1000}
		c.PeerHit = sim.Named{Name: "llm-d-epp", Value: 0.5}
		return c
	}
	tests := []struct {
		name  string
		cells []sim.Cell
		lost  int
		out   []string
	}{
		{"all hold", []sim.Cell{cell("trace", 0.3, 4, 1, 900, 0.5)}, 0, nil},
		{"p99 over a baseline", []sim.Cell{cell("trace", 0.9, 4, 1, 1100, 0.5)}, 1,
			[]string{"LOST trace load 0.9 max-num-seqs 4 cache 1", "p99 1100 > least-loaded's 1000"}},
		{"hit below 0.97x", []sim.Cell{cell("hot-prompts", 0.3, 256, 0.25, 900, 0.48)}, 1, []string{"hit 0.4800 < 0.97"}},
		{"known loss not gated", []sim.Cell{cell("hot-prompts", 0.6, 4, 1, 1100, 0.5)}, 0, []string{"not gated (known loss"}},
		// A hit-only known loss still gates the cell's TTFT.
		{"hit-only known loss, hit low", []sim.Cell{cell("no-shared-head", 0.9, 4, 0.25, 900, 0.4)}, 0, []string{"hit not gated (known loss"}},
		{"hit-only known loss, p99 over a baseline", []sim.Cell{cell("no-shared-head", 0.9, 4, 0.25, 1100, 0.4)}, 1,
			[]string{"LOST no-shared-head load 0.9", "p99 1100 > least-loaded's 1000"}},
		// A known loss names its own cell only.
		{"the neighbour of a known loss gated", []sim.Cell{cell("hot-prompts", 0.6, 4, 0.25, 1100, 0.5)}, 1,
			[]string{"LOST hot-prompts load 0.6 max-num-seqs 4 cache 0.25"}},
	}
	// The test names its own known loss, apart from the check's list.
	known := lossCells{{"hot-prompts", 0.6, 4, 1, "a test's", false}, {"no-shared-head", 0.9, 4, 0.25, "a test's hit", true}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if got := checkLosses(&b, tc.cells, known); got != tc.lost {
				t.Fatalf("lost %d, want %d; output:\n%s", got, tc.lost, b.String())
			}
			for _, want := range tc.out {
				if !strings.Contains(b.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, b.String())
				}
			}
			if tc.out == nil && b.Len() > 0 {
				t.Errorf("unexpected output:\n%s", b.String())
			}
		})
	}
}
