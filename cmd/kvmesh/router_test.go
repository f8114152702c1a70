package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/metricsum"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/summary"
	"go.uber.org/goleak"
)

func TestRouterFlags(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("MDEyMzQ1Njc4OWFiY2RlZg==\n"), 0o600) // base64 of 16 bytes
	base := []string{"--name", "r1", "--replica", "http://127.0.0.1:8000/"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c routerConfig)
	}{
		{name: "defaults", args: base, check: func(t *testing.T, c routerConfig) {
			if c.listen != "127.0.0.1:8080" || c.logLevel != hclog.Info || c.maxBodyBytes != proxy.DefaultMaxBodyBytes ||
				c.timing != mesh.LANTiming() || len(c.replicas) != 1 || c.replicas[0] != "http://127.0.0.1:8000" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "environment fills unset flags", args: base,
			env: map[string]string{"KVMESH_REGION": "eu", "KVMESH_JOIN": "a:1, b:2", "KVMESH_LOG_LEVEL": "debug", "KVMESH_GOSSIP_PROFILE": "test", "KVMESH_LOG_JSON": "true", "KVMESH_GOSSIP_KEY_FILE": keyFile},
			check: func(t *testing.T, c routerConfig) {
				if c.region != "eu" || strings.Join(c.join, ",") != "a:1,b:2" || c.logLevel != hclog.Debug || c.timing != mesh.TestTiming() || !c.logJSON || string(c.gossipKey) != "0123456789abcdef" {
					t.Errorf("%+v", c)
				}
			}},
		{name: "command line wins", args: append([]string{"--region", "us", "--join", "c:3", "--insecure-mesh"}, base...),
			env: map[string]string{"KVMESH_REGION": "eu", "KVMESH_JOIN": "a:1"},
			check: func(t *testing.T, c routerConfig) {
				if c.region != "us" || strings.Join(c.join, ",") != "c:3" {
					t.Errorf("%+v", c)
				}
			}},
		{name: "junk log level", args: append([]string{"--log-level", "loud"}, base...), wantErr: "invalid --log-level"},
		{name: "junk env value", args: base, env: map[string]string{"KVMESH_MAX_BODY_BYTES": "lots"}, wantErr: "KVMESH_MAX_BODY_BYTES"},
		{name: "no name", args: []string{"--replica", "http://x:1"}, wantErr: "--name"},
		{name: "bad replica", args: []string{"--name", "r", "--replica", "x:1"}, wantErr: "not an http(s) URL"},
		{name: "bad profile", args: append([]string{"--gossip-profile", "moon"}, base...), wantErr: "gossip-profile"},
		{name: "bad load factor", args: append([]string{"--load-factor", "0.5"}, base...), wantErr: "load-factor"},
		{name: "load beacons off", args: append([]string{"--load-interval", "0"}, base...), check: func(t *testing.T, c routerConfig) {
			if want := mesh.LANTiming(); c.timing.LoadInterval != 0 || c.timing.StateInterval != want.StateInterval {
				t.Errorf("%+v", c.timing)
			}
		}},
		{name: "load interval over the profile's", args: append([]string{"--gossip-profile", "wan", "--load-interval", "50ms"}, base...),
			check: func(t *testing.T, c routerConfig) {
				if c.timing.LoadInterval != 50*time.Millisecond || c.timing.StateInterval != time.Second {
					t.Errorf("%+v", c.timing)
				}
			}},
		{name: "wan profile's load interval", args: append([]string{"--gossip-profile", "wan"}, base...), check: func(t *testing.T, c routerConfig) {
			if c.timing.LoadInterval != 100*time.Millisecond {
				t.Errorf("%+v", c.timing)
			}
		}},
		{name: "bad load interval", args: append([]string{"--load-interval", "10us"}, base...), wantErr: "load-interval"},
		{name: "negative load interval", args: append([]string{"--load-interval", "-1s"}, base...), wantErr: "load-interval"},
		{name: "short key", args: base, env: map[string]string{"KVMESH_GOSSIP_KEY_FILE": writeFile(t, "short")}, wantErr: "gossip key"},
		{name: "help", args: []string{"--help"}, wantErr: flag.ErrHelp.Error()},
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
	var stderr strings.Builder
	if _, err := parseRouterFlags([]string{"-h"}, func(string) (string, bool) { return "", false }, &stderr); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(stderr.String(), "KVMESH_<FLAG>") || !strings.Contains(stderr.String(), "-gossip-bind") {
		t.Errorf("help: %v\n%s", err, stderr.String())
	}
}

func writeFile(t *testing.T, s string) string {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// e2eReplica is a fake OpenAI replica that names itself in a header and
// streams a fixed answer.
func e2eReplica(name string, hits *sync.Map) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/metrics":
			fmt.Fprint(w, "# no vllm metrics\n")
		case "/v1/chat/completions":
			n, _ := hits.LoadOrStore(name, new(int))
			*n.(*int)++
			if r.Header.Get(hop.HeaderHop) != "" {
				http.Error(w, "hint header reached a replica", 500)
				return
			}
			w.Header().Set("X-Test-Replica", name)
			w.Header().Set("Content-Type", "text/event-stream")
			for _, d := range []string{"Here is a long answer, ", strings.Repeat("with many words in it ", 60), "and an end."} {
				b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": d}}}})
				fmt.Fprintf(w, "data: %s\n\n", b)
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
		default:
			http.NotFound(w, r)
		}
	}))
}

func chatRequest(msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []msg  `json:"messages"`
	}{Model: "m", Stream: true}
	for i, m := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		req.Messages = append(req.Messages, msg{role, m})
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// eventually polls cond every 20ms for up to 20s (a liveness bound, not a
// speed assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestEndToEndNextTurnFollowsCache: a conversation started at one router
// continues at the other on the replica that served it, chosen by prefix
// (gossiped summary), in at most one extra hop; shutdown leaks nothing.
func TestEndToEndNextTurnFollowsCache(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var hits sync.Map
	reps := map[string]*httptest.Server{}
	for _, n := range []string{"r1", "r2", "r3"} {
		reps[n] = e2eReplica(n, &hits)
	}
	defer func() {
		for _, s := range reps {
			s.Close()
		}
	}()
	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
	}
	ca := base
	ca.name, ca.replicas = "a", []string{reps["r1"].URL, reps["r2"].URL}
	a, err := startRouter(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := base
	cb.name, cb.replicas, cb.join = "b", []string{reps["r3"].URL}, []string{a.mesh.GossipAddr()}
	b, err := startRouter(ctx, cb)
	if err != nil {
		a.shutdown()
		t.Fatal(err)
	}
	routers := []*router{a, b}
	defer func() {
		for _, r := range routers {
			if err := r.shutdown(); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	for _, r := range routers {
		eventually(t, "both routers to see all three replicas", func() bool {
			return len(r.mesh.Candidates("m", nil)) == 3 && r.health.Ready()
		})
	}
	send := func(r *router, body string) (string, http.Header) {
		t.Helper()
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var answer strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && json.Unmarshal([]byte(d), &c) == nil && len(c.Choices) > 0 {
				answer.WriteString(c.Choices[0].Delta.Content)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		return answer.String(), resp.Header
	}
	requests := func() float64 {
		n := 0.0
		for _, r := range routers {
			// A client's request at the router it reached, a hop at
			// each router it was forwarded to.
			n += counter(t, r, "kvmesh_requests_total", "") + counter(t, r, "kvmesh_hop_requests_total", "")
		}
		return n
	}

	system := strings.Repeat("You are a helpful assistant who answers at length. ", 40)
	question := "Tell me about " + strings.Repeat("gossip protocols and Bloom filters, ", 30)
	answer, h1 := send(a, chatRequest(system+question))
	first := h1.Get("X-Test-Replica")
	t.Logf("first turn served by %s", first)
	if first == "" {
		t.Fatal("no replica header")
	}
	turn2 := chatRequest(system+question, answer, "And how do they fail? "+strings.Repeat("Explain partitions. ", 40))
	p2, err := prompt.RenderChat([]byte(turn2))
	if err != nil {
		t.Fatal(err)
	}
	c := base.contract
	probes := summary.MakeProbes(nil, c.AppendHashes(nil, c.Root("m", ""), p2.Text))
	p1, _ := prompt.RenderChat([]byte(chatRequest(system + question)))
	wantBlocks := len(c.AppendHashes(nil, 0, p1.AppendAnswer(answer))) // prompt + answer blocks
	// The next turn arrives at the router that does not own the first
	// turn's replica, so only the gossiped summary can lead it there.
	other := b
	if first == "r3" {
		other = a
	}
	eventually(t, "the other router to learn the first turn's blocks", func() bool {
		for _, cand := range other.mesh.Candidates("m", nil) {
			if cand.ID() == reps[first].URL && cand.Summary != nil && cand.Summary.Match(probes) >= wantBlocks {
				return true
			}
		}
		return false
	})
	before := requests()
	_, h2 := send(other, turn2)
	if got := h2.Get("X-Test-Replica"); got != first {
		t.Fatalf("second turn went to %s, first to %s", got, first)
	}
	if got := counter(t, other, "kvmesh_route_decisions_total", "prefix"); got != 1 {
		t.Errorf("the second router made %v prefix decisions, want 1", got)
	}
	// Router b, plus at most the owner of the replica: one extra hop.
	if hops := requests() - before; hops < 1 || hops > 2 {
		t.Errorf("second turn crossed %v routers", hops)
	}
}

// counter sums a router's counter family, over series whose reason label
// is reason (any series when reason is "").
func counter(t *testing.T, r *router, name, reason string) float64 {
	t.Helper()
	return metricsum.Counter(t, r.reg, name, metricsum.Label("reason", reason))
}

type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
