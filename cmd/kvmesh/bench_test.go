package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine serves /v1/models and streaming chat completions on 127.0.0.1
// and counts the completions it served.
func fakeEngine(t *testing.T, model string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, model)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model != model {
			http.Error(w, "bad model", http.StatusNotFound)
			return
		}
		n.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":50}}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRunBench(t *testing.T) {
	a, na := fakeEngine(t, "m-a")
	b, nb := fakeEngine(t, "m-a")
	dir := t.TempDir()
	report := filepath.Join(dir, "r.html")
	var stdout, stderr bytes.Buffer
	err := runBench(context.Background(), []string{
		"--frontend", a.URL + "," + b.URL, "--name", "pair",
		"--group", "solo=" + a.URL,
		"--max-requests", "6", "--speedup", "1000000", "--json", "--report", report,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\nstderr: %s", err, stderr.String())
	}
	var out struct {
		Frontends []struct {
			Name     string  `json:"name"`
			Requests int     `json:"requests"`
			HitRatio float64 `json:"hit_ratio"`
		} `json:"frontends"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
	}
	if len(out.Frontends) != 2 || out.Frontends[0].Name != "pair" || out.Frontends[1].Name != "solo" {
		t.Fatalf("results %+v", out.Frontends)
	}
	for _, r := range out.Frontends {
		if r.Requests != 6 || r.HitRatio != 0.5 {
			t.Fatalf("result %+v", r)
		}
	}
	// pair: 3 each; solo: 6 more on a.
	if na.Load() != 9 || nb.Load() != 3 {
		t.Fatalf("a served %d, b served %d", na.Load(), nb.Load())
	}
	html, err := os.ReadFile(report)
	if err != nil || !strings.Contains(string(html), "<svg") {
		t.Fatalf("report: %v", err)
	}
	if !strings.Contains(stderr.String(), "model m-a") {
		t.Fatalf("model not discovered: %s", stderr.String())
	}
}

func TestRunBenchTable(t *testing.T) {
	a, _ := fakeEngine(t, "m")
	tr := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(tr, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := runBench(context.Background(), []string{"--frontend", a.URL, "--model", "m", "--trace", tr}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "hit ratio") || !strings.Contains(stdout.String(), "bench") {
		t.Fatalf("table:\n%s", stdout.String())
	}
}

func TestRunBenchFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no frontend", nil, "need --frontend"},
		{"bad group", []string{"--group", "nourls"}, "name=URL"},
		{"empty group", []string{"--group", "g="}, "no URLs"},
		{"bad speedup", []string{"--frontend", "http://127.0.0.1:1", "--speedup", "0"}, "speedup"},
		{"missing trace", []string{"--frontend", "http://127.0.0.1:1", "--model", "m", "--trace", "/nonexistent.jsonl"}, "nonexistent"},
		{"model discovery fails", []string{"--frontend", "http://127.0.0.1:1"}, "list models"},
		{"stray arg", []string{"--frontend", "http://127.0.0.1:1", "extra"}, "unexpected"},
		{"negative answer sigma", []string{"--frontend", "http://127.0.0.1:1", "--model", "m", "--conversations", "2", "--answer-sigma", "-1"}, "answer-sigma"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runBench(context.Background(), tc.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
				t.Fatalf("err = %v, stderr %q, want %q", err, stderr.String(), tc.want)
			}
		})
	}
}

// TestBenchConversations runs the conversation mode against two named
// groups with a cache reset before each, then prints the table again from
// the JSON it wrote.
func TestBenchConversations(t *testing.T) {
	a, na := fakeEngine(t, "m")
	b, nb := fakeEngine(t, "m")
	var resets atomic.Int64
	rep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/reset_prefix_cache" {
			resets.Add(1)
		}
	}))
	defer rep.Close()
	var out, errOut bytes.Buffer
	args := []string{"--conversations", "3", "--turns", "2", "--clients", "2", "--think", "1ms", "--json",
		"--group", "one=" + a.URL, "--group", "two=" + a.URL + "," + b.URL, "--reset-replica", rep.URL, "--commit", "abc"}
	if err := runBench(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	var res struct {
		Frontends []struct {
			Name   string  `json:"name"`
			Commit string  `json:"commit"`
			Turns  int     `json:"turns"`
			Share  float64 `json:"followup_cached_share"`
		} `json:"frontends"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Frontends) != 2 || res.Frontends[1].Name != "two" || res.Frontends[1].Commit != "abc" || res.Frontends[0].Turns != 6 || res.Frontends[1].Share != 0.5 {
		t.Fatalf("results %+v", res.Frontends)
	}
	if na.Load()+nb.Load() != 12 || nb.Load() == 0 || resets.Load() != 2 {
		t.Fatalf("served %d + %d, resets %d", na.Load(), nb.Load(), resets.Load())
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := runBench(t.Context(), []string{"--table-from", path}, &table, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "two") || !strings.Contains(table.String(), "0.500") {
		t.Fatalf("table:\n%s", table.String())
	}

	// --request-ids: each turn goes as X-Request-Id GROUP-cC-tT, and the
	// JSON's per-turn records carry it.
	var mu sync.Mutex
	seen := map[string]bool{}
	ids := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Request-Id")] = true
		mu.Unlock()
		a.Config.Handler.ServeHTTP(w, r)
	}))
	defer ids.Close()
	out.Reset()
	args = []string{"--conversations", "2", "--turns", "2", "--clients", "2", "--think", "1ms", "--json", "--request-ids", "--group", "g=" + ids.URL}
	if err := runBench(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	var recs struct {
		Frontends []struct {
			Requests []struct {
				ID string `json:"id"`
			} `json:"requests"`
		} `json:"frontends"`
	}
	if err := json.Unmarshal(out.Bytes(), &recs); err != nil {
		t.Fatal(err)
	}
	want := []string{"g-c0-t0", "g-c0-t1", "g-c1-t0", "g-c1-t1"}
	for _, id := range want {
		if !seen[id] {
			t.Errorf("no request with X-Request-Id %s (saw %v)", id, seen)
		}
	}
	if len(recs.Frontends) != 1 || len(recs.Frontends[0].Requests) != len(want) {
		t.Fatalf("records %+v", recs.Frontends)
	}
	for _, r := range recs.Frontends[0].Requests {
		if !slices.Contains(want, r.ID) {
			t.Errorf("record id %q", r.ID)
		}
	}
}

// TestBenchBalance: --balance serves the round-robin baseline over the
// --backend replicas (requests alternate), and returns once cancelled; a
// policy it does not know is refused before it listens.
func TestBenchBalance(t *testing.T) {
	a, na := fakeEngine(t, "m")
	b, nb := fakeEngine(t, "m")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runBench(ctx, []string{"--balance", "127.0.0.1:0", "--backend", a.URL + "," + b.URL}, &stdout, &stderr)
	}()
	var base string
	for range 2000 {
		if _, after, ok := strings.Cut(stderr.String(), " on http://"); ok {
			base = "http://" + strings.TrimSpace(after)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("exited early: %v; stderr: %s", err, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if base == "" {
		t.Fatal("no listening line")
	}
	for range 4 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if na.Load() != 2 || nb.Load() != 2 {
		t.Errorf("a served %d, b %d; want 2 each", na.Load(), nb.Load())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("returned %v after cancel", err)
	}

	var errOut bytes.Buffer
	err := runBench(context.Background(), []string{"--balance", "127.0.0.1:0", "--balance-policy", "random", "--backend", a.URL}, &errOut, &errOut)
	if err == nil || !strings.Contains(err.Error(), "random") {
		t.Errorf("unknown policy: %v", err)
	}
}

// TestBenchConversationsAnswerFlags: --answer-sigma varies each turn's
// max_tokens around --answer-tokens, the same in two runs of one seed,
// and --ignore-eos sends "ignore_eos": true.
func TestBenchConversationsAnswerFlags(t *testing.T) {
	eng, _ := fakeEngine(t, "m")
	var mu sync.Mutex
	asked := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body struct {
			MaxTokens int  `json:"max_tokens"`
			IgnoreEOS bool `json:"ignore_eos"`
		}
		if err := json.Unmarshal(b, &body); err == nil {
			mu.Lock()
			asked[r.Header.Get("X-Request-Id")] = fmt.Sprintf("%d/%v", body.MaxTokens, body.IgnoreEOS)
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		eng.Config.Handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	run := func() map[string]string {
		clear(asked)
		var out, errOut bytes.Buffer
		args := []string{"--conversations", "8", "--turns", "3", "--clients", "3", "--think", "1ms", "--json", "--request-ids",
			"--answer-tokens", "16", "--answer-sigma", "1", "--ignore-eos", "--seed", "5", "--group", "g=" + srv.URL}
		if err := runBench(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %s", err, errOut.String())
		}
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(asked)
	}
	first, second := run(), run()
	if len(first) != 24 || !maps.Equal(first, second) {
		t.Fatalf("asked %v, then %v", first, second)
	}
	distinct := map[string]bool{}
	for id, a := range first {
		if !strings.HasSuffix(a, "/true") {
			t.Fatalf("%s asked %s, want ignore_eos true", id, a)
		}
		distinct[a] = true
	}
	if len(distinct) < 3 {
		t.Fatalf("σ 1 asked few lengths: %v", distinct)
	}
}
