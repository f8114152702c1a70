package status

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/mesh"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeMesh is a Mesh with fixed answers.
type fakeMesh struct {
	members []mesh.MemberInfo
	debug   any
}

func (f *fakeMesh) Members() []mesh.MemberInfo { return f.members }
func (f *fakeMesh) Debug() any                 { return f.debug }

// fakeMetrics registers the kvmesh_* families the page reads, under their
// real names, on a registry of its own.
type fakeMetrics struct {
	reg                         *prometheus.Registry
	decisions                   *prometheus.CounterVec
	predicted, reported, prompt prometheus.Counter
	ttft                        *prometheus.HistogramVec
	dropped                     *prometheus.CounterVec
}

func newFakeMetrics() *fakeMetrics {
	f := &fakeMetrics{reg: prometheus.NewRegistry()}
	f.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDecisions, Help: "h"}, []string{"reason"})
	f.predicted = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPredicted, Help: "h"})
	f.reported = prometheus.NewCounter(prometheus.CounterOpts{Name: metricReported, Help: "h"})
	f.prompt = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrompt, Help: "h"})
	f.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricTTFT, Help: "h", Buckets: []float64{0.01, 0.1, 1}}, []string{"target"})
	f.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDropped, Help: "h"}, []string{"reason"})
	f.reg.MustRegister(f.decisions, f.predicted, f.reported, f.prompt, f.ttft, f.dropped)
	for _, r := range []string{"prefix", "spill", "fallback-cold", "none"} {
		f.decisions.WithLabelValues(r)
	}
	f.dropped.WithLabelValues("duplicate")
	f.dropped.WithLabelValues("handoff_full")
	return f
}

func threeRouters() []mesh.MemberInfo {
	return []mesh.MemberInfo{
		{Name: "r1", Region: "eu", API: "http://10.0.0.1:8080", Addr: "10.0.0.1:7946", State: "alive", Self: true},
		{Name: "r2", Region: "eu", API: "http://10.0.0.2:8080", Addr: "10.0.0.2:7946", State: "alive", RTTMs: 0.8},
		{Name: "r3", Region: "us", API: "http://10.0.0.3:8080", Addr: "10.0.0.3:7946", State: "failed", RTTMs: 71.5},
	}
}

func replicas() mesh.DebugInfo {
	return mesh.DebugInfo{Name: "r1", Replicas: []mesh.ReplicaDebug{
		{ID: "http://vllm-0:8000", Owner: "r1", Owned: true, DeclaredBy: []string{"r1", "r2"}, Models: []string{"llama"}, Healthy: true, Counts: true, Bytes: 4096, Version: 7, InFlight: 3, PendingPref: 12.5},
		{ID: "http://vllm-1:8000", Owner: "r2", DeclaredBy: []string{"r1", "r2"}, Models: []string{"llama"}, Healthy: true, Counts: true, Bytes: 2048, Version: 3, AgeSeconds: 0.4, InFlight: 1},
		{ID: "http://vllm-2:8000", Owner: "r3", DeclaredBy: []string{"r3"}, Models: []string{"llama"}, Healthy: true, Counts: false, AgeSeconds: 42},
		{ID: "http://vllm-3:8000", Owner: "r2", DeclaredBy: []string{"r2"}},
		{ID: "http://vllm-4:8000", DeclaredBy: nil},
	}}
}

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func get(t *testing.T, p *Page, method, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestRender(t *testing.T) {
	withMetrics := func() *fakeMetrics {
		f := newFakeMetrics()
		f.decisions.WithLabelValues("prefix").Add(30)
		f.decisions.WithLabelValues("spill").Add(10)
		f.predicted.Add(1000)
		f.reported.Add(800)
		f.prompt.Add(1600)
		f.dropped.WithLabelValues("handoff_full").Add(2)
		for range 10 {
			f.ttft.WithLabelValues("local").Observe(0.05)
		}
		return f
	}
	tests := []struct {
		name     string
		mesh     *fakeMesh
		metrics  *fakeMetrics
		target   string
		want     []string
		wantNot  []string
		ordered  []string // appear in this order
		wantCode int
	}{
		{
			name: "members and replicas", mesh: &fakeMesh{threeRouters(), replicas()}, metrics: withMetrics(), target: "/",
			want: []string{
				`<meta http-equiv="refresh" content="5">`,
				`data-router="r1"`, `region eu`, `2/3 routers alive`, `3/5 replicas up`,
				`data-member="r1" data-state="alive"`, `data-member="r2" data-state="alive"`, `data-member="r3" data-state="failed"`,
				`(this router)`, `0.8 ms`, `71.5 ms`,
				`data-replica="http://vllm-0:8000" data-owner="r1"`, `(here)`, `4.0 KiB · v7`, `12.5 blocks`,
				`>own<`, `400 ms<`, `42.0 s stale`, `never heard`, `NO OWNER`, `3 stale`,
			},
		},
		{
			name: "decisions and cached tokens since start", mesh: &fakeMesh{threeRouters(), replicas()}, metrics: withMetrics(), target: "/",
			want: []string{
				`(since start)`, `data-reason="prefix"`, `>75.0 %<`, `>25.0 %<`, // shares of 40 decisions
				`data-hit-ratio="50.0 %"`, `data-prediction-error="&#43;20.0 %"`, // 800/1600; (1000-800)/1000
				`data-ttft="local"`, `>55 ms<`, // p50 of ten 50 ms observations, interpolated within 10..100 ms
				`data-drop="handoff_full"><span class="badge warn">2</span>`, `rates appear after two refreshes`,
			},
			wantNot: []string{`<svg width="160"`, `data-drop="duplicate"`}, // no history yet; zero drops left out
			// The reasons in the operator's order, good to bad.
			ordered: []string{`data-reason="prefix"`, `data-reason="spill"`, `data-reason="fallback-cold"`, `data-reason="none"`},
		},
		{
			name: "names are escaped", target: "/",
			mesh: &fakeMesh{members: []mesh.MemberInfo{{Name: `<script>alert(1)</script>`, State: "alive", Self: true, Region: `"><img src=x>`}},
				debug: mesh.DebugInfo{Replicas: []mesh.ReplicaDebug{{ID: `http://x/"onmouseover="alert(1)`, Owner: "<b>"}}}},
			want:    []string{`&lt;script&gt;alert(1)&lt;/script&gt;`, `&#34;&gt;&lt;img src=x&gt;`, `data-replica="http://x/&#34;onmouseover=&#34;alert(1)"`},
			wantNot: []string{`<script>`, `<img src=x>`, `"onmouseover="`, `<b>`},
		},
		{
			name: "no registry", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/",
			want:    []string{`no metrics registry`, `data-member="r3"`},
			wantNot: []string{`id="decisions"`},
		},
		{
			name: "debug view of another type", mesh: &fakeMesh{threeRouters(), map[string]any{}}, target: "/",
			want: []string{`not a mesh.DebugInfo`, `no replicas known`, `data-member="r2"`},
		},
		{
			name: "pointer debug view", mesh: &fakeMesh{threeRouters(), ptr(replicas())}, target: "/",
			want: []string{`data-replica="http://vllm-1:8000"`},
		},
		{
			name: "refresh paused", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/?refresh=0",
			want: []string{`not refreshing`}, wantNot: []string{`http-equiv="refresh"`},
		},
		{
			name: "refresh chosen", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/?refresh=30",
			want: []string{`<meta http-equiv="refresh" content="30">`},
		},
		{name: "refresh junk", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/?refresh=soon", wantCode: http.StatusBadRequest},
		{name: "refresh too long", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/?refresh=99999", wantCode: http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Router: "r1", Mesh: tc.mesh, Now: (&clock{time.Unix(1_800_000_000, 0)}).now}
			if tc.metrics != nil {
				cfg.Gatherer = tc.metrics.reg
			}
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := get(t, p, http.MethodGet, tc.target)
			want := tc.wantCode
			if want == 0 {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, want, body)
			}
			if want != http.StatusOK {
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("content type %q", ct)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
				t.Errorf("content security policy %q", csp)
			}
			for _, s := range tc.want {
				if !strings.Contains(body, s) {
					t.Errorf("page lacks %q", s)
				}
			}
			for _, s := range tc.wantNot {
				if strings.Contains(body, s) {
					t.Errorf("page has %q", s)
				}
			}
			last := -1
			for _, s := range tc.ordered {
				i := strings.Index(body, s)
				if i <= last {
					t.Errorf("%q out of order (at %d, previous at %d)", s, i, last)
				}
				last = i
			}
			if t.Failed() {
				t.Log(body)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestPageIsSelfContained: nothing on the page loads from elsewhere, and
// it runs no script.
func TestPageIsSelfContained(t *testing.T) {
	f := newFakeMetrics()
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg})
	_, body := get(t, p, http.MethodGet, "/")
	for _, s := range []string{"<script", "src=", "<link", "@import", "url(", "http://fonts", "https://"} {
		if strings.Contains(body, s) {
			t.Errorf("page has %q", s)
		}
	}
	if !strings.Contains(body, "<svg") {
		t.Error("page has no inline SVG")
	}
}

func TestMethods(t *testing.T) {
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}})
	for _, tc := range []struct {
		method string
		code   int
		body   bool
	}{
		{http.MethodGet, 200, true}, {http.MethodHead, 200, false}, {http.MethodPost, 405, true}, {http.MethodDelete, 405, true},
	} {
		resp, body := get(t, p, tc.method, "/")
		if resp.StatusCode != tc.code || (body != "") != tc.body {
			t.Errorf("%s: status %d, body %d bytes", tc.method, resp.StatusCode, len(body))
		}
		if tc.code == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: Allow %q", tc.method, resp.Header.Get("Allow"))
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without a mesh: no error")
	}
}

// TestRecentFigures: from the second view on, decisions, hit ratio and
// latency are over the window since the first, with sparklines from the
// third.
func TestRecentFigures(t *testing.T) {
	f := newFakeMetrics()
	c := &clock{time.Unix(1_800_000_000, 0)}
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg, Now: c.now})

	// Before the window: 100 prompt tokens, none cached, slow.
	f.decisions.WithLabelValues("fallback-cold").Add(10)
	f.prompt.Add(100)
	for range 10 {
		f.ttft.WithLabelValues("local").Observe(0.5)
	}
	get(t, p, http.MethodGet, "/")

	// In the window: 100 prompt tokens, 90 reported cached of 100 predicted; fast.
	c.t = c.t.Add(10 * time.Second)
	f.decisions.WithLabelValues("prefix").Add(4)
	f.prompt.Add(100)
	f.reported.Add(90)
	f.predicted.Add(100)
	for range 10 {
		f.ttft.WithLabelValues("local").Observe(0.005)
	}
	_, body := get(t, p, http.MethodGet, "/")
	for _, s := range []string{
		`(last 10.0 s)`, `>90.0 %<`, // recent hit ratio 90/100
		`data-hit-ratio="45.0 %"`, // since start 90/200
		`>&#43;10.0 %<`,           // recent prediction error (100-90)/100
		`>5 ms<`,                  // recent p50 TTFT: only the fast ones
		`rates appear after two refreshes`,
	} {
		if !strings.Contains(body, s) {
			t.Errorf("second view lacks %q", s)
		}
	}
	// prefix: 4 of 4 recent decisions.
	if !strings.Contains(body, `data-reason="prefix"`) || !strings.Contains(body, `>100.0 %<`) {
		t.Error("second view: prefix is not 100 % of the recent decisions")
	}

	c.t = c.t.Add(10 * time.Second)
	f.decisions.WithLabelValues("prefix").Add(2)
	_, body = get(t, p, http.MethodGet, "/")
	if !strings.Contains(body, `<polyline class="line" points="`) || strings.Contains(body, "rates appear after two refreshes") {
		t.Error("third view has no sparkline")
	}

	// Past the window, the first sample no longer counts.
	c.t = c.t.Add(recentWindow)
	_, body = get(t, p, http.MethodGet, "/")
	if !strings.Contains(body, "(last 5m0s)") {
		t.Error("window does not slide")
	}
}

func TestHistory(t *testing.T) {
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{}})
	at, prompt := time.Unix(1_800_000_000, 0), 0.0
	const refresh = 4 * time.Second
	tests := []struct {
		name    string
		step    time.Duration
		views   int
		reset   bool
		wantLen int
	}{
		{name: "quick reloads coalesce", step: 500 * time.Millisecond, views: 3, wantLen: 1}, // within half a refresh of the first
		{name: "bounded", step: 5 * time.Second, views: 3 * historyLen, wantLen: historyLen},
		{name: "a counter restart clears it", step: 5 * time.Second, views: 1, reset: true, wantLen: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.reset {
				prompt = 0
			}
			for range tc.views {
				prompt++
				p.record(sample{at: at, prompt: prompt}, refresh)
				at = at.Add(tc.step)
			}
			p.mu.Lock()
			n := len(p.hist)
			p.mu.Unlock()
			if n != tc.wantLen {
				t.Errorf("history of %d samples, want %d", n, tc.wantLen)
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	h := hist{bounds: []float64{1, 2, 4}, counts: []float64{10, 10, 20}, count: 20}
	tests := []struct {
		name string
		h    hist
		q    float64
		want float64
		ok   bool
	}{
		{"first bucket", h, 0.25, 0.5, true},
		{"empty bucket skipped", h, 0.5, 1, true},
		{"last finite bucket", h, 0.75, 3, true},
		{"in +Inf", hist{bounds: []float64{1}, counts: []float64{1}, count: 4}, 0.9, 1, true},
		{"no observations", hist{bounds: []float64{1}, counts: []float64{0}}, 0.5, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.h.quantile(tc.q)
			if ok != tc.ok || got != tc.want {
				t.Errorf("quantile(%v) = %v, %v; want %v, %v", tc.q, got, ok, tc.want, tc.ok)
			}
		})
	}
	if d := h.sub(hist{bounds: []float64{1, 2, 4}, counts: []float64{5, 5, 5}, count: 5}); d.count != 15 || d.counts[2] != 15 {
		t.Errorf("sub: %+v", d)
	}
	if d := h.sub(hist{bounds: []float64{1}, counts: []float64{1}, count: 1}); d.count != 20 {
		t.Errorf("sub of other buckets: %+v", d)
	}
}

// TestConcurrentViews: several viewers at once share the history safely
// (run with -race).
func TestConcurrentViews(t *testing.T) {
	f := newFakeMetrics()
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg, Refresh: time.Nanosecond})
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 20 {
				f.prompt.Inc()
				if resp, _ := get(t, p, http.MethodGet, "/"); resp.StatusCode != 200 {
					t.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}
