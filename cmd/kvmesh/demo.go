package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/lab/bench"
	"github.com/kvmesh/kvmesh/internal/lab/lb"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/internal/lab/trace"
	"github.com/kvmesh/kvmesh/mesh"
)

// demoConfig is the parsed command line of `kvmesh demo`.
type demoConfig struct {
	replicas, routers int
	route             *policyFlags // routing tunables passed on to the routers
	tracePath         string
	minutes           float64
	speedup           float64
	timeScale         float64
	cacheFraction     float64
	maxOutputTokens   int
	concurrency       int
	haproxy           string
	only              map[string]bool
	report            string
	asJSON            bool
	verbose           bool
}

func parseDemoFlags(args []string, stderr io.Writer) (demoConfig, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvmesh demo [flags]

Starts, on 127.0.0.1, a mesh of kvmesh routers in front of simulated vLLM-like
replicas, plus a round-robin and a least-connections load balancer (and
HAProxy, where it is installed) over the same replicas; replays a slice of
the Mooncake conversation trace through each front end in turn, with every
replica's prefix cache emptied in between; and prints what the replicas
reported: prefix-cache hit ratio, time to first token, errors.

flags:
`)
		fs.PrintDefaults()
	}
	var c demoConfig
	fs.IntVar(&c.replicas, "replicas", 8, "simulated replicas")
	fs.IntVar(&c.routers, "routers", 3, "kvmesh routers (requests go to them in turn, as DNS round-robin would)")
	fs.StringVar(&c.tracePath, "trace", "", "Mooncake JSONL trace (default: the embedded 10-minute slice of the conversation trace)")
	fs.Float64Var(&c.minutes, "minutes", 10, "replay the trace's first this many minutes")
	fs.Float64Var(&c.speedup, "speedup", 20, "replay the trace this many times faster than recorded")
	fs.Float64Var(&c.timeScale, "time-scale", 6, "replicas run this many times faster than the modelled engine (so load matches the speed-up)")
	fs.Float64Var(&c.cacheFraction, "cache-fraction", 0.25, "total replica KV cache as a share of the replayed prompts' distinct blocks")
	fs.IntVar(&c.maxOutputTokens, "max-output-tokens", 0, "cap on each request's output tokens (0: the trace's own lengths, which keep replicas busy decoding as real ones are)")
	fs.IntVar(&c.concurrency, "concurrency", 512, "most requests in flight per front end")
	fs.StringVar(&c.haproxy, "haproxy", "auto", "also measure HAProxy (leastconn) when its binary is on PATH: auto, on or off")
	only := fs.String("frontends", "", "comma-separated front ends to measure (default all): kvmesh, round-robin, least-connections, haproxy-leastconn")
	fs.StringVar(&c.report, "report", "", "also write an HTML report with TTFT distributions to this file")
	fs.BoolVar(&c.asJSON, "json", false, `print {"frontends":[...]} as one JSON object instead of a table`)
	fs.BoolVar(&c.verbose, "verbose", false, "log the routers and replicas at info level")
	c.route = bindPolicyFlags(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("demo: unexpected arguments %q", fs.Args())
	}
	if *only != "" {
		c.only = map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			c.only[strings.TrimSpace(n)] = true
		}
	}
	switch {
	case c.replicas < 1 || c.routers < 1:
		return c, errors.New("demo: --replicas and --routers must be at least 1")
	case c.minutes <= 0 || c.speedup <= 0 || c.timeScale <= 0:
		return c, errors.New("demo: --minutes, --speedup and --time-scale must be positive")
	case c.cacheFraction <= 0:
		return c, errors.New("demo: --cache-fraction must be positive")
	case c.haproxy != "auto" && c.haproxy != "on" && c.haproxy != "off":
		return c, fmt.Errorf("demo: --haproxy %q is not auto, on or off", c.haproxy)
	}
	return c, nil
}

const demoModel = "kvmesh-sim"

// runDemo is `kvmesh demo`: the main job on an embedded default.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseDemoFlags(args, stderr)
	if err != nil {
		return err
	}
	reqs, err := demoTrace(cfg)
	if err != nil {
		return err
	}
	level := hclog.Error
	if cfg.verbose {
		level = hclog.Info
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "demo", Level: level, Output: stderr})
	say := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }

	var st stack
	defer st.stop()

	kvBlocks := demoKVBlocks(reqs, cfg)
	say("kvmesh demo: %d requests (first %.0f min of the trace at %gx), %d replicas of %d KV blocks, %d routers",
		len(reqs), cfg.minutes, cfg.speedup, cfg.replicas, kvBlocks, cfg.routers)
	replicas, err := st.startReplicas(cfg, kvBlocks, log)
	if err != nil {
		return err
	}
	routers, err := st.startRouters(ctx, cfg, replicas, level, stderr)
	if err != nil {
		return err
	}
	frontends := []frontend{{name: "kvmesh", urls: routers}}
	for _, policy := range []string{lb.RoundRobin, lb.LeastConnections} {
		u, err := st.startBalancer(policy, replicas, log)
		if err != nil {
			return err
		}
		frontends = append(frontends, frontend{name: policy, urls: []string{u}})
	}
	if cfg.haproxy != "off" {
		u, err := st.startHAProxy(replicas)
		switch {
		case err == nil:
			frontends = append(frontends, frontend{name: "haproxy-leastconn", urls: []string{u}})
		case cfg.haproxy == "on":
			return err
		default:
			say("haproxy: %v; skipped", err)
		}
	}
	if err := waitReady(ctx, routers, 15*time.Second); err != nil {
		return err
	}

	client := bench.DefaultHTTPClient(cfg.concurrency)
	defer client.CloseIdleConnections()
	var results []bench.Result
	var stats []routerStats
	for _, fe := range frontends {
		if cfg.only != nil && !cfg.only[fe.name] {
			continue
		}
		if err := resetReplicas(ctx, client, replicas); err != nil {
			return err
		}
		say("replaying through %s (%s)", fe.name, strings.Join(fe.urls, ", "))
		res, err := bench.Run(ctx, fe.name, bench.Config{
			Frontends: fe.urls, Requests: reqs, Model: demoModel, Speedup: cfg.speedup,
			Concurrency: cfg.concurrency, Progress: stderr, HTTPClient: client,
		})
		if err != nil {
			return fmt.Errorf("demo: %s: %w", fe.name, err)
		}
		results = append(results, res)
		if fe.name == "kvmesh" {
			stats = st.routerStats(res.WallSeconds)
		}
	}

	if cfg.report != "" {
		if err := writeReport(cfg.report, results); err != nil {
			return err
		}
		say("report: %s", cfg.report)
	}
	if cfg.asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"frontends": results})
	}
	fmt.Fprintf(stdout, "\nkvmesh demo: %d requests of the Mooncake conversation trace at %gx through each front end\n"+
		"(%d simulated replicas running %gx faster than real time; TTFT in wall-clock ms)\n\n",
		len(reqs), cfg.speedup, cfg.replicas, cfg.timeScale)
	if err := bench.WriteTable(stdout, results); err != nil {
		return err
	}
	for _, rs := range stats {
		fmt.Fprintf(stdout, "%s decisions: %s\n", rs.name, rs.decisions)
	}
	return nil
}

// demoTrace loads the requests to replay, their outputs capped.
func demoTrace(cfg demoConfig) ([]trace.Request, error) {
	var all []trace.Request
	if cfg.tracePath == "" {
		all = trace.EmbeddedConversationSlice()
	} else {
		var err error
		if all, err = trace.LoadMooncake(cfg.tracePath); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
	}
	limit := time.Duration(cfg.minutes * float64(time.Minute))
	var reqs []trace.Request
	for _, r := range all {
		if r.Arrival >= limit {
			break
		}
		if cfg.maxOutputTokens > 0 {
			r.OutputTokens = min(r.OutputTokens, cfg.maxOutputTokens)
		}
		reqs = append(reqs, r)
	}
	if len(reqs) == 0 {
		return nil, errors.New("demo: the trace has no requests in the chosen window")
	}
	return reqs, nil
}

// demoKVBlocks sizes each replica's KV cache (in the engine's 16-token
// blocks) so that all replicas together hold cacheFraction of the
// distinct prompt blocks replayed, as the simulator sizes its caches.
func demoKVBlocks(reqs []trace.Request, cfg demoConfig) int {
	distinct := map[int64]struct{}{}
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			distinct[id] = struct{}{}
		}
	}
	tokens := cfg.cacheFraction * float64(len(distinct)) * trace.MooncakeBlockTokens
	return max(1024, int(tokens/16/float64(cfg.replicas)))
}

type frontend struct {
	name string
	urls []string
}

// stack owns everything the demo starts and stops it all, whatever
// happens.
type stack struct {
	mu      sync.Mutex
	stops   []func()
	routers []*router
}

// routerStats is what one router decided, from its own metrics.
type routerStats struct {
	name, decisions string
}

func (s *stack) routerStats(wall float64) []routerStats {
	var out []routerStats
	for _, r := range s.routers {
		mfs, err := r.reg.Gather()
		if err != nil {
			continue
		}
		var parts []string
		gossipOut := 0.0
		for _, mf := range mfs {
			switch mf.GetName() {
			case "kvmesh_route_decisions_total":
				for _, m := range mf.GetMetric() {
					if v := m.GetCounter().GetValue(); v > 0 {
						parts = append(parts, fmt.Sprintf("%s=%.0f", m.GetLabel()[0].GetValue(), v))
					}
				}
			case "kvmesh_gossip_bytes_total":
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == "out" {
						gossipOut += m.GetCounter().GetValue()
					}
				}
			}
		}
		if wall > 0 {
			parts = append(parts, fmt.Sprintf("(gossip out %.1f KB/s)", gossipOut/wall/1000))
		}
		out = append(out, routerStats{name: r.name, decisions: strings.Join(parts, " ")})
	}
	return out
}

func (s *stack) onStop(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stops = append(s.stops, f)
}

func (s *stack) stop() {
	s.mu.Lock()
	stops := s.stops
	s.stops = nil
	s.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// serve runs h on a fresh 127.0.0.1 port until the stack stops.
func (s *stack) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("demo: listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	s.onStop(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		<-done
	})
	return "http://" + ln.Addr().String(), nil
}

func (s *stack) startReplicas(cfg demoConfig, kvBlocks int, log hclog.Logger) ([]string, error) {
	var urls []string
	for i := 0; i < cfg.replicas; i++ {
		r, err := replicasim.New(replicasim.Config{
			Model: demoModel, KVBlocks: kvBlocks, TimeScale: cfg.timeScale, MaxNumSeqs: 256,
		}, log.Named(fmt.Sprintf("replica-%d", i)), prometheus.NewRegistry())
		if err != nil {
			return nil, fmt.Errorf("demo: replica %d: %w", i, err)
		}
		u, err := s.serve(r.Handler())
		s.onStop(func() { _ = r.Close() })
		if err != nil {
			return nil, err
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// startRouters starts the mesh: router i declares replicas j with
// j mod routers == i, and every router after the first joins the first.
// They share a gossip key made for the run, as a real mesh's routers do.
func (s *stack) startRouters(ctx context.Context, cfg demoConfig, replicas []string, level hclog.Level, logOut io.Writer) ([]string, error) {
	keyFile, err := tempGossipKey()
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	s.onStop(func() { _ = os.Remove(keyFile) })
	var urls []string
	var seed string
	for i := 0; i < cfg.routers; i++ {
		args := []string{"--name", fmt.Sprintf("router-%d", i), "--region", "local",
			"--listen", "127.0.0.1:0", "--admin-listen", "", "--gossip-bind", "127.0.0.1:0", "--gossip-profile", "test",
			"--health-interval", "500ms", "--log-level", strings.ToLower(level.String()), "--gossip-key-file", keyFile}
		if seed != "" {
			args = append(args, "--join", seed)
		}
		for j := i; j < len(replicas); j += cfg.routers {
			args = append(args, "--replica", replicas[j])
		}
		if cfg.route != nil {
			args = append(args, cfg.route.args()...)
		}
		rc, err := parseRouterFlags(args, func(string) (string, bool) { return "", false }, io.Discard)
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		rc.logOutput = logOut
		rc.registerProcessGo = false
		rc.timing = demoTiming()
		r, err := startRouter(ctx, rc)
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		s.onStop(func() { _ = r.shutdown() })
		s.routers = append(s.routers, r)
		if seed == "" {
			seed = r.mesh.GossipAddr()
		}
		urls = append(urls, r.api)
	}
	return urls, nil
}

// demoTiming gossips state as often as the test profile, because the
// replicas run faster than real time and a LAN interval would be several
// engine-seconds stale; but it detects failures as slowly as a LAN does,
// because eight replicas, three routers and the load generator share the
// demo machine's cores and a starved router must not be declared dead.
func demoTiming() mesh.Timing {
	t := mesh.LANTiming()
	fast := mesh.TestTiming()
	t.GossipInterval, t.StateInterval = fast.GossipInterval, fast.StateInterval
	t.PushPullInterval = 5 * time.Second
	t.ReconnectInterval = time.Second
	return t
}

func (s *stack) startBalancer(policy string, replicas []string, log hclog.Logger) (string, error) {
	h, err := lb.New(policy, replicas, log.Named(policy))
	if err != nil {
		return "", fmt.Errorf("demo: %s: %w", policy, err)
	}
	return s.serve(h)
}

// startHAProxy runs the system's haproxy (leastconn, as HAProxy's own
// guidance for long requests) over the replicas as a child process.
func (s *stack) startHAProxy(replicas []string) (string, error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return "", errors.New("not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close() // haproxy binds it; the race with another process is harmless on a demo box
	dir, err := os.MkdirTemp("", "kvmesh-demo-haproxy")
	if err != nil {
		return "", err
	}
	s.onStop(func() { os.RemoveAll(dir) })
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 10m\n  timeout server 10m\n"+
		"frontend fe\n  bind %s\n  default_backend replicas\nbackend replicas\n  balance leastconn\n", addr)
	for i, r := range replicas {
		fmt.Fprintf(&b, "  server r%d %s\n", i, strings.TrimPrefix(r, "http://"))
	}
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(bin, "-db", "-f", cfgPath)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.onStop(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	u := "http://" + addr
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return u, nil
		}
		select {
		case <-exited:
			return "", errors.New("exited at start (see haproxy -c)")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", errors.New("did not start listening")
}

// waitReady waits until every router is ready and serves the model.
func waitReady(ctx context.Context, routers []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, u := range routers {
		for {
			if ok := routerReady(ctx, u); ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("demo: router %s not ready after %v", u, timeout)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func routerReady(ctx context.Context, u string) bool {
	for _, path := range []string{"/readyz", "/v1/models"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || (path == "/v1/models" && !bytes.Contains(body, []byte(demoModel))) {
			return false
		}
	}
	return true
}

// resetReplicas empties every replica's prefix cache (vLLM's
// /reset_prefix_cache) so each front end starts cold.
func resetReplicas(ctx context.Context, client *http.Client, replicas []string) error {
	for _, u := range replicas {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/reset_prefix_cache", nil)
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("demo: reset %s: %w", u, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("demo: reset %s: status %d", u, resp.StatusCode)
		}
	}
	return nil
}
