package replicasim

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestFreeze: --stall-after freezes the engine at the request it names:
// that request gets nothing and no counter moves while /health and
// /metrics still answer; POST /debug/resume lets it finish. POST
// /debug/stall freezes a stream mid-answer the same way.
func TestFreeze(t *testing.T) {
	h := newHarness(t, Config{StallAfter: 2, DecodeMsPerToken: 1, TimeScale: 1})
	body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "hello"}}, "max_tokens": 4}
	h.generate("/v1/chat/completions", body)
	gen := h.metric("vllm:generation_tokens_total")
	prompt := h.metric("vllm:prompt_tokens_total")

	done := make(chan result, 1)
	go func() { done <- h.generate("/v1/chat/completions", body) }()
	eventually(t, "the second request to be running", func() bool { return h.metric("vllm:num_requests_running") == 1 })
	for range 3 { // a frozen engine still answers its health check
		resp, err := h.c.Get(h.ts.URL + "/health")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/health while frozen: %v %v", resp, err)
		}
		resp.Body.Close()
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("a request finished while the engine was frozen")
	default:
	}
	if g, p := h.metric("vllm:generation_tokens_total"), h.metric("vllm:prompt_tokens_total"); g != gen || p != prompt {
		t.Fatalf("counters moved while frozen: generation %v -> %v, prompt %v -> %v", gen, g, prompt, p)
	}
	h.post(context.Background(), "/debug/resume", "").Body.Close()
	if r := <-done; len(r.Text) == 0 {
		t.Fatal("the frozen request did not finish after resume")
	}

	// Mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := h.post(ctx, "/v1/chat/completions", map[string]any{
		"messages": []map[string]any{{"role": "user", "content": "a long answer"}}, "max_tokens": 100000, "stream": true})
	defer resp.Body.Close()
	readEvents(t, resp.Body, 2)
	h.post(context.Background(), "/debug/stall", "").Body.Close()
	// A token past the freeze's check may still land: wait for the
	// counter to stand, then it must keep standing.
	var frozenAt float64
	eventually(t, "the counter to stand", func() bool {
		a := h.metric("vllm:generation_tokens_total")
		time.Sleep(30 * time.Millisecond)
		frozenAt = h.metric("vllm:generation_tokens_total")
		return a == frozenAt
	})
	time.Sleep(100 * time.Millisecond)
	if g := h.metric("vllm:generation_tokens_total"); g != frozenAt {
		t.Fatalf("tokens generated while frozen: %v -> %v", frozenAt, g)
	}
	h.post(context.Background(), "/debug/resume", "").Body.Close()
	eventually(t, "tokens again after resume", func() bool { return h.metric("vllm:generation_tokens_total") > frozenAt })
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
}
