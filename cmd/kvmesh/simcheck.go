package main

import (
	"fmt"
	"io"

	"github.com/kvmesh/kvmesh/internal/sim"
)

// The cells of `kvmesh sim --check`, the CI gate: the corners of the grid
// of issue 7 (docs/SIMULATION.md), so that every side of the envelope is
// checked on every run — all three workloads (a chat trace with a global
// system prompt, the same without it, and a few hot prompts), a light and
// a heavy load, an engine that runs 4 sequences (decode-bound, slots
// queue) and one that runs 256 (prefill-bound), and a cache of a quarter
// of the trace's blocks and one that holds them all. 3 × 2 × 2 × 2 = 24
// cells, about a minute on 2 cores. The middle values (load 0.6, 32
// slots) run in the full grid (--grid).
const (
	checkLoads      = "0.3,0.9"
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
	src := "the full Mooncake conversation trace built into the binary (internal/trace/testdata)"
	if tracePath != "" {
		src = tracePath
	}
	_, err := fmt.Fprintf(stdout, "check: workloads %s × loads %s × max-num-seqs %s × cache fractions %s on %s: "+
		"the corners of the grid (light and heavy load, decode-bound and prefill-bound engines, small and full cache, every workload); "+
		"gate: kvmesh-mesh's TTFT p50 and p99 <= round-robin's, least-loaded's and consistent-hash's, hit ratio >= 0.97x the best peer model's\n",
		*workloads, *loads, *mns, *caches, src)
	return err
}

// checkLosses prints every cell that fails a gate of the check, naming
// the gates, and returns how many did.
func checkLosses(stdout io.Writer, cells []sim.Cell) int {
	lost := 0
	for _, c := range cells {
		v := c.Verdict()
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
