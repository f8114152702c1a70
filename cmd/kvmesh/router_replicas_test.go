package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/discover/dnstest"
	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

func TestRouterReplicaFlags(t *testing.T) {
	base := []string{"--name", "r1"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c routerConfig)
	}{
		{name: "defaults", args: base, check: func(t *testing.T, c routerConfig) {
			s := c.sources
			if s.engine != engine.Auto || s.dns != "" || s.file != "" || s.dnsInterval != 5*time.Second || s.dnsScheme != "http" || !s.hupSignals || s.loadInterval != time.Second {
				t.Errorf("%+v", s)
			}
		}},
		{name: "all set", args: append([]string{"--engine", "sglang", "--replica-dns", "_http._tcp.vllm.ns.svc.cluster.local",
			"--replica-dns-server", "10.0.0.10:53", "--replica-dns-interval", "2s", "--replica-file", "/etc/kvmesh/replicas"}, base...),
			check: func(t *testing.T, c routerConfig) {
				s := c.sources
				if s.engine != engine.SGLang || s.dns != "_http._tcp.vllm.ns.svc.cluster.local" || s.dnsServer != "10.0.0.10:53" ||
					s.dnsInterval != 2*time.Second || s.file != "/etc/kvmesh/replicas" {
					t.Errorf("%+v", s)
				}
			}},
		{name: "environment", args: base, env: map[string]string{"KVMESH_REPLICA_DNS": "vllm:8000", "KVMESH_ENGINE": "tgi"},
			check: func(t *testing.T, c routerConfig) {
				if c.sources.dns != "vllm:8000" || c.sources.engine != engine.TGI {
					t.Errorf("%+v", c.sources)
				}
			}},
		{name: "bad engine", args: append([]string{"--engine", "ollama"}, base...), wantErr: "--engine"},
		{name: "dns without port", args: append([]string{"--replica-dns", "vllm.ns"}, base...), wantErr: "--replica-dns"},
		{name: "bad interval", args: append([]string{"--replica-dns-interval", "0s"}, base...), wantErr: "--replica-dns-interval"},
		{name: "bad load interval", args: append([]string{"--engine-load-interval", "-1s"}, base...), wantErr: "--engine-load-interval"},
		{name: "bad scheme", args: append([]string{"--replica-dns", "v:1", "--replica-dns-scheme", "grpc"}, base...), wantErr: "scheme"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseRouterFlags(tc.args, getenv, &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// countingSim is a replica-sim behind an httptest server that names
// itself in a response header and counts the generations it is sent.
type countingSim struct {
	name string
	sim  *replicasim.Server
	srv  *httptest.Server
	hits atomic.Int64
}

func startCountingSim(t *testing.T, name string, cfg replicasim.Config) *countingSim {
	t.Helper()
	sim, err := replicasim.New(cfg, hclog.NewNullLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c := &countingSim{name: name, sim: sim}
	h := sim.Handler()
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			c.hits.Add(1)
			w.Header().Set("X-Test-Replica", name)
		}
		h.ServeHTTP(w, r)
	}))
	return c
}

func (c *countingSim) close() {
	_ = c.sim.Close()
	c.srv.Close()
}

func (c *countingSim) port(t *testing.T) uint16 {
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(c.srv.URL, "http://"))
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(n)
}

// hasCandidate reports whether r would route model to replica url.
func hasCandidate(r *router, model, url string) bool {
	return slices.ContainsFunc(r.mesh.Candidates(model, nil), func(c route.Candidate) bool { return c.ID() == url })
}

// streamBody is a streaming chat request of maxTokens answer tokens.
func streamBody(prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": simModel, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	return string(b)
}

// TestEndToEndDNSDiscovery is issue 10's acceptance: two routers on
// 127.0.0.1 discover replica-sims only through SRV records served by an
// in-process DNS server. A replica started after the routers and added to
// DNS receives traffic once a resolve and a health check have run; one
// removed from DNS stops receiving new requests, while the stream it was
// serving runs to its end.
func TestEndToEndDNSDiscovery(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dns, err := dnstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer dns.Close()
	const service = "_openai._tcp.replicas.kvmesh.test"
	fast := replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 16}
	r1 := startCountingSim(t, "r1", fast)
	defer r1.close()
	dns.SetIPs("r1.kvmesh.test", "127.0.0.1")
	dns.SetSRV(service, dnstest.Target{Host: "r1.kvmesh.test", Port: r1.port(t)})

	const resolveEvery, checkEvery = 200 * time.Millisecond, 50 * time.Millisecond
	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Info, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: checkEvery, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		sources: replicaSources{dns: service, dnsServer: dns.Addr, dnsInterval: resolveEvery},
	}
	a, b := startPair(ctx, t, base, nil)
	routers := []*router{a, b}
	defer func() {
		for _, r := range routers {
			if err := r.shutdown(); err != nil {
				t.Errorf("shutdown %s: %v", r.name, err)
			}
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	for _, r := range routers {
		eventually(t, "both routers to admit r1 from DNS", func() bool { return hasCandidate(r, simModel, r1.srv.URL) })
	}

	// send posts one request and reads it to the end.
	n := 0
	send := func(r *router) string {
		t.Helper()
		n++
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json",
			strings.NewReader(streamBody(fmt.Sprintf("request %d: %s", n, strings.Repeat("tell me more about it, ", 200)), 4)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d, %v", resp.StatusCode, err)
		}
		return resp.Header.Get("X-Test-Replica")
	}

	// r2 starts after the routers, slow, so that its streams last.
	r2 := startCountingSim(t, "r2", replicasim.Config{DecodeMsPerToken: 20, DefaultMaxTokens: 4})
	defer r2.close()
	dns.SetIPs("r2.kvmesh.test", "127.0.0.1")
	added := time.Now()
	dns.SetSRV(service, dnstest.Target{Host: "r1.kvmesh.test", Port: r1.port(t)}, dnstest.Target{Host: "r2.kvmesh.test", Port: r2.port(t)})
	for _, r := range routers {
		eventually(t, "both routers to route to r2", func() bool { return hasCandidate(r, simModel, r2.srv.URL) })
	}
	t.Logf("r2 routable at both routers %v after its SRV record appeared (resolve interval %v + health interval %v)",
		time.Since(added).Round(time.Millisecond), resolveEvery, checkEvery)
	for i := 0; r2.hits.Load() == 0; i++ {
		if i == 40 {
			t.Fatal("r2 got none of 40 requests")
		}
		send(routers[i%2])
	}

	// Open a long stream on r2 (300 tokens at 20 ms each), then remove r2
	// from DNS while it runs.
	var stream *http.Response
	var lines *bufio.Reader
	for i := 0; stream == nil; i++ {
		if i == 40 {
			t.Fatal("no stream landed on r2 in 40 tries")
		}
		resp, err := client.Post(routers[i%2].api+"/v1/chat/completions", "application/json",
			strings.NewReader(streamBody(fmt.Sprintf("stream %d: %s", i, strings.Repeat("a long story about a router, ", 200)), 300)))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("X-Test-Replica") != "r2" {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			continue
		}
		stream, lines = resp, bufio.NewReader(resp.Body)
	}
	defer stream.Body.Close()
	if _, err := lines.ReadString('\n'); err != nil {
		t.Fatalf("first line of the stream: %v", err)
	}
	removed := time.Now()
	dns.SetSRV(service, dnstest.Target{Host: "r1.kvmesh.test", Port: r1.port(t)})
	for _, r := range routers {
		eventually(t, "both routers to stop routing to r2", func() bool { return !hasCandidate(r, simModel, r2.srv.URL) })
	}
	t.Logf("r2 withdrawn at both routers %v after its SRV record went", time.Since(removed).Round(time.Millisecond))
	if running := simMetric(t, client, r2.srv.URL, "vllm:num_requests_running"); running < 1 {
		t.Fatal("the stream on r2 ended before r2 was withdrawn: nothing is proven about in-flight streams")
	}
	before := r2.hits.Load()
	for i := range 20 {
		if got := send(routers[i%2]); got != "r1" {
			t.Fatalf("request %d after r2's removal served by %q", i, got)
		}
	}
	if got := r2.hits.Load(); got != before {
		t.Errorf("r2 got %d new requests after its removal", got-before)
	}
	// The stream that was running on r2 completes.
	rest, err := io.ReadAll(lines)
	if err != nil {
		t.Fatalf("stream on r2 cut: %v", err)
	}
	if !strings.Contains(string(rest), "data: [DONE]") || strings.Contains(string(rest), `"error"`) {
		t.Errorf("stream on r2 did not complete:\n%s", rest)
	}
	if chunks := strings.Count(string(rest), "data: "); chunks < 250 {
		t.Errorf("stream on r2 carried %d chunks after its first line, want most of 300 tokens", chunks)
	}
}

// TestRouterReplicaFile: a router follows its replica file as it changes.
func TestRouterReplicaFile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast := replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 4}
	r1, r2 := startCountingSim(t, "r1", fast), startCountingSim(t, "r2", fast)
	defer r1.close()
	defer r2.close()
	file := filepath.Join(t.TempDir(), "replicas")
	write := func(s string, mod time.Time) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	write("# replicas\n"+r1.srv.URL+"/\n", t0)
	logs := &lockedWriter{}
	cfg := routerConfig{
		name: "a", region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Info, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		sources: replicaSources{file: file, filePoll: 20 * time.Millisecond},
	}
	r, err := startRouter(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.shutdown(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	eventually(t, "r1 from the file", func() bool { return hasCandidate(r, simModel, r1.srv.URL) })
	write(r2.srv.URL+"\n", t0.Add(time.Minute))
	eventually(t, "r2 replacing r1", func() bool {
		return hasCandidate(r, simModel, r2.srv.URL) && !hasCandidate(r, simModel, r1.srv.URL)
	})
	if !slices.Equal(r.health.Replicas(), []string{r2.srv.URL}) {
		t.Errorf("checked replicas %v", r.health.Replicas())
	}
}

// TestEngineLoadKnownReachesThePeers: whether an engine publishes its
// running and waiting counts travels from the owner's health check to
// every router's candidates (route.Candidate.HasLoad): a replica-sim
// (vLLM's gauges) has them, an OpenAI-compatible server without them
// does not, and with it in the view the cold burst rule stays off
// (route's burst).
func TestEngineLoadKnownReachesThePeers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sim := startCountingSim(t, "sim", replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 16})
	defer sim.close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q}]}`, simModel)
			return
		}
		http.NotFound(w, r)
	}))
	defer plain.Close()
	logs := &lockedWriter{}
	base := pairConfig(logs, 50*time.Millisecond)
	base.sources = replicaSources{loadInterval: 50 * time.Millisecond}
	a, b := startPair(ctx, t, base, []string{sim.srv.URL, plain.URL})
	defer stopPair(t, logs, a, b)
	for _, r := range []*router{a, b} {
		eventually(t, r.name+" to know whose counts are known", func() bool {
			cands := r.mesh.Candidates(simModel, nil)
			known := map[string]bool{}
			for _, c := range cands {
				known[c.ID()] = c.HasLoad
			}
			return len(cands) == 2 && known[sim.srv.URL] && !known[plain.URL]
		})
	}
}

// pairConfig is what the two-router tests start from: region local,
// loopback listeners, test gossip timing and key, health checks every
// health, logs to logs.
func pairConfig(logs io.Writer, health time.Duration) routerConfig {
	return routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: health, contract: summary.DefaultContract(), gossipKey: testGossipKey,
	}
}

// stopPair shuts the routers down, and prints their logs if the test
// failed: deferred by the tests that start a pair.
func stopPair(t *testing.T, logs *lockedWriter, routers ...*router) {
	for _, r := range routers {
		if err := r.shutdown(); err != nil {
			t.Errorf("shutdown %s: %v", r.name, err)
		}
	}
	if t.Failed() {
		t.Log(logs.String())
	}
}

// chatOnce posts a one-message chat completion of text for model to the
// router at addr and reads the answer whole.
func chatOnce(client *http.Client, addr, model, text string) error {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, text)
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// chatBlocks: the block hashes of text sent as chatOnce sends it, under
// contract c, and their probes.
func chatBlocks(t *testing.T, c summary.Contract, model, text string) ([]uint64, []summary.Probe) {
	t.Helper()
	pr, err := prompt.RenderChat([]byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, text)))
	if err != nil {
		t.Fatal(err)
	}
	hashes := c.AppendHashes(nil, c.Root(model, ""), pr.Text)
	return hashes, summary.MakeProbes(nil, hashes)
}

// startPair starts router "a" from base with the given replicas and
// router "b" from base joining it; the caller shuts both down.
func startPair(ctx context.Context, t *testing.T, base routerConfig, replicas []string) (a, b *router) {
	t.Helper()
	ca := base
	ca.name, ca.replicas = "a", replicas
	a, err := startRouter(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := base
	cb.name, cb.join = "b", []string{a.mesh.GossipAddr()}
	if b, err = startRouter(ctx, cb); err != nil {
		_ = a.shutdown()
		t.Fatal(err)
	}
	return a, b
}
