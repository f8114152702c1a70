package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/internal/lab/sim"
	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// runSim simulates routing policies on a Mooncake or LMBench trace in
// virtual time and prints their cache hits, TTFT and load balance, as a
// table or as one JSON object. With --grid it runs every workload × load ×
// max-num-seqs × cache fraction, one line per cell, and writes an HTML
// heat-map; with --check it runs a short grid and fails when kvmesh-mesh
// loses to a baseline or falls below 0.97× the best peer model's hit ratio.
// With --random-cells it draws cells over the envelope of issue 22 on
// generated workloads (simrandom.go).
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runSimEnv(ctx, args, stdout, stderr, os.LookupEnv)
}

func runSimEnv(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) error {
	def := sim.DefaultConfig()
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "Mooncake or LMBench JSONL trace (default: the embedded 10-minute conversation slice)")
	replicas := fs.Int("replicas", def.Replicas, "number of replicas")
	routers := fs.Int("routers", def.Routers, "number of routers (DNS round-robin over them)")
	cacheFraction := fs.Float64("cache-fraction", def.CacheFraction, "total replica cache as a share of the trace's distinct blocks")
	cacheBlocks := fs.Int("cache-blocks", 0, "cache blocks per replica; overrides --cache-fraction when > 0")
	load := fs.Float64("load", def.Load, "scale arrivals so round-robin's binding resource (prefill, or sequence slots under --max-num-seqs) is this busy (0: trace timestamps)")
	prefill := fs.Float64("prefill-tokens-per-s", def.PrefillTokensPerS, "prefill rate per replica")
	decode := fs.Float64("decode-ms-per-token", def.DecodeMsPerToken, "decode time per output token")
	maxSeqs := fs.Int("max-num-seqs", def.MaxNumSeqs, "sequences a replica runs at once")
	interval := fs.Duration("gossip-interval", def.GossipInterval, "gossip period (virtual time)")
	loadInterval := fs.Duration("load-interval", def.LoadInterval, "how often at most owners also send their replicas' load alone, when it changes, as the router's load beacons (virtual time; 0: only with the gossip ticks)")
	delay := fs.Duration("gossip-delay", def.GossipDelay, "gossip delivery delay (virtual time)")
	scrape := fs.Duration("scrape-interval", def.ScrapeInterval, "how often owners read their engines' running/waiting counts (virtual time)")
	smgSync := fs.Duration("smg-sync-interval", def.SMGSyncInterval, "smg-mesh model: how often its routers sync their radix trees, as SMG's mesh does every 1s (0: one tree shared at once)")
	eppRefresh := fs.Duration("epp-refresh-interval", def.EPPRefreshInterval, "llm-d-epp models: how often the EPP reads the engines' queue and KV utilization, as its metrics refresh does every 50ms (0: at every decision)")
	admitMaxWaiting := fs.Int("admit-max-waiting", def.AdmitMaxWaiting, "kvmesh policies: model the router's admission with this --admit-max-waiting (requests a replica may queue beyond its slots before the entry router holds new ones in its queue; 0: off)")
	lateBind := fs.Bool("late-bind", def.LateBind, "kvmesh policies: owners keep their replicas' queues and send a held request to the first of their replicas that can start it, decided again (the router's --late-bind)")
	slotsPublished := fs.Bool("slots-published", def.SlotsPublished, "engines publish max-num-seqs (otherwise routers learn it from running/waiting)")
	probeSlots := fs.Bool("probe-slots", def.ProbeSlots, "owners read an engine of unknown slots at once when sending it more than it was seen running, as the router does (--probe-slots=false: only every --scrape-interval)")
	staleAfter := fs.Duration("stale-after", def.StaleAfter, "stop counting a copy whose owner was silent this long")
	policies := fs.String("policies", strings.Join(sim.AllPolicies, ","), "comma-separated policies to run")
	seed := fs.Uint64("seed", def.Seed, "seed of block hashes and summary epochs")
	capErr := fs.Float64("capacity-error", def.CapacityError, "size the summaries for this multiple of the engines' real cache (2: routers assume twice what the engines hold)")
	correction := fs.String("correction", def.Correction, "what an owner does when the engine reports fewer cached blocks than predicted: "+strings.Join(sim.Corrections, ", "))
	pf := bindPolicyFlags(fs)
	workload := fs.String("workload", "trace", "trace: the trace as is; no-shared-head: the trace without the blocks every request shares (no global system prompt); hot-prompts: a synthetic trace dominated by a few hot prompts (ignores --trace)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table (with --grid: one per cell)")
	grid := fs.Bool("grid", false, "run the grid --workloads × --loads × --max-num-seqs-list × --cache-fractions, one line per cell")
	check := fs.Bool("check", false, "run the CI grid (36 cells: the grid at 4 and 256 slots; on --trace, default the full conversation trace built in) and exit non-zero when kvmesh-mesh loses to round-robin, least-loaded or consistent-hash on TTFT p50/p99 or its hit ratio is below 0.97x the best peer model's")
	workloads := fs.String("workloads", "trace,no-shared-head,hot-prompts", "grid: comma-separated workloads")
	loads := fs.String("loads", "0.3,0.6,0.9", "grid: comma-separated loads")
	mnsList := fs.String("max-num-seqs-list", "4,32,256", "grid: comma-separated max-num-seqs")
	cacheList := fs.String("cache-fractions", "0.25,1", "grid: comma-separated cache fractions")
	htmlPath := fs.String("html", "kvmesh-sim-grid.html", "grid: write the heat-map here (empty: none)")
	rf := bindRandomFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}
	if err := applyEnv(fs, getenv); err != nil {
		return err
	}
	rp, err := pf.Policy()
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}

	cfg := def
	cfg.Replicas, cfg.Routers = *replicas, *routers
	cfg.CacheFraction, cfg.CacheBlocks, cfg.Load = *cacheFraction, *cacheBlocks, *load
	cfg.PrefillTokensPerS, cfg.DecodeMsPerToken, cfg.MaxNumSeqs = *prefill, *decode, *maxSeqs
	cfg.GossipInterval, cfg.GossipDelay, cfg.StaleAfter, cfg.LoadInterval = *interval, *delay, *staleAfter, *loadInterval
	cfg.ScrapeInterval, cfg.SlotsPublished, cfg.SMGSyncInterval = *scrape, *slotsPublished, *smgSync
	cfg.ProbeSlots = *probeSlots
	cfg.AdmitMaxWaiting, cfg.LateBind = *admitMaxWaiting, *lateBind
	cfg.EPPRefreshInterval = *eppRefresh
	cfg.Seed = *seed
	cfg.CapacityError, cfg.Correction = *capErr, *correction
	cfg.Route = rp
	cfg.Policies = splitList(*policies)
	if len(cfg.Policies) == 0 {
		return errors.New("sim: --policies is empty")
	}

	if rf.active() {
		if *grid || *check {
			return errors.New("sim: --random-cells/--random-seeds/--holdout run on their own, without --grid or --check")
		}
		return runRandomCells(ctx, stdout, cfg, rf, *asJSON)
	}

	var base []trace.Request
	if *tracePath == "" {
		base = trace.EmbeddedConversationSlice()
	} else {
		if base, err = trace.Load(*tracePath); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	if !*grid && !*check {
		reqs, err := workloadReqs(*workload, base)
		if err != nil {
			return err
		}
		rep, err := sim.Run(ctx, cfg, reqs)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(rep); err != nil {
				return fmt.Errorf("sim: write json: %w", err)
			}
			return nil
		}
		return rep.WriteTable(stdout)
	}

	g := sim.Grid{Base: cfg}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if *check {
		if err := checkDefaults(stdout, given, *tracePath, workloads, loads, mnsList, cacheList); err != nil {
			return err
		}
		if *tracePath == "" {
			base = trace.EmbeddedConversationTrace()
		}
		if !given["policies"] {
			g.Base.Policies = sim.CheckPolicies()
		}
		if !given["html"] {
			*htmlPath = ""
		}
	} else if !given["policies"] {
		g.Base.Policies = sim.GridPolicies()
	}
	for _, w := range splitList(*workloads) {
		reqs, err := workloadReqs(w, base)
		if err != nil {
			return err
		}
		g.Workloads = append(g.Workloads, sim.Workload{Name: w, Reqs: reqs})
	}
	if g.Loads, err = floatList("loads", *loads); err != nil {
		return err
	}
	if g.CacheFractions, err = floatList("cache-fractions", *cacheList); err != nil {
		return err
	}
	for _, v := range splitList(*mnsList) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("sim: --max-num-seqs-list: bad value %q", v)
		}
		g.MaxNumSeqs = append(g.MaxNumSeqs, n)
	}
	if len(g.Workloads) == 0 || len(g.Loads) == 0 || len(g.MaxNumSeqs) == 0 || len(g.CacheFractions) == 0 {
		return errors.New("sim: the grid is empty")
	}
	if !*asJSON {
		if err := sim.WriteGridHeader(stdout); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(stdout)
	cells, err := sim.RunGrid(ctx, g, func(c sim.Cell) error {
		if *asJSON {
			return enc.Encode(c)
		}
		return sim.WriteGridLine(stdout, c)
	})
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	sum := sim.Summarize(cells)
	if !*asJSON {
		if err := sum.Write(stdout); err != nil {
			return err
		}
	}
	if *htmlPath != "" {
		f, err := os.Create(*htmlPath)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		title := fmt.Sprintf("kvmesh sim grid, seed %d", cfg.Seed)
		if err := sim.WriteHeatmap(f, title, cells); err != nil {
			f.Close()
			return fmt.Errorf("sim: heat-map: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("sim: heat-map: %w", err)
		}
		fmt.Fprintf(stderr, "sim: heat-map written to %s\n", *htmlPath)
	}
	if *check {
		if lost := checkLosses(stdout, cells, knownLosses); lost > 0 {
			return fmt.Errorf("sim: check failed: kvmesh-mesh lost to a baseline or on hit ratio in %d of %d cells", lost, len(cells))
		}
		fmt.Fprintf(stdout, "check passed: in every gated cell (%d of %d) kvmesh-mesh's TTFT p50 and p99 are <= every baseline's and its hit ratio >= 0.97x the best peer model's\n", gatedCells(cells, knownLosses), sum.Cells)
	}
	return nil
}

// workloadReqs derives a named workload from the base trace.
func workloadReqs(name string, base []trace.Request) ([]trace.Request, error) {
	switch name {
	case "trace":
		return base, nil
	case "no-shared-head":
		return trace.WithoutSharedHead(base), nil
	case "hot-prompts":
		return trace.HotPrompts(trace.DefaultHotPrompts()), nil
	}
	return nil, fmt.Errorf("sim: unknown workload %q (trace, no-shared-head, hot-prompts)", name)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func floatList(name, s string) ([]float64, error) {
	var out []float64
	for _, v := range splitList(s) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			return nil, fmt.Errorf("sim: --%s: bad value %q", name, v)
		}
		out = append(out, f)
	}
	return out, nil
}
