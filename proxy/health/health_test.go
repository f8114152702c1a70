package health

import (
	"context"
	"fmt"
	"github.com/kvmesh/kvmesh/route"
	"io"
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

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const vllmMetrics = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",engine="0"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} %d
vllm:num_requests_waiting{engine="0",model_name="m"} %d
`

// reports collects a checker's onChange calls.
type reports struct {
	mu   sync.Mutex
	byID map[string][]ReplicaStatus
}

func (r *reports) add(id string, s ReplicaStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string][]ReplicaStatus{}
	}
	r.byID[id] = append(r.byID[id], s)
}

// last returns id's last report and how many it had.
func (r *reports) last(id string) (ReplicaStatus, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byID[id]
	if len(l) == 0 {
		return ReplicaStatus{}, 0
	}
	return l[len(l)-1], len(l)
}

// engineReplica serves an engine's endpoints: /health, models and a
// metrics page with the current load.
type engineReplica struct {
	failing          atomic.Bool
	metricsFailing   atomic.Bool // /metrics alone answers 500
	stuck            atomic.Bool // POST /v1/completions answers 503 (the probe fails)
	probes           atomic.Int64
	mu               sync.Mutex
	metrics          string
	running, waiting int
}

func (e *engineReplica) set(running, waiting int) {
	e.mu.Lock()
	e.running, e.waiting = running, waiting
	e.mu.Unlock()
}

func (e *engineReplica) serve(w http.ResponseWriter, r *http.Request) {
	if e.failing.Load() {
		http.Error(w, "down", 500)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch r.URL.Path {
	case "/health":
		w.WriteHeader(200)
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m2"},{"id":"m1"}]}`)
	case "/v1/completions":
		e.probes.Add(1)
		if e.stuck.Load() {
			http.Error(w, "stuck", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"choices":[{"text":" pong"}]}`)
	case "/metrics":
		if e.metricsFailing.Load() {
			http.Error(w, "metrics down", 500)
			return
		}
		if strings.Contains(e.metrics, "%d") {
			fmt.Fprintf(w, e.metrics, e.running, e.waiting)
		} else {
			fmt.Fprint(w, e.metrics)
		}
	default:
		http.NotFound(w, r)
	}
}

func TestHealthCheckerEjectsAndReadmits(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	e.set(3, 1)
	rep := newReplica(t, e.serve)
	var got reports
	reg := prometheus.NewPedanticRegistry()
	h := New(Config{Timeout: 5 * time.Second, FailThreshold: 2, PassThreshold: 3}, []string{rep.URL}, nil,
		got.add, 1024, nil, reg)
	ctx := t.Context()
	healthyGauge := func() float64 { return testutil.ToFloat64(h.healthy.WithLabelValues(rep.URL)) }

	if h.Ready() {
		t.Fatal("ready before the first round")
	}
	h.round(ctx)
	// 2048 blocks × 16 tokens × 4 bytes / 1024 = 128 router blocks.
	want := ReplicaStatus{Models: []string{"m1", "m2"}, Healthy: true, CapacityBlocks: 128, Load: route.EngineLoad{Running: 3, Waiting: 1, HasLoad: true, Slots: 3}, Engine: "vllm"}
	if c, n := got.last(rep.URL); n != 1 || !c.Equal(want) {
		t.Fatalf("after first round: %+v (%d reports), want %+v", c, n, want)
	}
	if !h.Ready() || healthyGauge() != 1 {
		t.Fatal("not ready or not healthy after the first round")
	}
	h.round(ctx)
	if _, n := got.last(rep.URL); n != 1 {
		t.Fatal("onChange called without a change")
	}
	steps := []struct {
		fail        bool
		wantHealthy bool
	}{
		{true, true},   // one failure: still in
		{true, false},  // FailThreshold reached: ejected
		{true, false},  // stays out
		{false, false}, // one pass of three
		{false, false},
		{false, true}, // PassThreshold: re-admitted
	}
	for i, s := range steps {
		e.failing.Store(s.fail)
		h.round(ctx)
		if c, _ := got.last(rep.URL); c.Healthy != s.wantHealthy {
			t.Fatalf("step %d: healthy %v, want %v", i, c.Healthy, s.wantHealthy)
		}
		if want := map[bool]float64{true: 1, false: 0}[s.wantHealthy]; healthyGauge() != want {
			t.Fatalf("step %d: gauge %v", i, healthyGauge())
		}
	}
	// Admitted; its load unknown at the first failed scrape; ejected; its
	// load known again at the first pass; re-admitted.
	if _, n := got.last(rep.URL); n != 5 {
		t.Errorf("%d reports, want 5 (admitted, load unknown, ejected, load known, re-admitted)", n)
	}
	// Passive failures eject too.
	h.ReportFailure(rep.URL)
	h.ReportFailure(rep.URL)
	if c, _ := got.last(rep.URL); c.Healthy {
		t.Error("passive failures did not eject")
	}
	h.ReportFailure("http://unknown") // ignored
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestHealthCheckerAdmitsOnlyAfterAPass: a replica that fails from the
// start is never reported (so never declared); it is reported at its
// first pass.
func TestHealthCheckerAdmitsOnlyAfterAPass(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	e.failing.Store(true)
	rep := newReplica(t, e.serve)
	dead := deadAddr(t)
	var got reports
	h := New(Config{}, []string{dead, rep.URL}, nil, got.add, 1024, nil, nil)
	h.round(t.Context())
	h.ReportFailure(rep.URL)
	if _, n := got.last(dead); n != 0 {
		t.Errorf("unreachable replica reported")
	}
	if _, n := got.last(rep.URL); n != 0 {
		t.Errorf("failing replica reported")
	}
	if !h.Ready() {
		t.Error("not ready after a round")
	}
	e.failing.Store(false)
	h.round(t.Context())
	if c, n := got.last(rep.URL); n != 1 || !c.Healthy {
		t.Errorf("after its first pass: %+v (%d reports)", c, n)
	}
}

// TestHealthCheckerLearnsSlots: without a published limit, the slot count
// is the most sequences seen running while requests waited; until then
// MinSlots is the most seen running with nothing waiting; a published
// one wins.
func TestHealthCheckerLearnsSlots(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	rep := newReplica(t, e.serve)
	var got reports
	h := New(Config{}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	steps := []struct{ running, waiting, slots, minSlots int }{
		{2, 0, 0, 2}, // never queued: unknown, at least 2
		{1, 0, 0, 2}, // runs fewer: the bound stays
		{3, 0, 0, 3}, // runs more with nothing waiting: raised
		{4, 3, 4, 0}, // queued while running 4: known
		{3, 1, 4, 0}, // a full cache runs fewer for a while: kept
		{2, 0, 4, 0},
		{6, 0, 6, 0}, // runs more: raised
	}
	for i, s := range steps {
		e.set(s.running, s.waiting)
		h.round(t.Context())
		if c, _ := got.last(rep.URL); int(c.Load.Running) != s.running || int(c.Load.Waiting) != s.waiting || int(c.Load.Slots) != s.slots ||
			int(c.Load.MinSlots) != s.minSlots {
			t.Errorf("step %d: %+v, want running %d waiting %d slots %d min slots %d", i, c, s.running, s.waiting, s.slots, s.minSlots)
		}
	}

	// llama.cpp publishes its slots in /props.
	l, lrep := newLlamaCpp(t, 2)
	l.set(2, 5)
	h.SetReplicas([]string{lrep.URL})
	h.round(t.Context())
	// 2 slots × 1024 tokens × 4 bytes / 1024.
	want := ReplicaStatus{Models: []string{"m1", "m2"}, Healthy: true, CapacityBlocks: 8, Load: route.EngineLoad{Running: 2, Waiting: 5, HasLoad: true, Slots: 2}, Engine: "llamacpp"}
	if c, _ := got.last(lrep.URL); !c.Equal(want) {
		t.Errorf("llama.cpp: %+v, want %+v", c, want)
	}
}

// TestHealthCheckerHasLoad: a status says whether the engine's running
// and waiting counts are known. An engine whose /metrics lacks them, or
// whose scrape fails, reports them unknown (HasLoad false, both 0: not an
// idle engine), and known again once a scrape reads them; what else it
// published (slots, cache) and what it was seen running (MinSlots) stay.
func TestHealthCheckerHasLoad(t *testing.T) {
	noCounts := strings.Join(strings.Split(vllmMetrics, "\n")[:3], "\n") + "\n" // the cache config alone
	e := &engineReplica{metrics: noCounts}
	rep := newReplica(t, e.serve)
	var got reports
	h := New(Config{Engine: engine.VLLM}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	base := ReplicaStatus{Models: []string{"m1", "m2"}, Healthy: true, CapacityBlocks: 128, Engine: "vllm"}
	steps := []struct {
		name             string
		metrics          string
		failing          bool
		running, waiting int
		want             ReplicaStatus
	}{
		{"no counts published", noCounts, false, 0, 0, base},
		{"counts published", vllmMetrics, false, 2, 0, ReplicaStatus{Load: route.EngineLoad{Running: 2, HasLoad: true, MinSlots: 2}}},
		{"counts published, idle", vllmMetrics, false, 0, 0, ReplicaStatus{Load: route.EngineLoad{HasLoad: true, MinSlots: 2}}},
		{"the scrape fails", vllmMetrics, true, 3, 0, ReplicaStatus{Load: route.EngineLoad{MinSlots: 2}}},
		{"the scrape succeeds again", vllmMetrics, false, 3, 0, ReplicaStatus{Load: route.EngineLoad{Running: 3, HasLoad: true, MinSlots: 3}}},
		{"the counts go", noCounts, false, 3, 0, ReplicaStatus{Load: route.EngineLoad{MinSlots: 3}}},
	}
	for i, s := range steps {
		e.mu.Lock()
		e.metrics = s.metrics
		e.mu.Unlock()
		e.set(s.running, s.waiting)
		e.metricsFailing.Store(s.failing)
		h.round(t.Context())
		want := s.want
		want.Models, want.Healthy, want.CapacityBlocks, want.Engine = base.Models, true, base.CapacityBlocks, "vllm"
		if c, _ := got.last(rep.URL); !c.Equal(want) {
			t.Fatalf("step %d (%s): %+v, want %+v", i, s.name, c, want)
		}
	}
}

// TestHealthCheckerEngines: against each engine's recorded pages the
// checker picks the engine's adapter on its own and reports the page's
// load, slots and cache.
func TestHealthCheckerEngines(t *testing.T) {
	page := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", "internal", "engine", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tests := []struct {
		kind           engine.Kind
		metrics        string
		infoPath, info string
		want           ReplicaStatus
	}{
		{engine.VLLM, "vllm.metrics.txt", "", "",
			ReplicaStatus{Load: route.EngineLoad{Running: 3, Waiting: 2, Slots: 3, KVUsage: 4127}, CapacityBlocks: 27644 * 16 * 4 / 1024}},
		{engine.SGLang, "sglang.metrics.txt", "/get_server_info", "sglang.server_info.json",
			ReplicaStatus{Load: route.EngineLoad{Running: 12, Waiting: 5, Slots: 48, KVUsage: 2500}, CapacityBlocks: 489602 * 4 / 1024}},
		{engine.LlamaCpp, "llamacpp.metrics.txt", "/props", "llamacpp.props.json",
			ReplicaStatus{Load: route.EngineLoad{Running: 4, Waiting: 3, Slots: 4}, CapacityBlocks: 4 * 8192 * 4 / 1024}},
		{engine.LlamaCpp, "llamacpp-b11312.metrics.txt", "/props", "llamacpp-b11312.props.json", // captured from a real llama-server
			ReplicaStatus{Load: route.EngineLoad{Running: 4, Waiting: 2, Slots: 4}, CapacityBlocks: 4 * 4096 * 4 / 1024}},
		{engine.TGI, "tgi.metrics.txt", "/info", "tgi.info.json",
			ReplicaStatus{Load: route.EngineLoad{Running: 7, Waiting: 2, Slots: 7}, CapacityBlocks: 153104 * 4 / 1024}},
	}
	for _, tc := range tests {
		for _, cfgKind := range []engine.Kind{engine.Auto, tc.kind} {
			t.Run(tc.metrics+"/"+string(cfgKind), func(t *testing.T) {
				metrics := page(tc.metrics)
				info := ""
				if tc.info != "" {
					info = page(tc.info)
				}
				rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
					switch r.URL.Path {
					case "/health":
					case "/v1/models":
						fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
					case "/metrics":
						if a := r.Header.Get("Accept"); !strings.HasPrefix(a, "text/plain") {
							t.Errorf("metrics asked with Accept %q", a)
						}
						fmt.Fprint(w, metrics)
					case tc.infoPath:
						fmt.Fprint(w, info)
					default:
						http.NotFound(w, r)
					}
				})
				var got reports
				h := New(Config{Engine: cfgKind}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
				h.round(t.Context())
				want := tc.want
				want.Models, want.Healthy, want.Engine, want.Load.HasLoad = []string{"m"}, true, string(tc.kind), true
				if c, _ := got.last(rep.URL); !c.Equal(want) {
					t.Errorf("got %+v, want %+v", c, want)
				}
				if n := testutil.CollectAndCount(h.engineInfo); n != 1 {
					t.Errorf("%d engine info series, want 1", n)
				}
				if v := testutil.ToFloat64(h.engineInfo.WithLabelValues(rep.URL, string(tc.kind))); v != 1 {
					t.Errorf("kvmesh_replica_engine_info{engine=%q} = %v, want 1", tc.kind, v)
				}
				if k := h.Engine(rep.URL); k != tc.kind {
					t.Errorf("Engine = %q, want %q", k, tc.kind)
				}
				if k := h.Engine("http://elsewhere"); k != "" {
					t.Errorf("Engine of a replica not checked = %q, want none", k)
				}
			})
		}
	}
}

// TestHealthCheckerUnknownEngine: an OpenAI-compatible server with no
// known metrics (and no /health) is checked by its model list alone.
func TestHealthCheckerUnknownEngine(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
		case "/metrics":
			fmt.Fprint(w, "up 1\n")
		default:
			http.NotFound(w, r)
		}
	})
	var got reports
	h := New(Config{}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	h.round(t.Context())
	if c, n := got.last(rep.URL); n != 1 || !c.Healthy || c.Engine != "openai" || c.Load.Running != 0 || c.Load.HasLoad || c.CapacityBlocks != 0 {
		t.Errorf("got %+v (%d reports)", c, n)
	}
	if _, known := h.Engine(rep.URL).SharesQueuedPrefill(); known {
		t.Errorf("an unknown engine (%q) said to be known to share its queued prefill or not", h.Engine(rep.URL))
	}
	// A fixed engine whose health path is missing fails the check.
	var got2 reports
	h2 := New(Config{Engine: engine.VLLM}, []string{rep.URL}, nil, got2.add, 1024, nil, nil)
	h2.round(t.Context())
	if _, n := got2.last(rep.URL); n != 0 {
		t.Error("vllm replica without /health admitted")
	}
}

// TestHealthCheckerBoundsBodies: a replica answering more than the limits
// fails its check instead of filling the router's memory.
func TestHealthCheckerBoundsBodies(t *testing.T) {
	big := `{"data":[{"id":"` + strings.Repeat("m", maxModelsBytes) + `"}]}`
	for _, chunked := range []bool{false, true} {
		rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				if chunked {
					w.(http.Flusher).Flush() // no Content-Length
				}
				fmt.Fprint(w, big)
			}
		})
		var got reports
		h := New(Config{}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
		h.round(t.Context())
		if _, n := got.last(rep.URL); n != 0 {
			t.Errorf("chunked %v: oversized models list admitted", chunked)
		}
		_, err := h.get(t.Context(), rep.URL+"/v1/models", maxModelsBytes, "")
		if err == nil || !strings.Contains(err.Error(), "size limit") {
			t.Errorf("chunked %v: %v", chunked, err)
		}
	}
}

// TestHealthCheckerSetReplicas: replicas join and leave the checked set;
// a removed one is not polled or reported again, and its series go.
func TestHealthCheckerSetReplicas(t *testing.T) {
	ea, eb := &engineReplica{metrics: vllmMetrics}, &engineReplica{metrics: vllmMetrics}
	a, b := newReplica(t, ea.serve), newReplica(t, eb.serve)
	var got reports
	reg := prometheus.NewPedanticRegistry()
	h := New(Config{}, []string{a.URL}, nil, got.add, 1024, nil, reg)
	h.round(t.Context())
	h.SetReplicas([]string{a.URL, b.URL})
	if !slices.Equal(h.Replicas(), sorted(a.URL, b.URL)) {
		t.Fatalf("replicas %v", h.Replicas())
	}
	h.round(t.Context())
	if _, n := got.last(b.URL); n != 1 {
		t.Fatal("added replica not reported after its check")
	}
	h.SetReplicas([]string{b.URL})
	hits := a.count()
	ea.set(5, 5) // a change that would be reported
	h.round(t.Context())
	h.ReportFailure(a.URL)
	if a.count() != hits {
		t.Error("removed replica still polled")
	}
	if _, n := got.last(a.URL); n != 1 {
		t.Errorf("removed replica reported again (%d reports)", n)
	}
	if n := testutil.CollectAndCount(h.healthy); n != 1 {
		t.Errorf("%d healthy series, want 1", n)
	}
	if n := testutil.CollectAndCount(h.requests); n != 2 {
		t.Errorf("%d request series, want 2", n)
	}
	if n := testutil.CollectAndCount(h.engineInfo); n != 1 {
		t.Errorf("%d engine info series, want 1", n)
	}
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// TestHealthCheckerRunDynamic: under Run, a replica added later is
// checked and reported on its own, one removed stops, and Run returns
// once cancelled.
func TestHealthCheckerRunDynamic(t *testing.T) {
	ea, eb := &engineReplica{metrics: vllmMetrics}, &engineReplica{metrics: vllmMetrics}
	a, b := newReplica(t, ea.serve), newReplica(t, eb.serve)
	var got reports
	h := New(Config{Interval: 5 * time.Millisecond, LoadInterval: 5 * time.Millisecond}, []string{a.URL}, nil, got.add, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	waitFor(t, "the first replica", func() bool { _, n := got.last(a.URL); return n > 0 && h.Ready() })
	h.SetReplicas([]string{b.URL})
	waitFor(t, "the added replica", func() bool { _, n := got.last(b.URL); return n > 0 })
	eb.set(2, 0)
	waitFor(t, "the added replica's load", func() bool { c, _ := got.last(b.URL); return c.Load.Running == 2 })
	hits := a.count()
	eb.set(3, 0)
	waitFor(t, "another scrape", func() bool { c, _ := got.last(b.URL); return c.Load.Running == 3 })
	if a.count() != hits {
		t.Error("removed replica polled under Run")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestHealthCheckerPollPanicContained: a panic in one poll (here in the
// owner's callback; an adapter meeting metrics it did not expect would
// panic at the same place) is counted as where="health_check" and the
// replica's poller polls on: a later change is still reported.
func TestHealthCheckerPollPanicContained(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics}
	rep := newReplica(t, e.serve)
	rec := panics.New(nil, nil)
	var got reports
	var calls atomic.Int32
	onChange := func(id string, s ReplicaStatus) {
		if calls.Add(1) == 1 {
			panic("test: a bug in a poll")
		}
		got.add(id, s)
	}
	h := New(Config{Interval: 5 * time.Millisecond, LoadInterval: 5 * time.Millisecond, Panics: rec},
		[]string{rep.URL}, nil, onChange, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	waitFor(t, "the panic", func() bool { return testutil.ToFloat64(rec.Counter(panics.HealthCheck)) == 1 })
	e.set(4, 1)
	waitFor(t, "a report after the panic", func() bool { c, _ := got.last(rep.URL); return c.Load.Running == 4 })
	cancel()
	recv(t, done, "Run to return after cancel")
}

// TestHealthCheckerRunStops: Run checks at once and returns when its
// context ends.
func TestHealthCheckerRunStops(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"data":[{"id":"m"}]}`) })
	h := New(Config{Interval: time.Millisecond}, []string{rep.URL}, nil, nil, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	waitFor(t, "readiness", h.Ready)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// waitFor polls cond every 5ms for up to testWait (a liveness bound, not
// a speed assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testWait); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestHealthCheckerLearnsReplicaSimSlots: kvmesh's replica-sim publishes
// its running and waiting requests as vLLM does (and, like vLLM, no
// max_num_seqs); with more streams open than its --max-num-seqs the
// checker reads the queue and learns the limit.
func TestHealthCheckerLearnsReplicaSimSlots(t *testing.T) {
	sim, err := replicasim.New(replicasim.Config{MaxNumSeqs: 2, DecodeMsPerToken: 20}, hclog.NewNullLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	defer sim.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range 4 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"kvmesh-sim","max_tokens":2000,"stream":true,"messages":[{"role":"user","content":"stream %d"}]}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
			if resp, err := srv.Client().Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	var got reports
	h := New(Config{}, []string{srv.URL}, nil, got.add, 1024, nil, nil)
	waitFor(t, "the checker to see two running and two waiting", func() bool {
		h.round(t.Context())
		c, _ := got.last(srv.URL)
		return c.Load.Running == 2 && c.Load.Waiting == 2
	})
	if c, _ := got.last(srv.URL); c.Load.Slots != 2 || c.Engine != "vllm" || c.CapacityBlocks != 8192*16*4/1024 {
		t.Errorf("got %+v, want 2 learned slots from the vllm adapter", c)
	}
}

// TestHealthCheckerLoRA: a vLLM replica's recorded LoRA pages (the gauge
// and /v1/models' parents) become its report's LoRAs and its LoRA series;
// when its /metrics stops answering, the adapters in use are forgotten
// and the limit and base model stay.
func TestHealthCheckerLoRA(t *testing.T) {
	page := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", "internal", "engine", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	metrics, models := page("vllm-lora.metrics.txt"), page("vllm-lora.models.json")
	var failMetrics atomic.Bool
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			fmt.Fprint(w, models)
		case "/metrics":
			if failMetrics.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, metrics)
		default:
			http.NotFound(w, r)
		}
	})
	reg := prometheus.NewRegistry()
	var got reports
	h := New(Config{Engine: engine.VLLM}, []string{rep.URL}, nil, got.add, 1024, nil, reg)
	h.round(t.Context())
	c, _ := got.last(rep.URL)
	base := "meta-llama/Llama-3.1-8B-Instruct"
	want := route.MakeLoRAs(2, []string{base}, []string{"chat-lora", "sql-lora"}, []string{"sql-lora", "chat-lora"}, []string{"legal-lora"})
	if c.LoRA != want || len(c.Models) != 4 {
		t.Fatalf("report %+v, want LoRA %+v", c, want)
	}
	for _, s := range []struct {
		adapter, state string
	}{{"sql-lora", "loaded"}, {"chat-lora", "loaded"}, {"legal-lora", "waiting"}} {
		if v := testutil.ToFloat64(h.lora.adapters.WithLabelValues(rep.URL, s.adapter, s.state)); v != 1 {
			t.Errorf("kvmesh_replica_lora_adapters{%s,%s} = %v", s.adapter, s.state, v)
		}
	}
	if n := testutil.CollectAndCount(h.lora.adapters); n != 3 {
		t.Errorf("%d adapter series, want 3", n)
	}
	if v := testutil.ToFloat64(h.lora.max.WithLabelValues(rep.URL)); v != 2 {
		t.Errorf("kvmesh_replica_lora_max = %v", v)
	}
	failMetrics.Store(true)
	waitFor(t, "the failed scrape to forget the adapters in use", func() bool {
		h.round(t.Context())
		c, _ := got.last(rep.URL)
		return c.LoRA.Active == 0
	})
	c, _ = got.last(rep.URL)
	if c.LoRA.Max != 2 || c.LoRA.Fit(route.LoRAID(base)) != 0 || c.LoRA.Fit(route.LoRAID("sql-lora")) != route.LoRAAdapter|route.LoRARoom|route.LoRAFree {
		t.Errorf("after a failed scrape: %+v", c.LoRA)
	}
	if n := testutil.CollectAndCount(h.lora.adapters); n != 0 {
		t.Errorf("%d adapter series after the failed scrape, want 0", n)
	}
}
