package proxy

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const vllmMetrics = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",engine="0"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 0.0
`

type change struct {
	models   []string
	healthy  bool
	capacity int
}

func TestHealthCheckerEjectsAndReadmits(t *testing.T) {
	var failing atomic.Bool
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "down", 500)
			return
		}
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m2"},{"id":"m1"}]}`)
		case "/metrics":
			fmt.Fprint(w, vllmMetrics)
		}
	})
	var mu sync.Mutex
	var changes []change
	reg := prometheus.NewPedanticRegistry()
	h := NewHealthChecker(HealthConfig{Timeout: 5 * time.Second, FailThreshold: 2, PassThreshold: 3}, []string{rep.URL}, nil,
		func(id string, models []string, healthy bool, capacity int) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, change{models, healthy, capacity})
		}, 1024, nil, reg)
	ctx := t.Context()
	last := func() (change, int) {
		mu.Lock()
		defer mu.Unlock()
		return changes[len(changes)-1], len(changes)
	}
	healthyGauge := func() float64 { return testutil.ToFloat64(h.healthy.WithLabelValues(rep.URL)) }

	if h.Ready() {
		t.Fatal("ready before the first round")
	}
	h.round(ctx)
	// 2048 blocks × 16 tokens × 4 bytes / 1024 = 128 router blocks.
	if c, n := last(); n != 1 || !c.healthy || !slices.Equal(c.models, []string{"m1", "m2"}) || c.capacity != 128 {
		t.Fatalf("after first round: %+v (%d changes)", c, n)
	}
	if !h.Ready() || healthyGauge() != 1 {
		t.Fatal("not ready or not healthy after the first round")
	}
	h.round(ctx)
	if _, n := last(); n != 1 {
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
		failing.Store(s.fail)
		h.round(ctx)
		if c, _ := last(); c.healthy != s.wantHealthy {
			t.Fatalf("step %d: healthy %v, want %v", i, c.healthy, s.wantHealthy)
		}
		if want := map[bool]float64{true: 1, false: 0}[s.wantHealthy]; healthyGauge() != want {
			t.Fatalf("step %d: gauge %v", i, healthyGauge())
		}
	}
	if _, n := last(); n != 3 {
		t.Errorf("%d changes, want 3 (admitted, ejected, re-admitted)", n)
	}
	// Passive failures eject too.
	h.ReportFailure(rep.URL)
	h.ReportFailure(rep.URL)
	if c, _ := last(); c.healthy {
		t.Error("passive failures did not eject")
	}
	h.ReportFailure("http://unknown") // ignored
}

func TestHealthCheckerUnreachableAtStart(t *testing.T) {
	dead := deadAddr(t)
	var got []change
	h := NewHealthChecker(HealthConfig{}, []string{dead}, nil, func(id string, models []string, healthy bool, capacity int) {
		got = append(got, change{models, healthy, capacity})
	}, 1024, nil, nil)
	h.round(t.Context())
	if len(got) != 1 || got[0].healthy {
		t.Fatalf("changes %+v, want one unhealthy report", got)
	}
}

func TestHealthCheckerRunStops(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"data":[{"id":"m"}]}`) })
	h := NewHealthChecker(HealthConfig{Interval: time.Millisecond}, []string{rep.URL}, nil, nil, 1024, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	for !h.Ready() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

func TestParseCacheConfig(t *testing.T) {
	tests := []struct {
		name   string
		text   string
		bs, nb int64
		ok     bool
	}{
		{"vllm", vllmMetrics, 16, 2048, true},
		{"escaped label first", `vllm:cache_config_info{a="x\"}y",block_size="32",num_gpu_blocks="10"} 1` + "\n", 32, 10, true},
		{"not initialised", `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1`, 0, 0, false},
		{"absent", "other_metric 1\n", 0, 0, false},
		{"truncated", `vllm:cache_config_info{block_size="16",num_gpu_bl`, 0, 0, false},
		{"negative", `vllm:cache_config_info{block_size="-16",num_gpu_blocks="10"} 1`, 0, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs, nb, ok := parseCacheConfig([]byte(tc.text))
			if bs != tc.bs || nb != tc.nb || ok != tc.ok {
				t.Errorf("got %d %d %v", bs, nb, ok)
			}
		})
	}
}

func FuzzParseCacheConfig(f *testing.F) {
	f.Add([]byte(vllmMetrics))
	f.Fuzz(func(t *testing.T, b []byte) { parseCacheConfig(b) })
}
