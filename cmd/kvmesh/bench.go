package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/bench"
	"github.com/kvmesh/kvmesh/internal/lab/lb"
	"github.com/kvmesh/kvmesh/internal/lab/trace"
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
	var conv bench.ConvConfig
	fs.IntVar(&conv.Conversations, "conversations", 0, "run the multi-turn chat workload with this many conversations instead of a trace (see --turns, --clients, --think)")
	fs.IntVar(&conv.Turns, "turns", 6, "conversations: turns per conversation")
	fs.IntVar(&conv.Clients, "clients", 12, "conversations: concurrent clients, each running one conversation at a time")
	fs.DurationVar(&conv.Think, "think", 400*time.Millisecond, "conversations: think time between an answer and the next question")
	fs.IntVar(&conv.SystemWords, "system-words", 250, "conversations: words of the shared system prompt")
	fs.IntVar(&conv.DocumentWords, "document-words", 600, "conversations: words of each conversation's document (in its first turn)")
	fs.IntVar(&conv.TurnWords, "turn-words", 30, "conversations: words of each user question")
	fs.IntVar(&conv.AnswerTokens, "answer-tokens", 100, "conversations: max_tokens of each turn (the median with --answer-sigma)")
	fs.Float64Var(&conv.AnswerSigma, "answer-sigma", 0, "conversations: draw each turn's max_tokens lognormal with median --answer-tokens and this σ, clamped to [1, 16 × median], from --seed, the conversation and the turn (the same lengths for every front end and run of a seed); 0: every turn asks --answer-tokens")
	fs.BoolVar(&conv.IgnoreEOS, "ignore-eos", false, `conversations: send "ignore_eos": true (llama.cpp's server and vLLM honour it), so each answer runs to its max_tokens`)
	fs.Uint64Var(&conv.Seed, "seed", 1, "conversations: text generation seed")
	requestIDs := fs.Bool("request-ids", false, "conversations: send each turn with X-Request-Id GROUP-cC-tT (its group's name, conversation and turn from 0), so what the engines log or trace of it joins to the JSON's per-turn records")
	commit := fs.String("commit", "", "conversations: label results with the commit of the front end under test")
	var resets listFlag
	fs.Var(&resets, "reset-replica", "conversations: replica base URL whose prefix cache is emptied (POST /reset_prefix_cache, as vLLM and replica-sim serve it) before each group, so front ends sharing replicas each start cold (repeatable, or a comma list)")
	instant := fs.String("instant-replica", "", "serve an instant OpenAI replica (the overhead benchmark's upstream) on this HOST:PORT until interrupted, and nothing else")
	tokenGap := fs.Duration("token-gap", time.Millisecond, "instant replica: pause between streamed tokens")
	tcpRelay := fs.String("tcp-relay", "", "serve a bare TCP relay to --direct on this HOST:PORT until interrupted (a read/write loop per direction, no HTTP): the overhead benchmark's floor for Go's runtime alone")
	balance := fs.String("balance", "", "serve a standard load balancer (--balance-policy, over the --backend URLs, blind to caches) on this HOST:PORT until interrupted: the baseline of the real-engine suites")
	balancePolicy := fs.String("balance-policy", lb.RoundRobin, "balance: "+lb.RoundRobin+" or "+lb.LeastConnections)
	var backends listFlag
	fs.Var(&backends, "backend", "balance: a replica base URL (repeatable, or a comma list)")
	stdProxy := fs.String("reverse-proxy", "", "serve Go's standard reverse proxy (httputil.ReverseProxy, flushing every write) to --direct on this HOST:PORT until interrupted: the overhead benchmark's floor for a Go proxy")
	overhead := fs.Bool("overhead", false, "measure front ends' overhead over the instant replica at --direct: req/s and added latency at --overhead-concurrency, then process CPU per relayed stream (--group name=URL front ends, --pid name=PID)")
	direct := fs.String("direct", "", "overhead: base URL of the instant replica itself")
	var pids listFlag
	fs.Var(&pids, "pid", "overhead: name=PID of a front end's process, for its CPU time per stream (repeatable)")
	var ohConc listFlag
	fs.Var(&ohConc, "overhead-concurrency", "overhead: closed-loop clients per step (default 16,1)")
	ohRound := fs.Duration("round", 3*time.Second, "overhead: duration of one front end at one concurrency")
	ohRounds := fs.Int("rounds", 3, "overhead: interleaved rounds")
	ohBody := fs.Int("body-bytes", 8192, "overhead: request body size")
	ohStreams := fs.Int("streams", 200, "overhead: streams per front end for the CPU step (negative: skip)")
	ohTokens := fs.Int("stream-tokens", 1000, "overhead: tokens per stream")
	ohBase := fs.String("baseline", "haproxy", "overhead: the group the ratios are taken against")
	var slow bench.SlowConfig
	fs.IntVar(&slow.Stalled, "slow-clients", 0, "open this many streaming requests to --frontend (a router) that read nothing (or --read-rate bytes/s), while --normal-clients keep sending small streams; report the router's goroutines, RSS and descriptors (--admin, --router-pid) and the normal clients' latency, every second for --hold")
	fs.IntVar(&slow.ReadRate, "read-rate", 0, "slow clients: bytes a second each stalled reader reads (0: none)")
	fs.IntVar(&slow.Tokens, "slow-tokens", 100000, "slow clients: max_tokens of a stalled stream (more than socket buffers hold)")
	fs.IntVar(&slow.Normal, "normal-clients", 4, "slow clients: closed-loop normal clients")
	fs.DurationVar(&slow.Hold, "hold", 30*time.Second, "slow clients: how long the stalled streams are watched")
	adminURL := fs.String("admin", "", "slow clients: the router's admin base URL (/metrics)")
	fs.IntVar(&slow.PID, "router-pid", 0, "slow clients: the router's process ID (RSS, descriptors)")
	var tableFrom listFlag
	fs.Var(&tableFrom, "table-from", "print the table of earlier --conversations --json outputs (files, repeatable or a comma list) and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	if len(tableFrom) > 0 {
		return convTableFrom(tableFrom, stdout)
	}
	if *tcpRelay != "" {
		return serveTCPRelay(ctx, *tcpRelay, *direct, stderr)
	}
	if *balance != "" {
		return serveBalancer(ctx, *balance, *balancePolicy, backends, stderr)
	}
	if *stdProxy != "" {
		return serveStdProxy(ctx, *stdProxy, *direct, stderr)
	}
	if *instant != "" {
		return serveInstant(ctx, *instant, *model, *tokenGap, stderr)
	}
	if slow.Stalled > 0 {
		if len(frontends) != 1 {
			return errors.New("bench: --slow-clients needs one --frontend (the router)")
		}
		slow.Router, slow.Admin, slow.Model, slow.Progress = frontends[0], *adminURL, *model, stderr
		res, err := bench.RunSlowClients(ctx, slow)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if *jsonOut {
			return writeIndentedJSON(stdout, res)
		}
		return bench.WriteSlowTable(stdout, res)
	}
	if *overhead {
		cfg := bench.OverheadConfig{Direct: *direct, Model: *model, BodyBytes: *ohBody, Round: *ohRound, Rounds: *ohRounds,
			Streams: *ohStreams, StreamTokens: *ohTokens, Progress: stderr}
		if cfg.Model == "" {
			cfg.Model = "bench"
		}
		for _, c := range ohConc {
			n, err := strconv.Atoi(c)
			if err != nil || n <= 0 {
				return fmt.Errorf("bench: --overhead-concurrency %q: want positive integers", c)
			}
			cfg.Concurrency = append(cfg.Concurrency, n)
		}
		pid := map[string]int{}
		for _, p := range pids {
			name, v, _ := strings.Cut(p, "=")
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return fmt.Errorf("bench: --pid %q: want name=PID", p)
			}
			pid[name] = n
		}
		for _, g := range groups {
			cfg.Targets = append(cfg.Targets, bench.Target{Name: g.name, URL: g.frontends[0], PID: pid[g.name]})
		}
		res, err := bench.RunOverhead(ctx, cfg)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if *jsonOut {
			return writeIndentedJSON(stdout, res)
		}
		return bench.WriteOverheadTable(stdout, res, *ohBase)
	}
	var all []benchGroup
	if len(frontends) > 0 {
		all = append(all, benchGroup{name: *name, frontends: frontends})
	}
	all = append(all, groups...)
	if len(all) == 0 {
		return errors.New("bench: need --frontend URL or --group name=URL,URL")
	}
	if conv.Conversations > 0 {
		return runConvBench(ctx, all, conv, *model, *commit, resets, *requestIDs, *jsonOut, stdout, stderr)
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
		if err := writeIndentedJSON(stdout, struct {
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

// runConvBench runs the multi-turn chat workload against each group in
// turn and prints a table (or JSON).
func runConvBench(ctx context.Context, groups []benchGroup, conv bench.ConvConfig, model, commit string, resets []string, requestIDs, jsonOut bool, stdout, stderr io.Writer) error {
	if conv.Turns <= 0 || conv.Clients <= 0 {
		return fmt.Errorf("bench: --turns and --clients must be positive, got %d and %d", conv.Turns, conv.Clients)
	}
	if conv.AnswerSigma < 0 || math.IsNaN(conv.AnswerSigma) || math.IsInf(conv.AnswerSigma, 0) {
		return fmt.Errorf("bench: --answer-sigma must be a finite number ≥ 0, got %v", conv.AnswerSigma)
	}
	conv.HTTPClient = bench.DefaultHTTPClient(conv.Clients)
	conv.Progress = stderr
	if model == "" {
		m, err := firstModel(ctx, conv.HTTPClient, groups[0].frontends[0])
		if err != nil {
			return fmt.Errorf("bench: no --model given and %w", err)
		}
		model = m
	}
	conv.Model = model
	var results []bench.ConvResult
	var runErr error
	for _, g := range groups {
		fmt.Fprintf(stderr, "bench %s: %d conversations x %d turns, %d clients, think %v, answers %d tokens (σ %v, ignore_eos %v), model %s, front ends %s\n",
			g.name, conv.Conversations, conv.Turns, conv.Clients, conv.Think, conv.AnswerTokens, conv.AnswerSigma, conv.IgnoreEOS, model, strings.Join(g.frontends, ","))
		for _, u := range resets {
			if err := resetCache(ctx, conv.HTTPClient, u); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		c := conv
		c.Frontends = g.frontends
		if requestIDs {
			c.RequestIDs = g.name
		}
		res, err := bench.RunConversations(ctx, g.name, c)
		res.Commit = commit
		results = append(results, res)
		if err != nil {
			runErr = err
			break
		}
	}
	if jsonOut {
		if err := writeIndentedJSON(stdout, struct {
			Frontends []bench.ConvResult `json:"frontends"`
		}{results}); err != nil {
			return fmt.Errorf("bench: write json: %w", err)
		}
	} else if err := bench.WriteConvTable(stdout, results); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return runErr
}

// convTableFrom prints one table of the results in earlier JSON outputs.
func convTableFrom(paths []string, stdout io.Writer) error {
	var all []bench.ConvResult
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		var r struct {
			Frontends []bench.ConvResult `json:"frontends"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("bench: %s: %w", p, err)
		}
		all = append(all, r.Frontends...)
	}
	return bench.WriteConvTable(stdout, all)
}

// serveInstant serves bench.InstantReplica on addr until ctx ends.
func serveInstant(ctx context.Context, addr, model string, gap time.Duration, stderr io.Writer) error {
	if model == "" {
		model = "bench"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	srv := &http.Server{Handler: bench.InstantReplica(model, gap), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "instant replica serving model %s on http://%s\n", model, l.Addr())
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// serveStdProxy serves httputil.ReverseProxy to target on addr until ctx
// ends.
func serveStdProxy(ctx context.Context, addr, target string, stderr io.Writer) error {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("bench: --reverse-proxy needs --direct URL, got %q", target)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		FlushInterval: -1,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true},
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "standard reverse proxy to %s on http://%s\n", target, l.Addr())
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// serveBalancer serves lb's policy over backends on addr until ctx ends.
func serveBalancer(ctx context.Context, addr, policy string, backends []string, stderr io.Writer) error {
	h, err := lb.New(policy, backends, nil)
	if err != nil {
		return fmt.Errorf("bench: --balance: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "%s balancer over %s on http://%s\n", policy, strings.Join(backends, ","), l.Addr())
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// resetCache empties a replica's prefix cache.
func resetCache(ctx context.Context, client *http.Client, base string) error {
	url := strings.TrimRight(base, "/") + "/reset_prefix_cache"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("reset %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("reset %s: %w", url, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("reset %s: HTTP %d", url, resp.StatusCode)
	}
	return nil
}

// serveTCPRelay relays every connection on addr to target's host with a
// plain read/write loop in each direction (no splice, no HTTP), until ctx
// ends.
func serveTCPRelay(ctx context.Context, addr, target string, stderr io.Writer) error {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("bench: --tcp-relay needs --direct URL, got %q", target)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	fmt.Fprintf(stderr, "TCP relay to %s on %s\n", u.Host, l.Addr())
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	pump := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
	}
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("bench: %w", err)
		}
		go func() {
			up, err := net.Dial("tcp", u.Host)
			if err != nil {
				_ = c.Close()
				return
			}
			go pump(up, c)
			pump(c, up)
		}()
	}
}

// writeIndentedJSON writes v as indented JSON, the form of every
// `kvmesh bench --json` report.
func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
