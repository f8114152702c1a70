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
}

// lossCells is a list of cells the check runs and prints but does not gate.
type lossCells []lossCell

// knownLosses are the corner cells that lose a gate today on some seed
// (docs/SIMULATION.md, grid section, says why). They run and print, but
// do not fail the check: it gates what holds, so that it catches
// regressions. Remove an entry when its cell holds on seeds 1-3. Empty:
// the last cell to lose, hot-prompts 0.6/4/1 (p99 1274 against
// round-robin's 1272 ms on seeds 2-3), holds because a hot prompt's copy
// goes only to idle replicas (1255 ms on seeds 1-3).
var knownLosses = lossCells{}

func (l lossCells) find(c sim.Cell) (string, bool) {
	for _, k := range l {
		if c.Workload == k.workload && c.Load == k.load && c.MaxNumSeqs == k.mns && c.CacheFraction == k.cache {
			return k.why, true
		}
	}
	return "", false
}

// checkLosses prints every cell that fails a gate of the check, naming
// the gates, and returns how many did, the known losses not counted.
func checkLosses(stdout io.Writer, cells []sim.Cell, known lossCells) int {
	lost := 0
	for _, c := range cells {
		if why, ok := known.find(c); ok {
			fmt.Fprintf(stdout, "check: not gated (known loss: %s): %s load %v max-num-seqs %d cache %v: "+
				"hit %.4f (best peer %.4f), p50 %.0f (best baseline %.0f), p99 %.0f (best baseline %.0f, %s)\n",
				why, c.Workload, c.Load, c.MaxNumSeqs, c.CacheFraction, c.Mesh.HitRatio, c.PeerHit.Value,
				c.Mesh.TTFTP50Ms, c.BaseP50.Value, c.Mesh.TTFTP99Ms, c.BaseP99.Value, c.BaseP99.Name)
			continue
		}
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

// gatedCells counts the cells the check gates (all but the known losses).
func gatedCells(cells []sim.Cell, known lossCells) int {
	n := 0
	for _, c := range cells {
		if _, ok := known.find(c); !ok {
			n++
		}
	}
	return n
}
