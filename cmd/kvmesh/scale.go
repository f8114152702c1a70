package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/scale"
	"github.com/kvmesh/kvmesh/mesh"
)

// runScale runs N routers in one process over an in-memory network (or
// real sockets on 127.0.0.1) under a stream of new prompts and reports
// gossip, visibility, next-turn matches, decisions, CPU and memory.
func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	routers := fs.String("routers", "3", "routers; a comma list runs each")
	replicas := fs.Int("replicas", 6, "replicas, declared round-robin over the routers")
	rates := fs.String("rate", "200", "new prompts per second over all routers; a comma list runs each")
	duration := fs.Duration("duration", 10*time.Second, "load per run")
	blocks := fs.String("blocks", "4-8", "blocks per new prompt, min-max (1 block = 1 KB of text)")
	capacity := fs.Int("capacity", 16384, "cache blocks per replica (the router's default summary size)")
	latency := fs.Duration("latency", 0, "one-way latency of the in-memory network")
	loss := fs.Float64("loss", 0, "packet loss of the in-memory network (0..1)")
	real := fs.Bool("real", false, "run memberlist over UDP/TCP on 127.0.0.1 instead of in memory")
	decideEvery := fs.Int("decide-every", 1, "run the routing decision for one request in this many (the rest are placed by consistent hashing, as cold decisions are)")
	replays := fs.Int("replays", 200, "earlier prompts replayed at another router after each run")
	timing := fs.String("timing", "lan", "mesh timing: lan or test")
	seed := fs.Uint64("seed", 1, "seed")
	asJSON := fs.Bool("json", false, "print one JSON object per run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("scale: unexpected arguments %q", fs.Args())
	}
	lo, hi, ok := strings.Cut(*blocks, "-")
	if !ok {
		hi = lo
	}
	minB, err1 := strconv.Atoi(lo)
	maxB, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || minB < 1 || maxB < minB {
		return fmt.Errorf("scale: --blocks %q: want min-max", *blocks)
	}
	t := mesh.LANTiming()
	switch *timing {
	case "lan":
	case "test":
		t = mesh.TestTiming()
	default:
		return fmt.Errorf("scale: --timing %q: want lan or test", *timing)
	}
	ns, err := ints(*routers)
	if err != nil {
		return fmt.Errorf("scale: --routers: %w", err)
	}
	rs, err := floats(*rates)
	if err != nil {
		return fmt.Errorf("scale: --rate: %w", err)
	}
	for _, n := range ns {
		for _, rate := range rs {
			res, err := scale.Run(ctx, scale.Config{Routers: n, Replicas: *replicas, Rate: rate, Duration: *duration,
				MinBlocks: minB, MaxBlocks: maxB, Capacity: *capacity, Latency: *latency, Loss: *loss, Real: *real,
				Timing: t, Replays: *replays, Seed: *seed, Progress: stderr, DecideEvery: *decideEvery})
			if err != nil {
				return err
			}
			if *asJSON {
				if err := json.NewEncoder(stdout).Encode(res); err != nil {
					return err
				}
				continue
			}
			res.Report(stdout)
		}
	}
	return nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func floats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, x)
	}
	return out, nil
}
