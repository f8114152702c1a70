package main

import (
	"fmt"
	"io"

	"github.com/kvmesh/kvmesh/internal/lab/sim"
)

// The cells of `kvmesh sim --check`, the CI gate: the grid of issue 7
// (docs/SIMULATION.md) without its 32-slot middle, so that every side of
// the envelope is checked on every run — all three workloads (a chat
// trace with a global system prompt, the same without it, and a few hot
// prompts), light, medium and heavy load, an engine that runs 4 sequences
// (decode-bound, slots queue) and one that runs 256 (prefill-bound; 32
// slots behave alike on these traces), and a cache of a quarter of the
// trace's blocks and one that holds them all. 3 × 3 × 2 × 2 = 36 cells,
// about half a minute on 2 cores.
const (
	checkLoads      = "0.3,0.6,0.9"
	checkMaxNumSeqs = "4,256"
	checkCaches     = "0.25,1"
)

// checkDefaults sets the check's cells on every grid list the user did
// not give and says which cells run and why.
func checkDefaults(stdout io.Writer, given map[string]bool, tracePath string, workloads, loads, mns, caches *string) error {
	if !given["loads"] {
		*loads = checkLoads
	}
	if !given["max-num-seqs-list"] {
		*mns = checkMaxNumSeqs
	}
	if !given["cache-fractions"] {
		*caches = checkCaches
	}
	src := "the full Mooncake conversation trace built into the binary (internal/lab/trace/testdata)"
	if tracePath != "" {
		src = tracePath
	}
	_, err := fmt.Fprintf(stdout, "check: workloads %s × loads %s × max-num-seqs %s × cache fractions %s on %s: "+
		"the grid without its 32-slot middle (light to heavy load, decode-bound and prefill-bound engines, small and full cache, every workload); "+
		"gate: kvmesh-mesh's TTFT p50 and p99 <= round-robin's, least-loaded's and consistent-hash's, hit ratio >= 0.97x the best peer model's\n",
		*workloads, *loads, *mns, *caches, src)
	return err
}

// lossCell names a cell of the grid the check does not gate, and why.
type lossCell struct {
	workload string
	load     float64
	mns      int
	cache    float64
	why      string
	// hitOnly exempts the cell's hit gate alone: its TTFT gates hold.
	hitOnly bool
}

// lossCells is a list of cells the check runs and prints but does not gate.
type lossCells []lossCell

// knownLosses are the corner cells that lose a gate today on some seed
// (docs/SIMULATION.md, grid section, says why). They run and print, but
// do not fail the check: it gates what holds, so that it catches
// regressions. Remove an entry when its cell holds on seeds 1-3.
var knownLosses = lossCells{
	// At 4 slots, load 0.9 and a quarter of the working set cached,
	// kvmesh moves requests off full holders: its hit ratio sits at
	// 0.964x-0.970x the best peer model's over seeds 1-10 (passing the
	// 0.97x gate on 3-4 of them, by the seed's Bloom false positives),
	// for a TTFT p50 and p99 about half that peer's (seed 1: 3110 and
	// 15883 ms against llm-d-epp's 7648 and 30492).
	{"no-shared-head", 0.9, 4, 0.25, "hit ~0.967x the best peer's, for half its TTFT", true},
}

func (l lossCells) find(c sim.Cell) (lossCell, bool) {
	for _, k := range l {
		if c.Workload == k.workload && c.Load == k.load && c.MaxNumSeqs == k.mns && c.CacheFraction == k.cache {
			return k, true
		}
	}
	return lossCell{}, false
}

// checkLosses prints every cell that fails a gate of the check, naming
// the gates, and returns how many did, the known losses not counted.
func checkLosses(stdout io.Writer, cells []sim.Cell, known lossCells) int {
	lost := 0
	for _, c := range cells {
		k, isKnown := known.find(c)
		if isKnown {
			what := "not gated"
			if k.hitOnly {
				what = "hit not gated"
			}
			fmt.Fprintf(stdout, "check: %s (known loss: %s): %s load %v max-num-seqs %d cache %v: "+
				"hit %.4f (best peer %.4f), p50 %.0f (best baseline %.0f), p99 %.0f (best baseline %.0f, %s)\n",
				what, k.why, c.Workload, c.Load, c.MaxNumSeqs, c.CacheFraction, c.Mesh.HitRatio, c.PeerHit.Value,
				c.Mesh.TTFTP50Ms, c.BaseP50.Value, c.Mesh.TTFTP99Ms, c.BaseP99.Value, c.BaseP99.Name)
			if !k.hitOnly {
				continue
			}
		}
		v := c.Verdict()
		if isKnown {
			v.Hit = true
		}
		var why []string
		if !v.BaseP50 {
			why = append(why, fmt.Sprintf("p50 %.0f > %s's %.0f ms", c.Mesh.TTFTP50Ms, c.BaseP50.Name, c.BaseP50.Value))
		}
		if !v.BaseP99 {
			why = append(why, fmt.Sprintf("p99 %.0f > %s's %.0f ms", c.Mesh.TTFTP99Ms, c.BaseP99.Name, c.BaseP99.Value))
		}
		if !v.Hit {
			why = append(why, fmt.Sprintf("hit %.4f < 0.97 × %s's %.4f", c.Mesh.HitRatio, c.PeerHit.Name, c.PeerHit.Value))
		}
		if len(why) == 0 {
			continue
		}
		lost++
		fmt.Fprintf(stdout, "check: LOST %s load %v max-num-seqs %d cache %v: %v\n", c.Workload, c.Load, c.MaxNumSeqs, c.CacheFraction, why)
	}
	return lost
}

// gatedCells counts the cells the check gates (all but the known losses
// exempt from every gate).
func gatedCells(cells []sim.Cell, known lossCells) int {
	n := 0
	for _, c := range cells {
		if k, ok := known.find(c); !ok || k.hitOnly {
			n++
		}
	}
	return n
}
