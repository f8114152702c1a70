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
	debug   mesh.DebugInfo
}

func (f *fakeMesh) Members() []mesh.MemberInfo { return f.members }
func (f *fakeMesh) Debug() mesh.DebugInfo      { return f.debug }

// fakeMetrics registers the kvmesh_* families the page reads, under their
// real names, on a registry of its own.
type fakeMetrics struct {
	reg                         *prometheus.Registry
	decisions                   *prometheus.CounterVec
	predicted, reported, prompt prometheus.Counter
	ttft                        *prometheus.HistogramVec
	dropped                     *prometheus.CounterVec

	// Families a router registers since the engine-aware and
	// dissemination changes (registered by withNewFamilies).
	predErr                             prometheus.Histogram
	forgotten, deltaBytes, deltaEntries prometheus.Counter
	rejected, streamsRefused, fullCopy  *prometheus.CounterVec
	engineReqs, engineSlots             *prometheus.GaugeVec
}

// withNewFamilies registers the newer families with the proxy's and the
// mesh's buckets and initial label values.
func (f *fakeMetrics) withNewFamilies() *fakeMetrics {
	f.predErr = prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricPredErr, Help: "h", Buckets: []float64{-64, -16, -4, -1, -0.5, 0.5, 1, 4, 16, 64}})
	f.forgotten = prometheus.NewCounter(prometheus.CounterOpts{Name: metricForgotten, Help: "h"})
	f.deltaBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: metricDeltaBytes, Help: "h"})
	f.deltaEntries = prometheus.NewCounter(prometheus.CounterOpts{Name: metricDeltaEntries, Help: "h"})
	f.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRejected, Help: "h"}, []string{"reason"})
	f.streamsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricStreamRefused, Help: "h"}, []string{"reason"})
	f.fullCopy = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricFullCopies, Help: "h"}, []string{"reason"})
	f.engineReqs = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricEngineReqs, Help: "h"}, []string{"replica", "state"})
	f.engineSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricEngineSlots, Help: "h"}, []string{"replica"})
	f.reg.MustRegister(f.predErr, f.forgotten, f.deltaBytes, f.deltaEntries, f.rejected, f.streamsRefused, f.fullCopy, f.engineReqs, f.engineSlots)
	for _, r := range []string{"client_inflight", "connections", "auth", "bad_hop_mac", "body_timeout"} {
		f.rejected.WithLabelValues(r)
	}
	for _, r := range []string{"overflow", "send_error", "request", "cheaper", "log", "new_peer"} {
		f.fullCopy.WithLabelValues(r)
	}
	return f
}

// engine sets a replica's engine gauges as the health checker does.
func (f *fakeMetrics) engine(id string, running, waiting, slots float64) {
	f.engineReqs.WithLabelValues(id, "running").Set(running)
	f.engineReqs.WithLabelValues(id, "waiting").Set(waiting)
	f.engineSlots.WithLabelValues(id).Set(slots)
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
		{ID: "http://vllm-1:8000", Owner: "r2", DeclaredBy: []string{"r1", "r2"}, Models: []string{"llama"}, Healthy: true, Counts: true, Bytes: 2048, Version: 3, AgeSeconds: 0.4, InFlight: 1, Role: "prefill"},
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
				`data-owner="r2" data-role="prefill">`, `<td>http://vllm-1:8000 <span class="badge info">prefill</span></td>`,
			},
			wantNot: []string{`data-role="both"`, `>both<`},
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
			name: "engines per replica", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/",
			metrics: func() *fakeMetrics {
				f := newFakeMetrics().withNewFamilies()
				f.engine("http://vllm-0:8000", 3, 0, 8)
				f.engine("http://vllm-1:8000", 8, 2, 8)    // full and queueing
				f.engine("http://vllm-2:8000", 2, 1, 0)    // slots unknown
				f.engine("http://elsewhere:8000", 1, 1, 1) // not in the mesh's view: not shown
				return f
			}(),
			want: []string{
				`class="engine up" data-engine-running="3" data-engine-waiting="0" data-engine-slots="8"`,
				`class="engine down" data-engine-running="8" data-engine-waiting="2" data-engine-slots="8"`,
				`class="engine warn" data-engine-running="2" data-engine-waiting="1" data-engine-slots="?"`,
				`<rect class="bar up" width="45.0" height="8"/>`,            // 3 of 8 slots
				`<rect class="bar warn" x="96.0" width="24.0" height="8"/>`, // 2 waiting after 8 running, of 10
				`Engine figures are the replicas' own metrics`,
			},
			wantNot: []string{`elsewhere`},
			// vllm-3 and vllm-4 have no engine figures here.
			ordered: []string{`data-engine-slots="?"`, `data-replica="http://vllm-3:8000"`, `<td class="muted">—</td>`},
		},
		{
			name: "engines of other routers' replicas, as gossiped", target: "/",
			mesh: &fakeMesh{threeRouters(), func() mesh.DebugInfo {
				d := replicas()
				d.Replicas[1].EngineRunning, d.Replicas[1].EngineWaiting, d.Replicas[1].EngineSlots = 4, 1, 4 // r2's, full and queueing
				d.Replicas[2].EngineRunning, d.Replicas[2].EngineSlots = 2, 8                                 // r3's
				return d
			}()},
			metrics: func() *fakeMetrics {
				f := newFakeMetrics().withNewFamilies()
				f.engine("http://vllm-0:8000", 3, 0, 8) // owned: its own metric
				return f
			}(),
			want: []string{
				`class="engine up" data-engine-running="3" data-engine-waiting="0" data-engine-slots="8">`,
				`class="engine down" data-engine-running="4" data-engine-waiting="1" data-engine-slots="4" data-engine-gossiped`,
				`class="engine up" data-engine-running="2" data-engine-waiting="0" data-engine-slots="8" data-engine-gossiped`,
				`as their owners gossip them`,
			},
			// vllm-3's owner gossiped no engine load: no figures.
			ordered: []string{`data-engine-gossiped`, `data-replica="http://vllm-3:8000"`, `<td class="muted">—</td>`},
		},
		{
			name: "LoRA adapters per replica", target: "/",
			mesh: &fakeMesh{threeRouters(), func() mesh.DebugInfo {
				d := replicas()
				d.Replicas[0].LoRAMax, d.Replicas[0].LoRAActive, d.Replicas[0].LoRALoaded = 2, 2, []string{"chat-lora", "sql-lora"}
				d.Replicas[1].LoRAMax, d.Replicas[1].LoRAActive = 2, 0
				d.Replicas[2].LoRAActive, d.Replicas[2].LoRALoaded, d.Replicas[2].LoRAWaiting = 2, []string{"sql-lora"}, []string{"legal-lora"}
				return d
			}()},
			metrics: newFakeMetrics(),
			want: []string{
				`LoRA adapters`,
				`data-lora-loaded="chat-lora, sql-lora" data-lora-waiting="" data-lora-max="2">chat-lora, sql-lora <span class="muted">(2 / 2)</span>`,
				`data-lora-loaded="" data-lora-waiting="" data-lora-max="2"><span class="muted">none</span>`,
				`data-lora-loaded="sql-lora" data-lora-waiting="legal-lora" data-lora-max="?">sql-lora · <span class="badge warn">legal-lora</span>`,
			},
		},
		{
			name: "prediction error histogram", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/",
			metrics: func() *fakeMetrics {
				f := newFakeMetrics().withNewFamilies()
				for _, x := range []float64{0, 0, 0, 0, 0, 0, 2, 2, 2, 100, -5, -5} {
					f.predErr.Observe(x)
				}
				f.forgotten.Add(7)
				return f
			}(),
			want: []string{
				`id="prediction"`, `data-pred-count="12"`,
				`data-pred-le="-64" data-count="0"`, `data-pred-le="-4" data-count="2"`, `data-pred-le="0.5" data-count="6"`,
				`data-pred-le="4" data-count="3"`, `data-pred-le="&#43;Inf" data-count="1"`,
				// mean 96/12; p50 in (-0.5, 0.5]; p90 in (1, 4]; p99 in +Inf: the highest bound
				`data-pred-quantiles="&#43;8.0 &#43;0.2 &#43;3.8 &#43;64.0"`,
				`data-forgotten="7"`, `>&gt;64</text>`, `>≤-64</text>`, `>≤0.5</text>`,
				`<title>over 1, at most 4 blocks: 3</title>`,
			},
			// Under-predicted buckets pale, around zero green, over-predicted orange.
			ordered: []string{`class="bar alt" x="71"`, `class="bar up" x="173"`, `class="bar warn" x="241"`},
			wantNot: []string{`no response has reported cached tokens yet`},
		},
		{
			name: "edge, full copies and streams refused", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/",
			metrics: func() *fakeMetrics {
				f := newFakeMetrics().withNewFamilies()
				f.rejected.WithLabelValues("client_inflight").Add(4)
				f.fullCopy.WithLabelValues("overflow").Add(2)
				f.fullCopy.WithLabelValues("new_peer").Add(3)
				f.streamsRefused.WithLabelValues("frame_too_large").Inc()
				f.deltaBytes.Add(300)
				f.deltaEntries.Add(100)
				return f
			}(),
			want: []string{
				`data-rejected="client_inflight"><span class="badge warn">4</span>`,
				`data-full-copies="overflow"><span class="badge warn">2</span> <span class="muted">back-pressure</span>`,
				`data-full-copies="new_peer">3</dd>`,
				`data-stream-refused="frame_too_large"><span class="badge warn">1</span>`,
				`data-delta-per-block="3">3</dd>`,
			},
			wantNot: []string{`data-rejected="auth"`, `data-rejected="none"`, `data-full-copies="cheaper"`},
		},
		{
			name: "nothing refused", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/", metrics: newFakeMetrics().withNewFamilies(),
			want:    []string{`data-rejected="none">none`, `data-pred-count="0"`, `data-pred-quantiles="— — — —"`, `no response has reported cached tokens yet`, `>≤-0.5</text>`},
			wantNot: []string{`data-full-copies=`, `data-stream-refused=`, `data-delta-per-block`, `data-engine-running`},
		},
		{
			name: "a router without the newer families", mesh: &fakeMesh{threeRouters(), replicas()}, target: "/", metrics: newFakeMetrics(),
			want:    []string{`id="decisions"`, `data-reason="prefix"`},
			wantNot: []string{`id="prediction"`, `id="rejected"`, `data-engine-running`, `Engine figures`, `LoRA adapters`},
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
			name: "no replicas", mesh: &fakeMesh{threeRouters(), mesh.DebugInfo{}}, target: "/",
			want: []string{`no replicas known`, `data-member="r2"`},
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
		// histogram_quantile: a first bucket at or below zero has no lower bound.
		{"negative first bucket", hist{bounds: []float64{-4, 0, 4}, counts: []float64{2, 2, 4}, count: 4}, 0.25, -4, true},
		{"negative bounds interpolate", hist{bounds: []float64{-4, 0, 4}, counts: []float64{0, 2, 4}, count: 4}, 0.25, -2, true},
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

// TestRecentPredictionError: from the second view on, the prediction-error
// histogram, the forgotten blocks and the delta cost are over the window.
func TestRecentPredictionError(t *testing.T) {
	f := newFakeMetrics().withNewFamilies()
	c := &clock{time.Unix(1_800_000_000, 0)}
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg, Now: c.now})

	// Before the window: badly over-predicted, expensive deltas.
	for range 5 {
		f.predErr.Observe(100)
	}
	f.forgotten.Add(10)
	f.deltaBytes.Add(800)
	f.deltaEntries.Add(100)
	_, body := get(t, p, http.MethodGet, "/")
	for _, s := range []string{`data-pred-le="&#43;Inf" data-count="5"`, `data-pred-count="5"`, `data-delta-per-block="8"`, `data-forgotten="10">10 since start</dd>`} {
		if !strings.Contains(body, s) {
			t.Errorf("first view lacks %q", s)
		}
	}

	// In the window: right on, cheap.
	c.t = c.t.Add(10 * time.Second)
	for range 4 {
		f.predErr.Observe(0)
	}
	f.forgotten.Add(2)
	f.deltaBytes.Add(200)
	f.deltaEntries.Add(100)
	_, body = get(t, p, http.MethodGet, "/")
	for _, s := range []string{
		`Prediction error per response, in blocks (last 10.0 s)`,
		`data-pred-le="&#43;Inf" data-count="0"`, `data-pred-le="0.5" data-count="4"`, `data-pred-count="4"`,
		`data-pred-quantiles="0 0 &#43;0.4 &#43;0.5"`, // four exact ones: mean 0, quantiles interpolated within (-0.5, 0.5]
		`12 since start, 2 in the last 10.0 s`,
		`data-delta-per-block="5">5 <span class="muted">(2 in the last 10.0 s)</span>`, // 1000/200; 200/100
	} {
		if !strings.Contains(body, s) {
			t.Errorf("second view lacks %q", s)
		}
	}
}
