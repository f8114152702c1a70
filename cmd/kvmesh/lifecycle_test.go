package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/metricsum"

	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/summary"
)

// lifecycleRouter starts one router over replicas with the stall
// detection on at window; its logs are shown when the test fails.
func lifecycleRouter(t *testing.T, ctx context.Context, window time.Duration, replicas ...string) *router {
	t.Helper()
	logs := &lockedWriter{}
	r, err := startRouter(ctx, routerConfig{
		name: "a", region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Info, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		replicas: replicas, stallWindow: window, upstreamIdleTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.shutdown(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	for _, id := range replicas {
		eventually(t, "the replicas admitted", func() bool { return hasCandidate(r, simModel, id) })
	}
	return r
}

// counterOf sums the series of counter family name on r's registry whose
// labels include label (any, when "").
func counterOf(t *testing.T, r *router, name, label string) float64 {
	t.Helper()
	return metricsum.Counter(t, r.reg, name, metricsum.AnyValue(label))
}

// chatBody is a chat request for prompt of maxTokens answer tokens.
func chatBody(prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": simModel, "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	return string(b)
}

// TestEndToEndStalledReplicaEjected is issue 24's stall acceptance on
// replica-sims: streams run on both replicas, one replica's engine
// freezes (it still answers its health checks and /metrics, its
// counters stand still); the router ejects it as stalled, its streams
// end with an error event, the other replica's complete, requests sent
// meanwhile are all answered 200 (those that reached the frozen replica
// retried), it is not re-admitted while frozen, and once the engine
// resumes it is admitted again. The test orders events; it times nothing.
func TestEndToEndStalledReplicaEjected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := replicasim.Config{DecodeMsPerToken: 5}
	a, b := startCountingSim(t, "a", cfg), startCountingSim(t, "b", cfg)
	defer a.close()
	defer b.close()
	r := lifecycleRouter(t, ctx, 500*time.Millisecond, a.srv.URL, b.srv.URL)
	client := &http.Client{Transport: &http.Transport{}, Timeout: 15 * time.Second}
	defer client.CloseIdleConnections()
	post := func(ctx context.Context, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.api+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	// A few answers of a couple of blocks each time the replicas' prefill.
	for i := range 6 {
		resp, err := post(ctx, chatBody(strings.Repeat("warm "+string(rune('a'+i)), 500), 4, false))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	// Long streams on both replicas.
	type stream struct {
		replica string
		rd      *bufio.Reader
		body    io.Closer
	}
	var streams []stream
	for i := 0; i < 8 && (len(streams) < 2 || !slices.ContainsFunc(streams, func(s stream) bool { return s.replica != streams[0].replica })); i++ {
		resp, err := post(ctx, chatBody("a long story, part "+strings.Repeat(string(rune('k'+i)), 40), 100000, true))
		if err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(resp.Body)
		if _, err := rd.ReadString('\n'); err != nil { // the first event: it runs
			t.Fatal(err)
		}
		streams = append(streams, stream{replica: resp.Header.Get("X-Test-Replica"), rd: rd, body: resp.Body})
	}
	defer func() {
		for _, s := range streams {
			s.body.Close()
		}
	}()
	if !slices.ContainsFunc(streams, func(s stream) bool { return s.replica == "a" }) || !slices.ContainsFunc(streams, func(s stream) bool { return s.replica == "b" }) {
		t.Fatalf("streams on %v: want both replicas", streams)
	}

	// a's engine freezes; requests keep coming.
	resp, err := client.Post(a.srv.URL+"/debug/stall", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	hitsAtFreeze := a.hits.Load()
	var wg sync.WaitGroup
	codes := make(chan string, 6)
	for i := range 6 {
		wg.Go(func() {
			resp, err := post(ctx, chatBody("meanwhile "+strings.Repeat(string(rune('p'+i)), 30), 8, i%2 == 0))
			if err != nil {
				codes <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			codes <- resp.Status + " " + string(body)
		})
	}
	for _, s := range streams {
		if s.replica != "a" {
			continue
		}
		rest, _ := io.ReadAll(s.rd) // the router ends it
		if !strings.Contains(string(rest), `"error"`) || strings.Contains(string(rest), "[DONE]") {
			t.Errorf("a stream on the frozen replica ended without an error event: ...%s", tail(rest))
		}
	}
	for _, s := range streams {
		if s.replica != "b" {
			continue
		}
		for range 20 { // b's streams go on (they would run for minutes)
			line, err := s.rd.ReadString('\n')
			if err != nil || strings.Contains(line, `"error"`) {
				t.Fatalf("a stream on the healthy replica broke: %q %v", line, err)
			}
		}
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if !strings.HasPrefix(c, "200 ") || strings.Contains(c, `"error"`) {
			t.Errorf("a request sent while the replica was frozen got %.200q, want 200", c)
		}
	}
	if got := counterOf(t, r, "kvmesh_replica_ejections_total", "stalled"); got < 1 {
		t.Errorf("ejections{stalled} = %v, want ≥ 1", got)
	}
	if got := counterOf(t, r, "kvmesh_replica_ejections_total", "failed_checks"); got != 0 {
		t.Errorf("ejections{failed_checks} = %v: the frozen replica answers its checks", got)
	}
	if got := counterOf(t, r, "kvmesh_stalled_requests_total", ""); got < 1 {
		t.Errorf("kvmesh_stalled_requests_total = %v, want ≥ 1", got)
	}
	if hasCandidate(r, simModel, a.srv.URL) {
		t.Error("the frozen replica is still a candidate")
	}
	t.Logf("the frozen replica took %d requests after the freeze", a.hits.Load()-hitsAtFreeze)
	// Frozen, it runs nothing now (its requests were ended), answers its
	// health checks, and is not re-admitted: it does not answer the
	// checker's one-token probe.
	time.Sleep(300 * time.Millisecond) // six health intervals
	if hasCandidate(r, simModel, a.srv.URL) {
		t.Error("the frozen replica was re-admitted")
	}

	resp, err = client.Post(a.srv.URL+"/debug/resume", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eventually(t, "the resumed replica admitted again", func() bool { return hasCandidate(r, simModel, a.srv.URL) })
}

// tail is the end of b, for messages.
func tail(b []byte) string {
	return string(b[max(0, len(b)-300):])
}

// TestEndToEndSlowPrefillNotEjected: a replica prefilling a long prompt
// slowly sends nothing and moves no counter for longer than the stall
// window; the router, which timed its prefill on an earlier answer,
// expects that and does not eject it (the silence is counted as
// prefilling), and the answer comes. With the window alone it would be
// ejected, and with one replica the request would fail.
func TestEndToEndSlowPrefillNotEjected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow := startCountingSim(t, "slow", replicasim.Config{PrefillTokensPerS: 1000, DecodeMsPerToken: 1})
	defer slow.close()
	r := lifecycleRouter(t, ctx, time.Second, slow.srv.URL)
	client := &http.Client{Transport: &http.Transport{}, Timeout: 120 * time.Second}
	defer client.CloseIdleConnections()
	ask := func(prompt string) string {
		t.Helper()
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(prompt, 4, true)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") || strings.Contains(string(b), `"error"`) {
			t.Fatalf("status %d: ...%s", resp.StatusCode, tail(b))
		}
		return string(b)
	}
	// Two blocks (about 530 tokens: half a second of prefill) time it.
	ask(strings.Repeat("measure ", 265))
	// Sixteen blocks (about 4,100 tokens): four seconds of silence.
	ask(strings.Repeat("a much longer document ", 710))
	if got := counterOf(t, r, "kvmesh_replica_ejections_total", "stalled"); got != 0 {
		t.Errorf("ejections{stalled} = %v: a prefilling replica was ejected", got)
	}
	if got := counterOf(t, r, "kvmesh_stall_checks_total", "prefilling"); got < 1 {
		t.Errorf("stall checks{prefilling} = %v: the prefill never outlasted the window, the test tests nothing", got)
	}
}

// TestEndToEndAddedReplicaWarms is issue 24's warm-up acceptance on
// replica-sims: three replicas serve conversations until they hold them;
// a fourth is added to the router's replica file; new conversations (cold
// requests) then go to it, by the warm-up share among others (the
// decision reason warm-up), its summary holds blocks, and the next turn
// of a conversation it took finds them cached in its engine.
func TestEndToEndAddedReplicaWarms(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := replicasim.Config{DecodeMsPerToken: 1, DefaultMaxTokens: 8}
	var sims []*countingSim
	for _, n := range []string{"a", "b", "c", "new"} {
		s := startCountingSim(t, n, cfg)
		defer s.close()
		sims = append(sims, s)
	}
	file := t.TempDir() + "/replicas"
	write := func(n int, mod time.Time) {
		var b strings.Builder
		for _, s := range sims[:n] {
			b.WriteString(s.srv.URL + "\n")
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	write(3, t0)
	logs := &lockedWriter{}
	r, err := startRouter(ctx, routerConfig{
		name: "a", region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Info, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		sources: replicaSources{file: file, filePoll: 20 * time.Millisecond},
	})
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
	for _, s := range sims[:3] {
		eventually(t, "the first three replicas", func() bool { return hasCandidate(r, simModel, s.srv.URL) })
	}
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	type turn struct {
		replica string
		cached  int
		answer  string
	}
	ask := func(msgs []map[string]string) turn {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": simModel, "messages": msgs, "max_tokens": 8})
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var u chatUsage
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		tr := turn{replica: resp.Header.Get("X-Test-Replica")}
		if len(u.Choices) > 0 {
			tr.answer = u.Choices[0].Message.Content
		}
		if d := u.Usage.PromptTokensDetails; d != nil {
			tr.cached = d.CachedTokens
		}
		return tr
	}
	first := func(i int) []map[string]string {
		return []map[string]string{{"role": "user", "content": strings.Repeat("conversation "+strconv.Itoa(i)+" asks at length. ", 80)}}
	}
	// A warm cluster: 24 conversations of two turns.
	for i := range 24 {
		msgs := first(i)
		tr := ask(msgs)
		ask(append(msgs, map[string]string{"role": "assistant", "content": tr.answer}, map[string]string{"role": "user", "content": "and then?"}))
	}
	warmBefore := counterOf(t, r, "kvmesh_route_decisions_total", "warm-up")

	write(4, t0.Add(time.Minute))
	eventually(t, "the added replica", func() bool { return hasCandidate(r, simModel, sims[3].srv.URL) })
	hits := sims[3].hits.Load()
	took := -1
	for i := 100; i < 112; i++ {
		if tr := ask(first(i)); tr.replica == "new" && took < 0 {
			took = i
		}
	}
	if sims[3].hits.Load() == hits || took < 0 {
		t.Fatal("the added replica took none of 12 new conversations")
	}
	if got := counterOf(t, r, "kvmesh_route_decisions_total", "warm-up") - warmBefore; got < 1 {
		t.Errorf("warm-up decisions: %v, want at least one", got)
	}
	held := int32(0)
	for _, c := range r.mesh.Candidates(simModel, nil) {
		if c.ID() == sims[3].srv.URL {
			held = c.Held
		}
	}
	if held == 0 {
		t.Error("the added replica's summary holds nothing")
	}
	msgs := first(took)
	tr := ask(msgs)
	next := ask(append(msgs, map[string]string{"role": "assistant", "content": tr.answer}, map[string]string{"role": "user", "content": "and then?"}))
	if next.replica != "new" || next.cached == 0 {
		t.Errorf("the next turn of a conversation the added replica took: %+v, want it there and cached", next)
	}
	t.Logf("the added replica took %d of 12 new conversations and holds %d blocks", sims[3].hits.Load()-hits, held)
}
