package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvmesh/kvmesh/internal/sim"
	"github.com/kvmesh/kvmesh/internal/trace"
)

// runSim simulates routing policies on a Mooncake trace in virtual time and
// prints their cache hits, TTFT and load balance, as a table or as one
// JSON object.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := sim.DefaultConfig()
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "Mooncake JSONL trace (default: the embedded 10-minute conversation slice)")
	replicas := fs.Int("replicas", def.Replicas, "number of replicas")
	routers := fs.Int("routers", def.Routers, "number of routers (DNS round-robin over them)")
	cacheFraction := fs.Float64("cache-fraction", def.CacheFraction, "total replica cache as a share of the trace's distinct blocks")
	cacheBlocks := fs.Int("cache-blocks", 0, "cache blocks per replica; overrides --cache-fraction when > 0")
	load := fs.Float64("load", def.Load, "scale arrivals so round-robin's replicas are this busy prefilling (0: trace timestamps)")
	prefill := fs.Float64("prefill-tokens-per-s", def.PrefillTokensPerS, "prefill rate per replica")
	decode := fs.Float64("decode-ms-per-token", def.DecodeMsPerToken, "decode time per output token")
	maxSeqs := fs.Int("max-num-seqs", def.MaxNumSeqs, "sequences a replica runs at once")
	interval := fs.Duration("gossip-interval", def.GossipInterval, "gossip period (virtual time)")
	delay := fs.Duration("gossip-delay", def.GossipDelay, "gossip delivery delay (virtual time)")
	staleAfter := fs.Duration("stale-after", def.StaleAfter, "stop counting a copy whose owner was silent this long")
	policies := fs.String("policies", strings.Join(sim.AllPolicies, ","), "comma-separated policies to run")
	seed := fs.Uint64("seed", def.Seed, "seed of block hashes and summary epochs")
	loadFactor := fs.Float64("load-factor", def.Route.LoadFactor, "route: bounded-load factor on queued prefill work")
	keyBlocks := fs.Int("key-blocks", def.Route.KeyBlocks, "route: blocks past the common prefix that key a cold request")
	minExcess := fs.Int("min-excess-blocks", def.Route.MinExcessBlocks, "route: blocks beyond the common prefix a match must hold")
	iff := fs.Float64("inflight-factor", def.Route.InFlightFactor, "route: in-flight bound as a multiple of the mean (hot-spot guard)")
	recompute := fs.Float64("recompute-weight", def.Route.RecomputeWeight, "route: score of a block the replica lacks, in units of its prefill time")
	workload := fs.String("workload", "trace", "trace: the trace as is; no-shared-head: the trace without the blocks every request shares (no global system prompt); hot-prompts: a synthetic trace dominated by a few hot prompts (ignores --trace)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}

	cfg := def
	cfg.Replicas, cfg.Routers = *replicas, *routers
	cfg.CacheFraction, cfg.CacheBlocks, cfg.Load = *cacheFraction, *cacheBlocks, *load
	cfg.PrefillTokensPerS, cfg.DecodeMsPerToken, cfg.MaxNumSeqs = *prefill, *decode, *maxSeqs
	cfg.GossipInterval, cfg.GossipDelay, cfg.StaleAfter = *interval, *delay, *staleAfter
	cfg.Seed = *seed
	cfg.Route.LoadFactor, cfg.Route.KeyBlocks, cfg.Route.MinExcessBlocks = *loadFactor, *keyBlocks, *minExcess
	cfg.Route.RecomputeWeight = *recompute
	cfg.Route.InFlightFactor = *iff
	cfg.Policies = nil
	for _, p := range strings.Split(*policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Policies = append(cfg.Policies, p)
		}
	}
	if len(cfg.Policies) == 0 {
		return errors.New("sim: --policies is empty")
	}

	var reqs []trace.Request
	if *tracePath == "" {
		reqs = trace.EmbeddedConversationSlice()
	} else {
		var err error
		if reqs, err = trace.LoadMooncake(*tracePath); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	switch *workload {
	case "trace":
	case "no-shared-head":
		reqs = trace.WithoutSharedHead(reqs)
	case "hot-prompts":
		reqs = trace.HotPrompts(trace.DefaultHotPrompts())
	default:
		return fmt.Errorf("sim: unknown --workload %q (trace, no-shared-head, hot-prompts)", *workload)
	}
	rep, err := sim.Run(ctx, cfg, reqs)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("sim: write json: %w", err)
		}
		return nil
	}
	return rep.WriteTable(stdout)
}
