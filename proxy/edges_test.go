package proxy

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
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
)

// openAIError decodes an OpenAI-shaped error body, failing the test on
// any other shape.
func openAIError(t *testing.T, body string) (typ string, code *string, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error: %q (%v)", body, err)
	}
	return e.Error.Type, e.Error.Code, e.Error.Message
}

// rawRequest opens a connection to srv and sends the head of a POST that
// announces contentLength bytes, then prefix of its body.
func rawRequest(t *testing.T, addr string, contentLength int, prefix string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testWait)) // every read and write of the test's is bounded
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", contentLength, prefix)
	return c
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// edgeServer serves h like httptest.NewServer and counts connections in
// StateActive (a request is being read or served).
func edgeServer(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var active atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateActive:
			active.Add(1)
		case http.StateIdle, http.StateHijacked, http.StateClosed:
			// StateClosed after StateIdle would count twice; the tests
			// only read it while requests are active.
			if s != http.StateClosed {
				active.Add(-1)
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &active
}

func newEdgeProxy(t *testing.T, view View, mod func(*Config)) (*Proxy, *httptest.Server, *atomic.Int64) {
	t.Helper()
	cfg := Config{RouterName: "test", View: view, Policy: route.DefaultPolicy(), Contract: testContract}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, active := edgeServer(t, p)
	return p, srv, active
}

// waitUntil is waitFor polling every 10ms.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testWait); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestBodyFloodBounded is issue 8 item 1: 100 connections announcing
// 16 MB bodies that never come must not make the router allocate 16 MB
// each (1.6 GB): memory follows the bytes that arrived. The heap bound is
// coarse (an allocation per announced byte would exceed it 25 times
// over), not a timing.
func TestBodyFloodBounded(t *testing.T) {
	view := newFakeView([]string{"m"}, fakeReplica{id: deadAddr(t)})
	_, srv, active := newEdgeProxy(t, view, func(c *Config) { c.MaxBodyBytes = 16 << 20; c.BodyTimeout = time.Minute })
	addr := strings.TrimPrefix(srv.URL, "http://")
	before := heapInUse()
	var conns []net.Conn
	for range 100 {
		conns = append(conns, rawRequest(t, addr, 16<<20, `{"model":"m","messages":[`))
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	waitUntil(t, "100 requests being read", func() bool { return active.Load() >= 100 })
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz under the flood: %v", err)
	}
	resp.Body.Close()
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap grew by %.1f MB for 100 announced 16 MB bodies", float64(grew)/(1<<20))
	if grew > 64<<20 {
		t.Fatalf("heap grew by %d MB", grew>>20)
	}
}

// TestSlowBodiesTimeOut is issue 8 item 2: connections that send headers
// and then a byte now and then would hold a descriptor forever; the body
// deadline answers them 408 and closes them, and the router serves
// meanwhile.
func TestSlowBodiesTimeOut(t *testing.T) {
	ok := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "fine", 0) })
	view := newFakeView([]string{"m"}, fakeReplica{id: ok.URL})
	_, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.BodyTimeout = 300 * time.Millisecond })
	addr := strings.TrimPrefix(srv.URL, "http://")
	const n = 200
	var conns []net.Conn
	for range n {
		conns = append(conns, rawRequest(t, addr, 4096, `{"model":"m",`))
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, "hi"))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("chat while %d bodies trickle: %d %s", n, resp.StatusCode, body)
	}
	for i, c := range conns {
		// The server answers and closes: reading reaches EOF without this
		// side closing (bounded by a generous deadline, not a timing).
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("conn %d: not closed by the router: %v", i, err)
		}
		if !strings.HasPrefix(string(b), "HTTP/1.1 408") || !strings.Contains(string(b), "not received within") {
			t.Fatalf("conn %d got %q", i, b)
		}
	}
}

// TestClientInflightCap: one client address may have only so many
// requests in flight; the next gets an OpenAI-shaped 429 with
// Retry-After and its connection closed.
func TestClientInflightCap(t *testing.T) {
	release := make(chan struct{})
	slow := newReplica(t, func(w http.ResponseWriter, r *http.Request) { <-release; jsonChat(w, "ok", 0) })
	view := newFakeView([]string{"m"}, fakeReplica{id: slow.URL})
	_, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.MaxInflightPerClient = 2; c.BodyTimeout = time.Minute })
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // a test failed before it ends: before the servers close, which wait for the handlers
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, "hi")))
			if err != nil {
				done <- 0
				return
			}
			_, err = io.Copy(io.Discard, resp.Body) // not readAll: its t.Fatal belongs to the test's goroutine
			resp.Body.Close()
			if err != nil {
				t.Errorf("reading response: %v", err)
			}
			done <- resp.StatusCode
		}()
	}
	waitUntil(t, "two requests at the replica", func() bool { return slow.count() == 2 })
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, "hi"))
	body := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Fatalf("third request: %d Retry-After %q close %v: %s", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, body)
	}
	if typ, code, _ := openAIError(t, body); typ != "requests" || code == nil || *code != "rate_limit_exceeded" {
		t.Errorf("429 type %q code %v", typ, code)
	}
	// A refused client trickling its body does not keep the connection:
	// the router answers and closes without reading the rest (the body
	// deadline is a minute; the read below gives up well before).
	raw := rawRequest(t, strings.TrimPrefix(srv.URL, "http://"), 4096, `{"model":`)
	defer raw.Close()
	_ = raw.SetReadDeadline(time.Now().Add(20 * time.Second))
	if b, err := io.ReadAll(raw); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 429") {
		t.Fatalf("refused slow client: %q, %v (connection kept open?)", b, err)
	}
	// Probes are never capped.
	if r, err := http.Get(srv.URL + "/healthz"); err != nil || r.StatusCode != 200 {
		t.Fatalf("/healthz: %v", err)
	}
	free()
	for range 2 {
		if c := recv(t, done, "an admitted request"); c != 200 {
			t.Errorf("admitted request: %d", c)
		}
	}
	resp = post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, "hi"))
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after the others finished: %d", resp.StatusCode)
	}
}

// TestConnLimiter is issue 8 item 2's descriptor cap: connections over
// the cap get a 503 with Retry-After and are closed; a freed slot is
// reused.
func TestConnLimiter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	lim := LimitConns(ln, 2, nil, func(string) { dropped.Add(1) })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(lim)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitUntil(t, "two connections accepted", func() bool { return lim.Open() == 2 })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("over the cap: %v", err)
	}
	body := readAll(t, resp)
	c.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the cap: %d %v", resp.StatusCode, resp.Header)
	}
	openAIError(t, body)
	// A liveness probe over the cap is still told the process serves.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c2, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if b, err := io.ReadAll(c2); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 200 OK") {
		t.Errorf("/healthz over the cap: %q %v", b, err)
	}
	c2.Close()
	if dropped.Load() != 2 {
		t.Errorf("dropped %d", dropped.Load())
	}
	held[0].Close()
	waitUntil(t, "a slot freed", func() bool { return lim.Open() == 1 })
	r2, err := http.Get("http://" + addr + "/")
	if err != nil || r2.StatusCode != 200 {
		t.Fatalf("after a slot freed: %v", err)
	}
	r2.Body.Close()
	held[1].Close()
}

// TestNotFoundShapes is issue 8 item 7: 404 model_not_found only for a
// model no replica serves once the models are known; 503 + Retry-After
// while they are not, or while the model's replicas are all down; a
// plain 404 (null code) for unknown paths.
func TestNotFoundShapes(t *testing.T) {
	tests := []struct {
		name        string
		models      []string
		modelsKnown bool
		path, model string
		want        int
		wantCode    string // "" for null
	}{
		{"unknown path", []string{"m"}, true, "/v1/nothing", "", 404, ""},
		{"unknown model", []string{"m"}, true, "", "nope", 404, "model_not_found"},
		{"models not known yet", nil, false, "", "m", 503, ""},
		{"health checks not done", []string{"other"}, false, "", "m", 503, ""},
		{"known model, all replicas down", []string{"m"}, true, "", "m", 503, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			view := newFakeView(tc.models)
			_, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.ModelsKnown = func() bool { return tc.modelsKnown } })
			path := tc.path
			if path == "" {
				path = "/v1/chat/completions"
			}
			resp := post(t, t.Context(), srv.URL+path, chatBody(tc.model, false, "hi"))
			body := readAll(t, resp)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			_, code, _ := openAIError(t, body)
			if got := ""; code != nil {
				got = *code
				if got != tc.wantCode {
					t.Errorf("code %q, want %q", got, tc.wantCode)
				}
			} else if tc.wantCode != "" {
				t.Errorf("code null, want %q", tc.wantCode)
			}
			if (tc.want == 503) != (resp.Header.Get("Retry-After") != "") {
				t.Errorf("Retry-After %q on %d", resp.Header.Get("Retry-After"), tc.want)
			}
		})
	}
}

// TestAPIKeys: with keys, /v1 needs one (401 OpenAI-shaped otherwise),
// probes do not, and a reload takes new keys and drops old ones.
func TestAPIKeys(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", 0) })
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("# team a\nsk-one\n\nsk-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := LoadKeySet(file)
	if err != nil || keys.Len() != 2 {
		t.Fatalf("LoadKeySet: %v", err)
	}
	_, srv, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.APIKeys = keys })
	call := func(method, path, key string) (int, string) {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(chatBody("m", false, "hi"))
		}
		req, _ := http.NewRequestWithContext(context.Background(), method, srv.URL+path, body)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	for _, tc := range []struct {
		method, path, key string
		want              int
	}{
		{http.MethodPost, "/v1/chat/completions", "", 401},
		{http.MethodPost, "/v1/chat/completions", "sk-wrong", 401},
		{http.MethodGet, "/v1/models", "", 401},
		{http.MethodPost, "/v1/chat/completions", "sk-one", 200},
		{http.MethodPost, "/v1/chat/completions", "sk-two", 200},
		{http.MethodGet, "/v1/models", "sk-two", 200},
		{http.MethodGet, "/healthz", "", 200},
		{http.MethodGet, "/readyz", "", 200},
	} {
		code, body := call(tc.method, tc.path, tc.key)
		if code != tc.want {
			t.Errorf("%s %s key %q: %d, want %d: %s", tc.method, tc.path, tc.key, code, tc.want, body)
		}
		if code == 401 {
			if _, c, _ := openAIError(t, body); c == nil || *c != "invalid_api_key" {
				t.Errorf("401 code %v", c)
			}
		}
	}
	// Without a mesh key hint headers prove nothing: they skip no key.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", false, "hi")))
	req.Header.Set(hop.HeaderHop, "1")
	req.Header.Set(hop.HeaderReplica, rep.URL)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("unkeyed hop without an API key: %v %v", resp, err)
	} else {
		readAll(t, resp)
	}
	if err := os.WriteFile(file, []byte("sk-three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := keys.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, _ := call(http.MethodPost, "/v1/chat/completions", "sk-one"); code != 401 {
		t.Errorf("old key after reload: %d", code)
	}
	if code, _ := call(http.MethodPost, "/v1/chat/completions", "sk-three"); code != 200 {
		t.Errorf("new key after reload: %d", code)
	}
	if err := os.WriteFile(file, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := keys.Reload(); err == nil {
		t.Error("a file without keys was accepted")
	}
	if code, _ := call(http.MethodPost, "/v1/chat/completions", "sk-three"); code != 200 {
		t.Errorf("keys in use after a failed reload: %d", code)
	}
}

// TestHopHeadersAuthenticated is issue 8 item 4: with a mesh key, hint
// headers from a client are dropped (the request is routed as any other)
// and a peer's are accepted only with a valid, fresh MAC.
func TestHopHeadersAuthenticated(t *testing.T) {
	key := hop.Key([]byte("0123456789abcdef"))
	repR := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from R", 0) })
	repL := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from L", 0) })
	// L holds the prompt, so routing picks L; a trusted hint picks R.
	view := newFakeView([]string{"m"}, fakeReplica{id: repR.URL}, fakeReplica{id: repL.URL, match: 5})
	p, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.HopKey = key })
	now := time.Now()
	p.now = func() time.Time { return now }
	send := func(h map[string]string) string {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", false, longPrompt)))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return readAll(t, resp)
	}
	signed := func(at time.Time, path string) map[string]string {
		out, _ := http.NewRequest(http.MethodPost, "http://x"+path, nil)
		q := &Proxy{cfg: Config{HopKey: key}, now: func() time.Time { return at }}
		(&hop.Signer{Key: q.cfg.HopKey, Now: q.now}).Sign(out, repR.URL, 3, 0, 0)
		h := map[string]string{}
		for k := range out.Header {
			h[k] = out.Header.Get(k)
		}
		return h
	}
	tests := []struct {
		name string
		h    map[string]string
		want string
	}{
		{"no hints", nil, "from L"},
		{"client-sent hints", map[string]string{hop.HeaderHop: "1", hop.HeaderReplica: repR.URL, hop.HeaderMatch: "0"}, "from L"},
		{"valid MAC", signed(now, "/v1/chat/completions"), "from R"},
		{"stale MAC", signed(now.Add(-5*time.Minute), "/v1/chat/completions"), "from L"},
		{"MAC for another path", signed(now, "/v1/completions"), "from L"},
		{"wrong key", func() map[string]string {
			h := signed(now, "/v1/chat/completions")
			h[hop.HeaderHopMAC] = strings.Repeat("A", 43)
			return h
		}(), "from L"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if body := send(tc.h); !strings.Contains(body, tc.want) {
				t.Fatalf("got %s, want %s", body, tc.want)
			}
		})
	}
	for _, rs := range []*replicaServer{repR, repL} {
		for _, h := range rs.headers {
			for k := range h {
				if strings.HasPrefix(k, "X-Kvmesh-") {
					t.Errorf("header %s reached a replica", k)
				}
			}
		}
	}
}

// TestForwardedHopVerifies: router A signs its hints and owner B, which
// shares the key, serves the hinted replica.
func TestForwardedHopVerifies(t *testing.T) {
	key := hop.Key([]byte("0123456789abcdef"))
	repR := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from R", 0) })
	repL := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from L", 0) })
	pB, err := New(Config{View: newFakeView([]string{"m"}, fakeReplica{id: repR.URL}, fakeReplica{id: repL.URL, match: 9}), Policy: route.DefaultPolicy(), Contract: testContract, HopKey: key})
	if err != nil {
		t.Fatal(err)
	}
	ownerB := httptest.NewServer(pB)
	t.Cleanup(ownerB.Close)
	viewA := newFakeView([]string{"m"}, fakeReplica{id: repR.URL, owner: ownerB.URL, match: 3})
	_, srvA, _ := newEdgeProxy(t, viewA, func(c *Config) { c.HopKey = key })
	resp := post(t, t.Context(), srvA.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	if body := readAll(t, resp); !strings.Contains(body, "from R") {
		t.Fatalf("owner did not serve the signed hint: %d %s", resp.StatusCode, body)
	}
	// With peer TLS required, A refuses to send the prompt to B's http API.
	_, srvA2, _ := newEdgeProxy(t, viewA, func(c *Config) { c.HopKey = key; c.RequirePeerTLS = true })
	resp = post(t, t.Context(), srvA2.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	if body := readAll(t, resp); resp.StatusCode != 502 || repR.count() != 1 {
		t.Fatalf("plain-text forward with peer TLS required: %d %s (R hits %d)", resp.StatusCode, body, repR.count())
	}
}

// TestSafeRetries is issue 8 item 8: another replica is tried only when
// the request provably never reached one, within the attempt cap and the
// retry budget.
func TestSafeRetries(t *testing.T) {
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		// Read the request (it may be running now), then die.
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	tests := []struct {
		name      string
		first     http.HandlerFunc // nil: connection refused
		budget    time.Duration
		want      int
		wantRetry bool
	}{
		{"connection refused", nil, time.Minute, 200, true},
		{"503 before the body", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) }, time.Minute, 200, true},
		{"429", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "slow down", http.StatusTooManyRequests) }, time.Minute, 200, true},
		{"reset after the request was read", hangUp, time.Minute, 502, false},
		{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, time.Minute, 500, false},
		{"budget spent", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) }, time.Nanosecond, 503, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			first := deadAddr(t)
			var firstSrv *replicaServer
			if tc.first != nil {
				firstSrv = newReplica(t, tc.first)
				first = firstSrv.URL
			}
			good := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "fine", 0) })
			view := newFakeView([]string{"m"}, fakeReplica{id: first, match: 5}, fakeReplica{id: good.URL})
			p, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.RetryBudget = tc.budget })
			if tc.budget < time.Millisecond {
				t0 := time.Now()
				calls := 0
				p.now = func() time.Time { calls++; return t0.Add(time.Duration(calls) * time.Second) }
			}
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
			body := readAll(t, resp)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			if got := good.count() == 1; got != tc.wantRetry {
				t.Errorf("retried on the good replica: %v, want %v", got, tc.wantRetry)
			}
			if firstSrv != nil && firstSrv.count() != 1 {
				t.Errorf("first replica got %d requests", firstSrv.count())
			}
		})
	}
}
