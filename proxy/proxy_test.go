package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/health"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var longPrompt = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)

func TestErrors(t *testing.T) {
	ok := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) })
	tests := []struct {
		name       string
		view       *fakeView
		method     string
		path       string
		body       string
		wantStatus int
		wantMsg    string
		retryAfter bool
	}{
		{name: "malformed JSON", view: newFakeView([]string{"m"}, fakeReplica{id: ok.URL}), body: `{"model":`, wantStatus: 400, wantMsg: "invalid request"},
		{name: "no messages", view: newFakeView([]string{"m"}, fakeReplica{id: ok.URL}), body: `{"model":"m","messages":[]}`, wantStatus: 400, wantMsg: "messages"},
		{name: "no model", view: newFakeView([]string{"m"}, fakeReplica{id: ok.URL}), body: chatBody("", false, "hi"), wantStatus: 400, wantMsg: "model"},
		{name: "bad completion prompt", view: newFakeView([]string{"m"}, fakeReplica{id: ok.URL}), path: "/v1/completions", body: `{"model":"m","prompt":{}}`, wantStatus: 400, wantMsg: "prompt"},
		{name: "body over limit", view: newFakeView([]string{"m"}, fakeReplica{id: ok.URL}), body: chatBody("m", false, strings.Repeat("x", 5000)), wantStatus: 413, wantMsg: "exceeds"},
		{name: "unknown model", view: newFakeView([]string{"m"}), body: chatBody("nope", false, "hi"), wantStatus: 404, wantMsg: "The model 'nope' does not exist."},
		{name: "no healthy replica", view: newFakeView([]string{"m"}), body: chatBody("m", false, "hi"), wantStatus: 503, wantMsg: "no healthy replica", retryAfter: true},
		{name: "all upstreams refuse", view: newFakeView([]string{"m"}, fakeReplica{id: deadAddr(t)}, fakeReplica{id: deadAddr(t)}), body: chatBody("m", false, "hi"), wantStatus: 502, wantMsg: "upstream attempts"},
		{name: "wrong method", view: newFakeView([]string{"m"}), method: http.MethodGet, wantStatus: 405, wantMsg: "not allowed"},
		{name: "unknown path", view: newFakeView([]string{"m"}), path: "/v2/nothing", wantStatus: 404, wantMsg: "no endpoint"},
		{name: "no debug view", view: newFakeView([]string{"m"}), method: http.MethodGet, path: "/debug/mesh", wantStatus: 404, wantMsg: "debug"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, srv, _ := newTestProxy(t, tc.view, func(c *Config) { c.MaxBodyBytes = 4096 })
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/v1/chat/completions"
			}
			req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var e map[string]map[string]any
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("error body %q is not JSON: %v", body, err)
			}
			msg, _ := e["error"]["message"].(string)
			if !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("message %q does not contain %q", msg, tc.wantMsg)
			}
			for _, k := range []string{"type", "param", "code"} {
				if _, ok := e["error"][k]; !ok {
					t.Errorf("error lacks %q: %s", k, body)
				}
			}
			if typ := e["error"]["type"]; typ == "" {
				t.Errorf("empty type")
			}
			if got := resp.Header.Get("Retry-After") != ""; got != tc.retryAfter {
				t.Errorf("Retry-After present %v, want %v", got, tc.retryAfter)
			}
		})
	}
}

// parentsView is a fake view that knows its LoRA adapters' base models.
type parentsView struct {
	*fakeView
	parents map[string]string
}

func (v parentsView) ModelParents() map[string]string { return v.parents }

// TestModelsListParents: /v1/models names a LoRA adapter's base model
// as its parent (vLLM's shape); a base model has none.
func TestModelsListParents(t *testing.T) {
	view := parentsView{newFakeView([]string{"base", "sql-lora"}), map[string]string{"sql-lora": "base"}}
	_, srv, _ := newTestProxy(t, view, nil)
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"object":"list","data":[{"id":"base","object":"model","created":0,"owned_by":"kvmesh"},` +
		`{"id":"sql-lora","object":"model","created":0,"owned_by":"kvmesh","parent":"base"}]}` + "\n"
	if body := readAll(t, resp); resp.StatusCode != 200 || body != want {
		t.Errorf("/v1/models: %d %s, want %s", resp.StatusCode, body, want)
	}
}

func TestOwnEndpoints(t *testing.T) {
	ready := false
	view := newFakeView([]string{"a", "b"})
	p, srv, _ := newTestProxy(t, view, func(c *Config) {
		c.Ready = func() bool { return ready }
		c.Debug = func() any { return map[string]int{"peers": 2} }
	})
	admin := httptest.NewServer(p.AdminHandler())
	t.Cleanup(admin.Close)
	getFrom := func(base, path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	get := func(path string) (int, string) { return getFrom(srv.URL, path) }
	if code, body := get("/v1/models"); code != 200 || body != `{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"kvmesh"},{"id":"b","object":"model","created":0,"owned_by":"kvmesh"}]}`+"\n" {
		t.Errorf("/v1/models: %d %s", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Errorf("/readyz before ready: %d", code)
	}
	ready = true
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz when ready: %d", code)
	}
	// Operators' endpoints are on the admin handler only.
	if code, body := getFrom(admin.URL, "/debug/mesh"); code != 200 || !strings.Contains(body, `"peers": 2`) {
		t.Errorf("admin /debug/mesh: %d %s", code, body)
	}
	if code, body := getFrom(admin.URL, "/metrics"); code != 200 || !strings.Contains(body, "kvmesh_requests_total") {
		t.Errorf("admin /metrics: %d %s", code, body)
	}
	if code, _ := getFrom(admin.URL, "/readyz"); code != 200 {
		t.Errorf("admin /readyz: %d", code)
	}
	for _, path := range []string{"/metrics", "/debug/mesh"} {
		if code, _ := get(path); code != 404 {
			t.Errorf("API %s: %d, want 404", path, code)
		}
	}
}

// TestStreamingIsUnbuffered proves the first chunk reaches the client
// while the replica is still generating.
func TestStreamingIsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" second\"}}]}\n\ndata: [DONE]\n\n")
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	_, srv, _ := newTestProxy(t, view, nil)
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest %q, %v", rest, err)
	}
	view.waitDone(t)
}

func TestRetryBeforeFirstByte(t *testing.T) {
	failing := map[string]http.HandlerFunc{
		"503": func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		},
		"429": func(w http.ResponseWriter, r *http.Request) { http.Error(w, "slow down", http.StatusTooManyRequests) },
	}
	for _, name := range []string{"refused", "503", "429"} {
		t.Run(name, func(t *testing.T) {
			var first string
			var firstSrv *replicaServer
			if name == "refused" {
				first = deadAddr(t)
			} else {
				firstSrv = newReplica(t, failing[name])
				first = firstSrv.URL
			}
			good := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "fine", 0) })
			// The first replica claims the prefix, so it is picked first.
			view := newFakeView([]string{"m"}, fakeReplica{id: first, match: 5}, fakeReplica{id: good.URL}, fakeReplica{id: deadAddr(t) + "/never"})
			view.replicas[2].pending = 1e6 // over the load bound: picked last
			var failures []string
			p, srv, _ := newTestProxy(t, view, func(c *Config) { c.ReportFailure = func(id string) { failures = append(failures, id) } })
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
			body := readAll(t, resp)
			if resp.StatusCode != 200 || !strings.Contains(body, "fine") {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if good.count() != 1 {
				t.Errorf("good replica hits %d", good.count())
			}
			if firstSrv != nil && firstSrv.count() != 1 {
				t.Errorf("first replica hits %d", firstSrv.count())
			}
			if got := testutil.ToFloat64(p.m.retries); got != 1 {
				t.Errorf("retries %v", got)
			}
			wantFailures := []string{first}
			if name == "429" { // overload is not a failure
				wantFailures = nil
			}
			view.waitDone(t)
			view.waitDone(t)
			if !slices.Equal(failures, wantFailures) {
				t.Errorf("passive failures %v, want %v", failures, wantFailures)
			}
		})
	}
}

// TestLastAttemptPassesStatusThrough: when no candidate is left, the last
// upstream's own refusal is more useful to the client than a 502.
func TestLastAttemptPassesStatusThrough(t *testing.T) {
	busy := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		http.Error(w, "busy", http.StatusTooManyRequests)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: busy.URL})
	_, srv, _ := newTestProxy(t, view, nil)
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, "hi"))
	readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("status %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestClientErrorsPassThrough(t *testing.T) {
	bad := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"error":{"message":"max_tokens too large"}}`)
	})
	other := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "x", 0) })
	view := newFakeView([]string{"m"}, fakeReplica{id: bad.URL, match: 5}, fakeReplica{id: other.URL}, fakeReplica{id: other.URL + "/b"})
	_, srv, _ := newTestProxy(t, view, nil)
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	body := readAll(t, resp)
	if resp.StatusCode != 400 || !strings.Contains(body, "max_tokens too large") || other.count() != 0 {
		t.Fatalf("status %d body %s other hits %d", resp.StatusCode, body, other.count())
	}
}

// TestNoRetryAfterBytes: a replica that dies mid-stream ends the client's
// stream with an error event; nothing is retried and the router keeps
// serving.
func TestNoRetryAfterBytes(t *testing.T) {
	dying := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	other := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"x"}, -1) })
	view := newFakeView([]string{"m"}, fakeReplica{id: dying.URL, match: 5}, fakeReplica{id: other.URL}, fakeReplica{id: other.URL + "/b"})
	var failures []string
	_, srv, _ := newTestProxy(t, view, func(c *Config) { c.ReportFailure = func(id string) { failures = append(failures, id) } })
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	before, e := readCutStream(t, resp)
	if len(before) != 1 || !strings.Contains(before[0], "partial") || e["code"] != codeUpstreamError {
		t.Errorf("client got %q, then the error %v; want the event sent before the failure, then %s", before, e, codeUpstreamError)
	}
	view.waitDone(t)
	if other.count() != 0 {
		t.Errorf("retried after bytes were sent")
	}
	if !slices.Equal(failures, []string{dying.URL}) {
		t.Errorf("passive failures %v", failures)
	}
	// The router still serves.
	if resp, err := http.Get(srv.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("router gone after an aborted stream: %v", err)
	} else {
		readAll(t, resp)
	}
}

func TestClientCancelCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	_, srv, _ := newTestProxy(t, view, nil)
	ctx, cancel := context.WithCancel(t.Context())
	resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream request was not cancelled")
	}
	view.waitDone(t)
}

// TestRecordsPromptAndAnswer: after a complete response the owner records
// the blocks of prompt + answer, and compares predicted with reported
// cached tokens.
func TestRecordsPromptAndAnswer(t *testing.T) {
	tests := []struct {
		name   string
		path   string
		body   string
		reply  http.HandlerFunc
		answer string
	}{
		{"chat stream", "/v1/chat/completions", chatBody("m", true, longPrompt),
			func(w http.ResponseWriter, r *http.Request) {
				sseChat(w, []string{"The answer ", "spans several ", "blocks of text, ", "as answers do."}, 32)
			}, "The answer spans several blocks of text, as answers do."},
		{"chat json", "/v1/chat/completions", chatBody("m", false, longPrompt),
			func(w http.ResponseWriter, r *http.Request) {
				jsonChat(w, "A non-streamed answer, long enough for blocks.", 32)
			},
			"A non-streamed answer, long enough for blocks."},
		{"completion stream", "/v1/completions", `{"model":"m","stream":true,"prompt":"` + longPrompt + `"}`,
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"continued text \"}]}\n\n")
				// A chunk split mid-line must still parse.
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"te")
				w.(http.Flusher).Flush()
				io.WriteString(w, "xt\":\"of the completion\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":90,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n")
			}, "continued text of the completion"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := newReplica(t, tc.reply)
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: 2}, fakeReplica{id: deadAddr(t), inFlight: 9}, fakeReplica{id: deadAddr(t), inFlight: 9})
			p, srv, _ := newTestProxy(t, view, nil)
			resp := post(t, t.Context(), srv.URL+tc.path, tc.body)
			readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			view.waitDone(t)
			var pr prompt.Prompt
			var err error
			if strings.Contains(tc.path, "chat") {
				pr, err = prompt.RenderChat([]byte(tc.body))
			} else {
				pr, err = prompt.RenderCompletion([]byte(tc.body))
			}
			if err != nil {
				t.Fatal(err)
			}
			root := testContract.Root("m", "")
			wantPrompt := testContract.AppendHashes(nil, root, pr.Text)
			wantAll := testContract.AppendHashes(nil, root, pr.AppendAnswer(tc.answer))
			recs := view.recorded(rep.URL)
			if len(recs) != 2 || !slices.Equal(recs[0], wantPrompt) || !slices.Equal(recs[1], wantAll) {
				t.Fatalf("records %d (want 2: prompt %d blocks, then prompt+answer %d blocks)", len(recs), len(wantPrompt), len(wantAll))
			}
			if got := testutil.ToFloat64(p.m.reportedCached); got != 32 {
				t.Errorf("reported cached %v", got)
			}
			tokens := testutil.ToFloat64(p.m.promptTokens)
			if tokens < 90 {
				t.Errorf("prompt tokens %v", tokens)
			}
			// The predicted blocks and half the next (nothing learnt
			// yet) at the prompt's own bytes per token.
			if got, want := testutil.ToFloat64(p.m.predictedCached), (2+tailPrior)*float64(testContract.BlockBytes)*tokens/float64(len(pr.Text)); math.Abs(got-want) > 1e-9 {
				t.Errorf("predicted cached %v, want %v", got, want)
			}
		})
	}
}

// TestHintForwarding: router A forwards to the owner B with hints; B
// serves the hinted replica and never forwards again, re-picking among
// its own replicas when the hint is unusable.
func TestHintForwarding(t *testing.T) {
	type hit struct{ hop, replica, match string }
	tests := []struct {
		name      string
		ownerView func(r, l string) *fakeView // B's view, given the hinted replica R and another local L
		wantAt    string                      // "R", "L" or "" (503)
		wantCode  int
	}{
		{"owner serves the hint", func(r, l string) *fakeView {
			return newFakeView([]string{"m"}, fakeReplica{id: r}, fakeReplica{id: l})
		}, "R", 200},
		{"hinted replica full: re-pick own", func(r, l string) *fakeView {
			far := "http://127.0.0.1:1"
			return newFakeView([]string{"m"}, fakeReplica{id: r, inFlight: 100, pending: 1e6}, fakeReplica{id: l},
				fakeReplica{id: "http://x1", owner: far}, fakeReplica{id: "http://x2", owner: far},
				fakeReplica{id: "http://x3", owner: far}, fakeReplica{id: "http://x4", owner: far})
		}, "L", 200},
		{"hint not owned here: never re-forward", func(r, l string) *fakeView {
			return newFakeView([]string{"m"}, fakeReplica{id: r, owner: "http://127.0.0.1:1"}, fakeReplica{id: l})
		}, "L", 200},
		// B answers 503; A then tries its other (dead) candidates.
		{"no own candidate: owner refuses", func(r, l string) *fakeView {
			return newFakeView([]string{"m"}, fakeReplica{id: r, owner: "http://127.0.0.1:1"})
		}, "", 502},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			repR := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from R", 0) })
			repL := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from L", 0) })
			viewB := tc.ownerView(repR.URL, repL.URL)
			pB, err := New(Config{View: viewB, Policy: route.DefaultPolicy(), Contract: testContract, HopKey: testHopKey})
			if err != nil {
				t.Fatal(err)
			}
			var hits []hit
			ownerB := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				hits = append(hits, hit{r.Header.Get(hop.HeaderHop), r.Header.Get(hop.HeaderReplica), r.Header.Get(hop.HeaderMatch)})
				pB.ServeHTTP(w, r)
			})
			viewA := newFakeView([]string{"m"}, fakeReplica{id: repR.URL, owner: ownerB.URL, match: 3}, fakeReplica{id: deadAddr(t), inFlight: 9}, fakeReplica{id: deadAddr(t), inFlight: 9})
			_, srvA, _ := newTestProxy(t, viewA, func(c *Config) { c.HopKey = testHopKey })
			resp := post(t, t.Context(), srvA.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
			body := readAll(t, resp)
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if len(hits) != 1 || hits[0] != (hit{"1", repR.URL, "3"}) {
				t.Fatalf("owner saw %v", hits)
			}
			if len(viewA.recorded(repR.URL)) != 0 {
				t.Errorf("the deciding router recorded a remote replica")
			}
			switch tc.wantAt {
			case "R":
				if repR.count() != 1 || !strings.Contains(body, "from R") {
					t.Errorf("R hits %d body %s", repR.count(), body)
				}
			case "L":
				if repL.count() != 1 || !strings.Contains(body, "from L") {
					t.Errorf("L hits %d body %s", repL.count(), body)
				}
				if got := testutil.ToFloat64(pB.m.decisions.WithLabelValues(string(ReasonRehint))); got != 1 {
					t.Errorf("rehint decisions %v", got)
				}
			}
			for _, rs := range []*replicaServer{repR, repL} {
				for _, h := range rs.headers {
					if h.Get(hop.HeaderHop) != "" || h.Get(hop.HeaderReplica) != "" {
						t.Errorf("hint headers leaked to a replica: %v", h)
					}
				}
			}
		})
	}
}

func TestMetricsLint(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"a"}, 0) })
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	_, srv, reg := newTestProxy(t, view, nil)
	health.New(health.Config{}, []string{rep.URL}, nil, nil, 16, nil, reg)
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	readAll(t, resp)
	view.waitDone(t)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	n, err := testutil.GatherAndCount(reg, "kvmesh_requests_total", "kvmesh_route_decisions_total", "kvmesh_upstream_ttft_seconds", "kvmesh_inflight_requests", "kvmesh_replica_healthy")
	if err != nil || n < 5 {
		t.Errorf("gathered %d series, %v", n, err)
	}
}
