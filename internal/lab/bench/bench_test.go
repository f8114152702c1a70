package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/deadaddr"
	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// fakeOpenAI is a minimal streaming chat-completions server on 127.0.0.1.
type fakeOpenAI struct {
	srv      *httptest.Server
	mode     string        // "" ok, "503", "cut", "error_event", "bad_chunk", "hang"
	delay    time.Duration // before the first content chunk
	cached   int64         // reported cached tokens per request
	gate     chan struct{} // if non-nil, hold each request until closed
	inFlight atomic.Int64
	maxSeen  atomic.Int64

	mu     sync.Mutex
	bodies []chatRequest
}

func newFake(t *testing.T, mode string) *fakeOpenAI {
	t.Helper()
	f := &fakeOpenAI{mode: mode}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Listener = ln
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var body chatRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-r.Context().Done():
			return
		}
	}
	switch f.mode {
	case "503":
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		return
	case "hang":
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	// A role-only chunk first, as vLLM sends: it must not count as TTFT.
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	fl.Flush()
	time.Sleep(f.delay)
	switch f.mode {
	case "cut":
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		return
	case "error_event":
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\"}}\n\n")
		return
	case "bad_chunk":
		fmt.Fprint(w, "data: {not json\n\n")
		return
	}
	prompt := int64(len(body.Messages[0].Content) / 4)
	for i := 0; i < body.MaxTokens; i++ {
		fmt.Fprint(w, "data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
		prompt, body.MaxTokens, min(f.cached, prompt))
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (f *fakeOpenAI) requests() []chatRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]chatRequest(nil), f.bodies...)
}

// reqsAt builds n requests arriving at the given offsets (or all at 0).
func reqsAt(n int, at func(i int) time.Duration) []trace.Request {
	out := make([]trace.Request, n)
	for i := range out {
		out[i] = trace.Request{InputTokens: 100 + i, OutputTokens: i % 3, HashIDs: []int64{0, int64(i + 1)}}
		if at != nil {
			out[i].Arrival = at(i)
		}
	}
	return out
}

func TestRunMeasures(t *testing.T) {
	f := newFake(t, "")
	f.delay = 30 * time.Millisecond
	f.cached = 25
	reqs := reqsAt(6, nil)
	res, err := Run(context.Background(), "fake", Config{
		Frontends: []string{f.srv.URL + "/"}, Requests: reqs, Model: "m1", Concurrency: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Name != "fake" || res.Requests != 6 || res.Errors != 0 || len(res.ErrorsByKind) != 0 {
		t.Fatalf("result %+v", res)
	}
	var prompt int64
	for _, r := range reqs {
		prompt += int64(r.InputTokens)
	}
	if want := float64(25*6) / float64(prompt); res.HitRatio != want {
		t.Fatalf("hit ratio %v, want %v", res.HitRatio, want)
	}
	if res.PromptTokens != prompt || res.CachedTokens != 150 {
		t.Fatalf("tokens %d/%d", res.CachedTokens, res.PromptTokens)
	}
	// TTFT must include the delay before the first content (the role chunk
	// before it does not count); a lower bound cannot flake.
	if len(res.TTFTsMs) != 6 || res.TTFTP50Ms < 30 || res.MeanTTFTMs < 30 {
		t.Fatalf("ttfts %v p50 %v", res.TTFTsMs, res.TTFTP50Ms)
	}
	if !(res.TTFTP50Ms <= res.TTFTP90Ms && res.TTFTP90Ms <= res.TTFTP99Ms) {
		t.Fatalf("percentiles out of order: %+v", res)
	}
	if res.WallSeconds <= 0 || res.Goodput <= 0 || res.Goodput != float64(6)/res.WallSeconds {
		t.Fatalf("goodput %v wall %v", res.Goodput, res.WallSeconds)
	}
	var outTok int
	for _, r := range reqs {
		outTok += max(r.OutputTokens, 1)
	}
	if got := res.OutputTokensPerS * res.WallSeconds; got < float64(outTok)-0.01 || got > float64(outTok)+0.01 {
		t.Fatalf("output tokens %v, want %d", got, outTok)
	}
	bodies := f.requests()
	if len(bodies) != 6 {
		t.Fatalf("server saw %d requests", len(bodies))
	}
	for _, b := range bodies {
		if b.Model != "m1" || !b.Stream || !b.StreamOptions.IncludeUsage || b.MaxTokens < 1 || len(b.Messages) != 1 || b.Messages[0].Role != "user" {
			t.Fatalf("bad body %+v", b)
		}
		// Find which request this was by its prompt length.
		i := len(b.Messages[0].Content)/4 - 100
		if i < 0 || i >= len(reqs) {
			t.Fatalf("prompt length %d", len(b.Messages[0].Content))
		}
		if b.Messages[0].Content != trace.Synthesize(reqs[i].HashIDs, reqs[i].InputTokens, 4) {
			t.Fatalf("request %d: prompt is not the synthesized text", i)
		}
		if b.MaxTokens != max(reqs[i].OutputTokens, 1) {
			t.Fatalf("request %d: max_tokens %d", i, b.MaxTokens)
		}
	}
}

func TestRunErrorKinds(t *testing.T) {
	// Refused for the whole test: a fake closed at once had its port
	// given to another binary's listener under a parallel go test ./...,
	// which accepted and never answered (the run then waited out the
	// client's header timeout).
	closedURL := "http://" + deadaddr.Addr(t)
	tests := []struct {
		mode   string
		url    string // overrides the fake's
		client *http.Client
		kind   string
	}{
		{mode: "503", kind: "http_503"},
		{mode: "cut", kind: "stream_cut"},
		{mode: "error_event", kind: "stream_error"},
		{mode: "bad_chunk", kind: "bad_chunk"},
		{mode: "", url: closedURL, kind: "connect"},
		{mode: "hang", client: &http.Client{Timeout: 100 * time.Millisecond}, kind: "timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			f := newFake(t, tc.mode)
			url := f.srv.URL
			if tc.url != "" {
				url = tc.url
			}
			res, err := Run(context.Background(), "x", Config{
				Frontends: []string{url}, Requests: reqsAt(3, nil), Model: "m", HTTPClient: tc.client,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != 0 || res.Errors != 3 || res.ErrorsByKind[tc.kind] != 3 || len(res.ErrorsByKind) != 1 {
				t.Fatalf("got ok=%d errors=%d kinds=%v, want 3 %s", res.Requests, res.Errors, res.ErrorsByKind, tc.kind)
			}
		})
	}
}

func TestRunErrorsDoNotAbort(t *testing.T) {
	good, bad := newFake(t, ""), newFake(t, "503")
	res, err := Run(context.Background(), "mix", Config{
		Frontends: []string{good.srv.URL, bad.srv.URL}, Requests: reqsAt(10, nil), Model: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 5 || res.Errors != 5 || res.ErrorsByKind["http_503"] != 5 {
		t.Fatalf("%+v", res)
	}
}

func TestRunConcurrencyBound(t *testing.T) {
	f := newFake(t, "")
	f.gate = make(chan struct{})
	const limit = 3
	done := make(chan Result, 1)
	go func() {
		res, err := Run(context.Background(), "c", Config{
			Frontends: []string{f.srv.URL}, Requests: reqsAt(10, nil), Model: "m", Concurrency: limit,
		})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Wait (bounded) until the limit is reached, then hold a moment so an
	// unbounded client would have sent more.
	for i := 0; f.inFlight.Load() < limit; i++ {
		if i > 1000 {
			t.Fatalf("only %d in flight after 10s", f.inFlight.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if got := len(f.requests()); got != limit {
		t.Fatalf("server saw %d requests while %d were held, want %d", got, limit, limit)
	}
	close(f.gate)
	res := <-done
	if res.Requests != 10 || f.maxSeen.Load() != limit {
		t.Fatalf("ok=%d max in flight=%d", res.Requests, f.maxSeen.Load())
	}
	if res.QueuedRequests < 1 || res.MaxQueueWaitMs < 100 {
		t.Fatalf("queued=%d max wait=%vms, want the 4th arrival to have waited >=100ms", res.QueuedRequests, res.MaxQueueWaitMs)
	}
}

func TestRunFrontendsInTurn(t *testing.T) {
	fs := []*fakeOpenAI{newFake(t, ""), newFake(t, ""), newFake(t, "")}
	urls := []string{fs[0].srv.URL, fs[1].srv.URL, fs[2].srv.URL}
	// Arrivals 5ms apart keep order irrelevant; we check by prompt length.
	res, err := Run(context.Background(), "rr", Config{
		Frontends: urls, Requests: reqsAt(8, func(i int) time.Duration { return time.Duration(i) * 5 * time.Millisecond }), Model: "m",
	})
	if err != nil || res.Requests != 8 {
		t.Fatalf("%+v %v", res, err)
	}
	for k, f := range fs {
		bodies := f.requests()
		if want := []int{3, 3, 2}[k]; len(bodies) != want {
			t.Fatalf("front end %d got %d requests, want %d", k, len(bodies), want)
		}
		for _, b := range bodies {
			if i := len(b.Messages[0].Content)/4 - 100; i%3 != k {
				t.Fatalf("request %d went to front end %d", i, k)
			}
		}
	}
}

func TestRunLimits(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want int
	}{
		{"max requests", Config{MaxRequests: 4}, 4},
		// The second request is due an hour in: Duration must stop the run
		// long before that.
		{"duration", Config{Duration: 200 * time.Millisecond}, 1},
		// Speedup 1e9 turns the hour into 3.6ms: both are sent.
		{"speedup", Config{Speedup: 1e9}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, "")
			cfg := tc.cfg
			cfg.Frontends = []string{f.srv.URL}
			cfg.Model = "m"
			if tc.name == "max requests" {
				cfg.Requests = reqsAt(10, nil)
			} else {
				cfg.Requests = reqsAt(2, func(i int) time.Duration { return time.Duration(i) * time.Hour })
			}
			res, err := Run(context.Background(), "l", cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != tc.want || len(f.requests()) != tc.want {
				t.Fatalf("completed %d, server saw %d, want %d", res.Requests, len(f.requests()), tc.want)
			}
		})
	}
}

func TestRunSpeedupDelays(t *testing.T) {
	f := newFake(t, "")
	reqs := reqsAt(2, func(i int) time.Duration { return time.Duration(i) * 400 * time.Millisecond })
	res, err := Run(context.Background(), "s", Config{Frontends: []string{f.srv.URL}, Requests: reqs, Model: "m", Speedup: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.WallSeconds < 0.2 {
		t.Fatalf("wall %vs: second request (due at 0.4s/2) was sent early", res.WallSeconds)
	}
}

func TestRunCancel(t *testing.T) {
	f := newFake(t, "hang")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var res Result
	var err error
	go func() {
		defer close(done)
		res, err = Run(ctx, "cancel", Config{
			Frontends: []string{f.srv.URL}, Model: "m",
			Requests: reqsAt(3, func(i int) time.Duration { return time.Duration(i) * time.Hour }),
		})
	}()
	for i := 0; len(f.requests()) < 1; i++ {
		if i > 1000 {
			t.Fatal("first request never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if res.ErrorsByKind["canceled"] != 1 || res.Requests != 0 {
		t.Fatalf("%+v", res)
	}
}

func TestRunNoFrontends(t *testing.T) {
	if _, err := Run(context.Background(), "x", Config{Requests: reqsAt(1, nil)}); err == nil {
		t.Fatal("want error")
	}
}

func TestProgress(t *testing.T) {
	f := newFake(t, "")
	var buf syncBuffer
	if _, err := Run(context.Background(), "p", Config{Frontends: []string{f.srv.URL}, Requests: reqsAt(4, nil), Model: "m", Progress: &buf}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "\r[") || !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "4/4 done") {
		t.Fatalf("progress output %q", out)
	}
}

// syncBuffer is a bytes.Buffer safe for the progress goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
