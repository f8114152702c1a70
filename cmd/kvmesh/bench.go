package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/bench"
	"github.com/kvmesh/kvmesh/internal/trace"
)

// benchGroup is one set of front ends benched together under one name.
type benchGroup struct {
	name      string
	frontends []string
}

// groupFlag collects --group name=URL,URL values.
type groupFlag []benchGroup

func (g *groupFlag) String() string {
	parts := make([]string, len(*g))
	for i, x := range *g {
		parts[i] = x.name + "=" + strings.Join(x.frontends, ",")
	}
	return strings.Join(parts, " ")
}

func (g *groupFlag) Set(v string) error {
	name, urls, ok := strings.Cut(v, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("want name=URL[,URL...], got %q", v)
	}
	var l listFlag
	_ = l.Set(urls)
	if len(l) == 0 {
		return fmt.Errorf("group %q has no URLs", name)
	}
	*g = append(*g, benchGroup{name: name, frontends: l})
	return nil
}

// runBench replays a trace against one or more groups of OpenAI front ends,
// one group after another, and prints a table (or JSON) of what each got.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvmesh bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		frontends listFlag
		groups    groupFlag
	)
	tracePath := fs.String("trace", "", "Mooncake JSONL trace (default: the built-in first 10 minutes of the Mooncake conversation trace)")
	fs.Var(&frontends, "frontend", "front-end base URL, e.g. http://127.0.0.1:8000 (repeatable, or a comma list); requests go to them in turn")
	fs.Var(&groups, "group", "name=URL,URL: a named group of front ends to bench (repeatable; groups run one after another)")
	name := fs.String("name", "bench", "label of the --frontend result")
	model := fs.String("model", "", "model name (default: the first model the first front end lists at /v1/models)")
	speedup := fs.Float64("speedup", 1, "divide trace arrival times by this")
	concurrency := fs.Int("concurrency", bench.DefaultConcurrency, "max requests in flight; later arrivals wait")
	duration := fs.Duration("duration", 0, "stop issuing requests after this much wall time (0 = whole trace)")
	maxRequests := fs.Int("max-requests", 0, "replay at most this many requests (0 = all)")
	jsonOut := fs.Bool("json", false, `print results as one JSON object {"frontends":[...]} instead of a table`)
	reportPath := fs.String("report", "", "also write a self-contained HTML report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	var all []benchGroup
	if len(frontends) > 0 {
		all = append(all, benchGroup{name: *name, frontends: frontends})
	}
	all = append(all, groups...)
	if len(all) == 0 {
		return errors.New("bench: need --frontend URL or --group name=URL,...")
	}
	if *speedup <= 0 {
		return fmt.Errorf("bench: --speedup must be positive, got %v", *speedup)
	}
	if *concurrency <= 0 {
		return fmt.Errorf("bench: --concurrency must be positive, got %d", *concurrency)
	}

	var reqs []trace.Request
	if *tracePath == "" {
		reqs = trace.EmbeddedConversationSlice()
	} else {
		var err error
		if reqs, err = trace.LoadMooncake(*tracePath); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}

	client := bench.DefaultHTTPClient(*concurrency)
	if *model == "" {
		m, err := firstModel(ctx, client, all[0].frontends[0])
		if err != nil {
			return fmt.Errorf("bench: no --model given and %w", err)
		}
		*model = m
	}

	n := len(reqs)
	if *maxRequests > 0 {
		n = min(n, *maxRequests)
	}
	var results []bench.Result
	var runErr error
	for _, g := range all {
		fmt.Fprintf(stderr, "bench %s: %d requests, model %s, front ends %s\n",
			g.name, n, *model, strings.Join(g.frontends, ","))
		res, err := bench.Run(ctx, g.name, bench.Config{
			Frontends:   g.frontends,
			Requests:    reqs,
			Model:       *model,
			Speedup:     *speedup,
			Concurrency: *concurrency,
			Duration:    *duration,
			MaxRequests: *maxRequests,
			Progress:    stderr,
			HTTPClient:  client,
		})
		results = append(results, res)
		if err != nil {
			// Cancelled: report what was measured so far, then stop.
			runErr = err
			break
		}
	}

	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Frontends []bench.Result `json:"frontends"`
		}{results}); err != nil {
			return fmt.Errorf("bench: write json: %w", err)
		}
	} else if err := bench.WriteTable(stdout, results); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if *reportPath != "" {
		if err := writeReport(*reportPath, results); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	return runErr
}

// firstModel asks a front end which models it serves and returns the first.
func firstModel(ctx context.Context, client *http.Client, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	url := strings.TrimRight(base, "/") + "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("list models at %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models at %s: HTTP %d", url, resp.StatusCode)
	}
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return "", fmt.Errorf("list models at %s: %w", url, err)
	}
	if len(body.Data) == 0 || body.Data[0].ID == "" {
		return "", fmt.Errorf("list models at %s: no models listed", url)
	}
	return body.Data[0].ID, nil
}

func writeReport(path string, results []bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := bench.WriteHTMLReport(f, results); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write report %s: %w", path, err)
	}
	return nil
}
