package replicasim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestNextTurnHitsCache(t *testing.T) {
	cases := []struct {
		name   string
		path   string
		stream bool
	}{
		{"chat", "/v1/chat/completions", false},
		{"chat stream", "/v1/chat/completions", true},
		{"completions", "/v1/completions", false},
		{"completions stream", "/v1/completions", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{TimeScale: fast})
			const bs = 16
			msgs := []map[string]any{
				{"role": "system", "content": longSystem},
				{"role": "user", "content": []map[string]any{{"type": "text", "text": "What is a KV cache?"}}},
			}
			body := func(turn2 bool, prev result) map[string]any {
				b := map[string]any{"model": "kvmesh-sim", "max_tokens": 50, "stream": tc.stream,
					"stream_options": map[string]any{"include_usage": true}}
				if tc.path == "/v1/chat/completions" {
					m := msgs
					if turn2 {
						m = append(append([]map[string]any{}, msgs...),
							map[string]any{"role": "assistant", "content": prev.Text},
							map[string]any{"role": "user", "content": "And why does it matter?"})
					}
					b["messages"] = m
				} else {
					p := longSystem + "Q: What is a KV cache?\nA:"
					if turn2 {
						p += prev.Text + "\nQ: And why does it matter?\nA:"
					}
					b["prompt"] = p
				}
				return b
			}
			r1 := h.generate(tc.path, body(false, result{}))
			if r1.Usage == nil {
				t.Fatal("turn 1: no usage")
			}
			if r1.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Errorf("turn 1 cached = %d, want 0 on a cold cache", r1.Usage.PromptTokensDetails.CachedTokens)
			}
			if r1.Usage.CompletionTokens != 50 || countTokens(r1.Text) != 50 {
				t.Errorf("turn 1 completion tokens = %d (text %d tokens), want 50", r1.Usage.CompletionTokens, countTokens(r1.Text))
			}
			r2 := h.generate(tc.path, body(true, r1))
			want := r1.Usage.PromptTokens + r1.Usage.CompletionTokens - bs
			if got := r2.Usage.PromptTokensDetails.CachedTokens; got < want || got%bs != 0 {
				t.Errorf("turn 2 cached = %d, want a multiple of %d and >= %d (turn 1 prompt %d + answer %d - one block)",
					got, bs, want, r1.Usage.PromptTokens, r1.Usage.CompletionTokens)
			}
			if r2.Usage.PromptTokensDetails.CachedTokens >= r2.Usage.PromptTokens {
				t.Errorf("turn 2 cached %d must be below its prompt %d", r2.Usage.PromptTokensDetails.CachedTokens, r2.Usage.PromptTokens)
			}
		})
	}
}

func TestStreamShape(t *testing.T) {
	cases := []struct {
		name         string
		path         string
		includeUsage bool
		object       string
	}{
		{"chat with usage", "/v1/chat/completions", true, "chat.completion.chunk"},
		{"chat without usage", "/v1/chat/completions", false, "chat.completion.chunk"},
		{"completions with usage", "/v1/completions", true, "text_completion"},
		{"completions without usage", "/v1/completions", false, "text_completion"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{TimeScale: fast})
			const n = 7
			body := map[string]any{"max_completion_tokens": n}
			if tc.object == "text_completion" {
				body["prompt"] = []string{"Once upon a time", "ignored"}
			} else {
				body["messages"] = []map[string]any{{"role": "user", "content": "hi"}}
			}
			plain := h.generate(tc.path, body)
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": tc.includeUsage}
			res := h.generate(tc.path, body)
			if !res.Done {
				t.Fatal("stream did not end with [DONE]")
			}
			if res.Text != plain.Text {
				t.Errorf("streamed text %q != non-streamed %q", res.Text, plain.Text)
			}
			var content, finishes int
			for i, ev := range res.Events {
				if ev["object"] != tc.object || ev["model"] != "kvmesh-sim" || ev["id"] == "" || ev["created"] == nil {
					t.Errorf("event %d has bad envelope: %v", i, ev)
				}
				choices := ev["choices"].([]any)
				if len(choices) == 0 {
					if i != len(res.Events)-1 {
						t.Errorf("usage chunk at %d is not last", i)
					}
					continue
				}
				c := choices[0].(map[string]any)
				if fr := c["finish_reason"]; fr != nil {
					finishes++
					if fr != "length" {
						t.Errorf("finish_reason = %v", fr)
					}
				}
				if d, ok := c["delta"].(map[string]any); ok {
					if i == 0 && d["role"] != "assistant" {
						t.Errorf("first chat chunk delta = %v, want role assistant", d)
					}
					if s, _ := d["content"].(string); s != "" {
						content++
					}
				} else if c["text"] != "" {
					content++
				}
			}
			if content != n || finishes != 1 {
				t.Errorf("content chunks = %d, finish reasons = %d; want %d and 1", content, finishes, n)
			}
			if tc.includeUsage {
				if res.Usage == nil || res.Usage.CompletionTokens != n || res.Usage.TotalTokens != res.Usage.PromptTokens+n {
					t.Errorf("usage = %+v", res.Usage)
				}
			} else if res.Usage != nil {
				t.Errorf("usage sent without include_usage: %+v", res.Usage)
			}
		})
	}
}

// readEvents reads SSE events from r until it has n of them.
func readEvents(t *testing.T, r io.Reader, n int) []string {
	t.Helper()
	var got []string
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 4096)
	for len(got) < n {
		k, err := r.Read(tmp)
		buf = append(buf, tmp[:k]...)
		for {
			i := strings.Index(string(buf), "\n\n")
			if i < 0 {
				break
			}
			got = append(got, string(buf[:i]))
			buf = buf[i+2:]
		}
		if err != nil {
			if len(got) < n {
				t.Fatalf("stream ended after %d events: %v", len(got), err)
			}
		}
	}
	return got
}

func TestStreamArrivesBeforeFinishAndDisconnectFrees(t *testing.T) {
	// 100 tokens at one second each: the request is far from done when the
	// first chunks arrive.
	h := newHarness(t, Config{DecodeMsPerToken: 1000, TimeScale: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := h.post(ctx, "/v1/chat/completions", map[string]any{
		"messages": []map[string]any{{"role": "user", "content": "hello"}}, "max_tokens": 100, "stream": true})
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type = %q", ct)
	}
	evs := readEvents(t, resp.Body, 2)
	if !strings.Contains(evs[0], `"role":"assistant"`) || !strings.Contains(evs[1], `"content":" `) {
		t.Fatalf("first events = %q", evs)
	}
	if got := h.metric("vllm:num_requests_running"); got != 1 {
		t.Fatalf("running = %v while streaming, want 1", got)
	}
	cancel()
	eventually(t, "the cancelled sequence to free its slot", func() bool {
		return h.metric("vllm:num_requests_running") == 0
	})
}

func TestErrors(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast, MaxModelLen: 100})
	h.s.maxBody = 1 << 10
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	cases := []struct {
		name    string
		path    string
		body    any
		status  int
		message string
	}{
		{"malformed json", "/v1/chat/completions", `{"messages": [`, 400, "invalid JSON"},
		{"trailing data", "/v1/chat/completions", `{"messages": []} {}`, 400, "trailing"},
		{"wrong type", "/v1/chat/completions", `{"messages": "hi"}`, 400, "invalid JSON"},
		{"no messages", "/v1/chat/completions", `{"model": "kvmesh-sim"}`, 400, "messages is required"},
		{"no prompt", "/v1/completions", `{"model": "kvmesh-sim"}`, 400, "prompt"},
		{"unknown model", "/v1/chat/completions", map[string]any{"model": "gpt-9", "messages": msgs}, 404,
			"The model `gpt-9` does not exist."},
		{"zero max_tokens", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, "max_tokens"},
		{"too long", "/v1/completions", map[string]any{"prompt": strings.Repeat("abcd", 90), "max_tokens": 20}, 400,
			"maximum context length is 100 tokens"},
		{"default max tokens too long", "/v1/completions", map[string]any{"prompt": "abcd"}, 400,
			"(1 in the messages, 128 in the completion)"},
		{"body too large", "/v1/completions", map[string]any{"prompt": strings.Repeat("a", 2<<10)}, 413, "exceeds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(context.Background(), tc.path, tc.body)
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.status)
			}
			checkOpenAIError(t, resp, tc.message)
		})
	}
}

func checkOpenAIError(t *testing.T, resp *http.Response, wantMsg string) {
	t.Helper()
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("error body is not JSON: %v", err)
	}
	msg, _ := e.Error["message"].(string)
	if !strings.Contains(msg, wantMsg) {
		t.Errorf("message = %q, want it to contain %q", msg, wantMsg)
	}
	if e.Error["type"] != "invalid_request_error" {
		t.Errorf("type = %v", e.Error["type"])
	}
	for _, k := range []string{"param", "code"} {
		if v, ok := e.Error[k]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, ok)
		}
	}
}

func TestModelsHealthMetricsEndpoints(t *testing.T) {
	h := newHarness(t, Config{Model: "m1", TimeScale: fast})
	get := func(path string) (int, string) {
		resp, err := h.c.Get(h.ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cases := []struct {
		path   string
		status int
		has    []string
	}{
		{"/v1/models", 200, []string{`"object":"list"`, `"id":"m1"`, `"object":"model"`}},
		{"/health", 200, nil},
		{"/metrics", 200, []string{`vllm:num_requests_running{model_name="m1"} 0`,
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1`,
			"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket"}},
		{"/nope", 404, []string{"invalid_request_error"}},
	}
	for _, tc := range cases {
		status, body := get(tc.path)
		if status != tc.status {
			t.Errorf("GET %s = %d, want %d", tc.path, status, tc.status)
		}
		for _, s := range tc.has {
			if !strings.Contains(body, s) {
				t.Errorf("GET %s body lacks %q:\n%s", tc.path, s, body)
			}
		}
	}
}

func TestMetricsMoveWithLoad(t *testing.T) {
	h := newHarness(t, Config{MaxNumSeqs: 1, DecodeMsPerToken: 1000, TimeScale: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := map[string]any{"prompt": "hold the slot", "max_tokens": 100, "stream": true}
	a := h.post(ctx, "/v1/completions", body)
	defer a.Body.Close()
	readEvents(t, a.Body, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/completions",
			strings.NewReader(`{"prompt":"wait behind it","max_tokens":3}`))
		if resp, err := h.c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "one running and one waiting", func() bool {
		return h.metric("vllm:num_requests_running") == 1 && h.metric("vllm:num_requests_waiting") == 1
	})
	cancel()
	<-done
	eventually(t, "the queue to drain", func() bool {
		return h.metric("vllm:num_requests_running") == 0 && h.metric("vllm:num_requests_waiting") == 0
	})
}

func TestPrefixCacheCountersAndReset(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast})
	body := map[string]any{"messages": []map[string]any{{"role": "system", "content": longSystem},
		{"role": "user", "content": "repeat me"}}, "max_tokens": 5}
	first := h.generate("/v1/chat/completions", body)
	second := h.generate("/v1/chat/completions", body)
	p := float64(first.Usage.PromptTokens)
	hit := second.Usage.PromptTokensDetails.CachedTokens
	if first.Text != second.Text {
		t.Errorf("filler is not deterministic: %q vs %q", first.Text, second.Text)
	}
	if hit < first.Usage.PromptTokens-16 {
		t.Errorf("repeat cached = %d of %d prompt tokens", hit, first.Usage.PromptTokens)
	}
	checks := []struct {
		name string
		want float64
	}{
		{"vllm:prefix_cache_queries_total", 2 * p},
		{"vllm:prefix_cache_hits_total", float64(hit)},
		{"vllm:prompt_tokens_total", 2 * p},
		{"vllm:generation_tokens_total", 10},
		{"vllm:time_to_first_token_seconds", 2},
		{"vllm:num_requests_running", 0},
	}
	for _, c := range checks {
		if got := h.metric(c.name); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if u := h.metric("vllm:kv_cache_usage_perc"); u <= 0 || u > 1 {
		t.Errorf("kv usage = %v after requests, want in (0,1]", u)
	}
	resp := h.post(context.Background(), "/reset_prefix_cache", "")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset status = %d", resp.StatusCode)
	}
	if u := h.metric("vllm:kv_cache_usage_perc"); u != 0 {
		t.Errorf("kv usage = %v after reset, want 0", u)
	}
	if third := h.generate("/v1/chat/completions", body); third.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("cached after reset = %d, want 0", third.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestCloseEndsSequencesAndLeaksNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, Config{DecodeMsPerToken: 1000, TimeScale: 1})
	resp := h.post(context.Background(), "/v1/chat/completions", map[string]any{
		"messages": []map[string]any{{"role": "user", "content": "long"}}, "max_tokens": 1000, "stream": true})
	readEvents(t, resp.Body, 2)
	closed := make(chan error, 1)
	go func() { closed <- h.s.Close() }()
	rest := readStream(t, resp.Body)
	resp.Body.Close()
	if rest.Done {
		t.Error("a stream cut by Close must not end with [DONE]")
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	after := h.post(context.Background(), "/v1/completions", map[string]any{"prompt": "x"})
	after.Body.Close()
	if after.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("after Close status = %d, want 503", after.StatusCode)
	}
	h.ts.Close()
	h.c.CloseIdleConnections()
	if err := h.s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func nan() float64 { z := 0.0; return z / z }

func TestNewValidates(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"negative blocks", Config{KVBlocks: -1}, false},
		{"negative scale", Config{TimeScale: -2}, false},
		{"NaN decode", Config{DecodeMsPerToken: nan()}, false},
	}
	for _, tc := range cases {
		_, err := New(tc.cfg, nil, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	reg := newHarness(t, Config{}).reg
	if _, err := New(Config{}, nil, reg); err == nil {
		t.Error("second replica on one registry: want an error")
	}
}
