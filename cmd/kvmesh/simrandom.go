package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/lab/sim"
)

// randomFlags are the flags of `kvmesh sim`'s random cells: cells drawn
// over the envelope of issue 22 (sim.DrawCell) on generated chat
// workloads, so that the routing is judged on workloads it was not tuned
// on. Cell k of `--random-cells N --random-seed S` is the cell of seed S+k,
// so any cell reruns alone with `--random-seeds S+k`.
type randomFlags struct {
	cells      *int
	seed       *uint64
	seeds      *string
	holdout    *bool
	reportOnly *bool
}

func bindRandomFlags(fs *flag.FlagSet) randomFlags {
	return randomFlags{
		cells: fs.Int("random-cells", 0, "run this many cells drawn over the envelope (generated chat workloads, load 0.2-0.95, 1-256 sequences, cache 0.1-2x the working set): kvmesh-mesh against round-robin, least-loaded and consistent-hash, one line per cell; exits non-zero when kvmesh-mesh loses (TTFT p50 or p99 worse than the best baseline's by more than 5% and 5 ms)"),
		seed:  fs.Uint64("random-seed", 1, "random cells: the seed of the first cell (cell k has seed S+k)"),
		seeds: fs.String("random-seeds", "", "random cells: comma-separated seeds to run instead of --random-cells/--random-seed"),
		holdout: fs.Bool("holdout", false, fmt.Sprintf("random cells: run the hold-out seeds %d-%d, which are never run while tuning (other flags refuse them)",
			sim.HoldoutFirst, sim.HoldoutFirst+sim.HoldoutCount-1)),
		reportOnly: fs.Bool("report-only", false, "random cells: print the losses but exit 0"),
	}
}

// active reports whether the flags ask for random cells.
func (f randomFlags) active() bool { return *f.cells > 0 || *f.seeds != "" || *f.holdout }

// list resolves the seeds to run; only --holdout runs hold-out seeds.
func (f randomFlags) list() ([]uint64, error) {
	var out []uint64
	switch {
	case *f.holdout:
		if *f.cells > 0 || *f.seeds != "" {
			return nil, errors.New("sim: --holdout runs the hold-out seeds on its own, without --random-cells or --random-seeds")
		}
		for i := uint64(0); i < sim.HoldoutCount; i++ {
			out = append(out, sim.HoldoutFirst+i)
		}
		return out, nil
	case *f.seeds != "":
		if *f.cells > 0 {
			return nil, errors.New("sim: give --random-seeds or --random-cells, not both")
		}
		for _, v := range splitList(*f.seeds) {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("sim: --random-seeds: bad seed %q", v)
			}
			out = append(out, s)
		}
	default:
		if *f.seed > ^uint64(0)-uint64(*f.cells) {
			return nil, errors.New("sim: --random-seed too large for --random-cells")
		}
		for k := 0; k < *f.cells; k++ {
			out = append(out, *f.seed+uint64(k))
		}
	}
	for _, s := range out {
		if sim.IsHoldout(s) {
			return nil, fmt.Errorf("sim: seed %d is in the hold-out set %d-%d, which is run only with --holdout and never while tuning",
				s, sim.HoldoutFirst, sim.HoldoutFirst+sim.HoldoutCount-1)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("sim: no random cells to run")
	}
	return out, nil
}

// runRandomCells runs the random cells the flags name on base (replicas,
// routers, engine and mesh timing; each cell sets load, max-num-seqs,
// cache and seed), one line per cell and a summary (one JSON object per
// cell with asJSON), and fails when kvmesh-mesh lost in a cell unless
// --report-only.
func runRandomCells(ctx context.Context, stdout io.Writer, base sim.Config, f randomFlags, asJSON bool) error {
	seeds, err := f.list()
	if err != nil {
		return err
	}
	if !asJSON {
		what := "seeds"
		if *f.holdout {
			what = "hold-out seeds (not for tuning)"
		}
		fmt.Fprintf(stdout, "random cells: %d drawn cells, %s %s; kvmesh-mesh against the baselines on TTFT p50/p99 (ms) and hit ratio; "+
			"a loss is a TTFT p50 or p99 worse than the best baseline's by more than %.0f%% and %.0f ms\n",
			len(seeds), what, seedRange(seeds), 100*sim.LossRel, sim.LossAbsMs)
		if err := sim.WriteRandomHeader(stdout); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(stdout)
	var results []sim.RandomResult
	for _, s := range seeds {
		r, err := sim.RunRandomCell(ctx, base, sim.DrawCellSeed(s))
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		results = append(results, r)
		if asJSON {
			err = enc.Encode(r)
		} else {
			err = sim.WriteRandomLine(stdout, r)
		}
		if err != nil {
			return err
		}
	}
	sum := sim.SummarizeRandom(results)
	if !asJSON {
		if err := sum.Write(stdout); err != nil {
			return err
		}
	}
	if sum.Lost > 0 && !*f.reportOnly {
		return fmt.Errorf("sim: kvmesh-mesh lost to a baseline in %d of %d random cells", sum.Lost, sum.Cells)
	}
	return nil
}

// seedRange prints seeds as "a-b" when consecutive, else as a list.
func seedRange(seeds []uint64) string {
	consecutive := true
	for i := 1; i < len(seeds); i++ {
		consecutive = consecutive && seeds[i] == seeds[i-1]+1
	}
	if consecutive && len(seeds) > 1 {
		return fmt.Sprintf("%d-%d", seeds[0], seeds[len(seeds)-1])
	}
	s := ""
	for i, v := range seeds {
		if i > 0 {
			s += ","
		}
		s += strconv.FormatUint(v, 10)
	}
	return s
}
