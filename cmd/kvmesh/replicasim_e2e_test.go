package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/summary"
)

// simModel is the model the simulated replicas serve (replicasim's default).
const simModel = "kvmesh-sim"

// simBlockTokens is the simulated engine's KV block size in tokens.
const simBlockTokens = 16

// simReplica is one replicasim engine behind an httptest server.
type simReplica struct {
	sim *replicasim.Server
	srv *httptest.Server
}

// close ends the engine's sequences first, so the server's Close does not
// wait on a generation.
func (r simReplica) close() {
	_ = r.sim.Close()
	r.srv.Close()
}

// chatUsage is the part of a chat completion response the test reads.
type chatUsage struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// TestEndToEndReplicaSimNextTurnHitsCache runs the mesh in front of real
// simulated engines: a conversation's first turn goes to router a, its
// second turn to the router that does not own the replica that served the
// first (b, unless a sent the first turn on to b's replica). Only the
// gossiped summary can lead that router to the right replica, which the
// engine confirms by reporting the first turn as cached tokens.
func TestEndToEndReplicaSimNextTurnHitsCache(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var reps []simReplica
	defer func() {
		for _, r := range reps {
			r.close()
		}
	}()
	for i := range 2 {
		sim, err := replicasim.New(replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 48},
			hclog.NewNullLogger(), prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		reps = append(reps, simReplica{sim: sim, srv: httptest.NewServer(sim.Handler())})
	}

	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
	}
	ca := base
	ca.name, ca.replicas = "a", []string{reps[0].srv.URL}
	a, err := startRouter(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := base
	cb.name, cb.replicas, cb.join = "b", []string{reps[1].srv.URL}, []string{a.mesh.GossipAddr()}
	b, err := startRouter(ctx, cb)
	if err != nil {
		_ = a.shutdown()
		t.Fatal(err)
	}
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
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	for _, r := range routers {
		eventually(t, "both routers to see both replicas healthy", func() bool {
			return len(r.mesh.Candidates(simModel, nil)) == 2 && r.health.Ready()
		})
	}

	send := func(r *router, body string) chatUsage {
		t.Helper()
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("router %s: status %d: %s", r.name, resp.StatusCode, b)
		}
		var u chatUsage
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatalf("router %s: %v in %s", r.name, err, b)
		}
		if len(u.Choices) == 0 || u.Usage.PromptTokensDetails == nil {
			t.Fatalf("router %s: no answer or no prompt_tokens_details: %s", r.name, b)
		}
		return u
	}
	request := func(msgs ...string) string {
		t.Helper()
		var req map[string]any
		if err := json.Unmarshal([]byte(chatRequest(msgs...)), &req); err != nil {
			t.Fatal(err)
		}
		req["model"], req["stream"] = simModel, false
		out, _ := json.Marshal(req)
		return string(out)
	}
	// queries reads both replicas' prefix-cache query counters, to tell
	// which one served a request.
	queries := func() []float64 {
		return []float64{simMetric(t, client, reps[0].srv.URL, "vllm:prefix_cache_queries_total"),
			simMetric(t, client, reps[1].srv.URL, "vllm:prefix_cache_queries_total")}
	}

	system := strings.Repeat("You are a helpful assistant who answers at length. ", 30)
	question := "Tell me about " + strings.Repeat("gossip protocols and Bloom filters, ", 20)
	turn1 := request(system + question)
	q0 := queries()
	r1 := send(a, turn1)
	q1 := queries()
	first := -1
	for i := range reps {
		if q1[i] > q0[i] {
			if first >= 0 {
				t.Fatalf("turn 1 reached both replicas (queries %v -> %v)", q0, q1)
			}
			first = i
		}
	}
	if first < 0 {
		t.Fatalf("turn 1 reached no replica (queries %v -> %v)", q0, q1)
	}
	answer := r1.Choices[0].Message.Content
	t.Logf("turn 1 served by replica %d: %d prompt tokens, %d cached", first, r1.Usage.PromptTokens, r1.Usage.PromptTokensDetails.CachedTokens)

	// The router that does not own the first replica knows its contents
	// only from gossip: wait until the summary it heard holds the first
	// turn's prompt and answer.
	other := routers[1-first]
	turn2 := request(system+question, answer, "And how do they fail? "+strings.Repeat("Explain partitions. ", 20))
	p2, err := prompt.RenderChat([]byte(turn2))
	if err != nil {
		t.Fatal(err)
	}
	p1, err := prompt.RenderChat([]byte(turn1))
	if err != nil {
		t.Fatal(err)
	}
	c := base.contract
	probes := summary.MakeProbes(nil, c.AppendHashes(nil, c.Root(simModel, ""), p2.Text))
	wantBlocks := len(c.AppendHashes(nil, 0, p1.AppendAnswer(answer)))
	eventually(t, "router "+other.name+" to learn the first turn's blocks", func() bool {
		for _, cand := range other.mesh.Candidates(simModel, nil) {
			if cand.ID() == reps[first].srv.URL && cand.Summary != nil && cand.Summary.Match(probes) >= wantBlocks {
				return true
			}
		}
		return false
	})

	hits := func() []float64 {
		return []float64{simMetric(t, client, reps[0].srv.URL, "vllm:prefix_cache_hits_total"),
			simMetric(t, client, reps[1].srv.URL, "vllm:prefix_cache_hits_total")}
	}
	h0 := hits()
	r2 := send(other, turn2)
	h1 := hits()
	cached := r2.Usage.PromptTokensDetails.CachedTokens
	t.Logf("turn 2 at router %s: %d prompt tokens, %d cached", other.name, r2.Usage.PromptTokens, cached)
	// The engine caches whole blocks, so at most one block of turn 1's
	// prompt may fall short; anything less means turn 2 went elsewhere.
	if want := r1.Usage.PromptTokens - simBlockTokens; cached < want {
		t.Errorf("turn 2 had %d cached tokens, want at least %d (turn 1's %d prompt tokens less one block): it missed turn 1's replica",
			cached, want, r1.Usage.PromptTokens)
	}
	if moved := h1[first] - h0[first]; moved != float64(cached) || cached == 0 {
		t.Errorf("replica %d's vllm:prefix_cache_hits_total moved by %v, want the %d cached tokens turn 2 reported (hits %v -> %v)",
			first, moved, cached, h0, h1)
	}
	if h1[1-first] != h0[1-first] {
		t.Errorf("the other replica's prefix cache hits moved too (%v -> %v)", h0, h1)
	}
}

// simMetric scrapes a replica's /metrics and returns the value of the
// single series of family name (the engine's families carry only a
// constant model_name label).
func simMetric(t *testing.T, client *http.Client, base, name string) float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s/metrics: status %d", base, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("%s/metrics: %q: %v", base, line, err)
		}
		return v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("%s/metrics has no %s", base, name)
	return 0
}
