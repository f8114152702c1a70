package health

import (
	"fmt"
	"testing"
	"time"
)

// TestHealthCheckerCountsRestarts: a new process start time on the
// engine's /metrics is a restart; so are counters set back; an engine
// whose metrics tell neither is taken for restarted at each re-admission
// after an ejection, and one whose metrics show the same process is not.
func TestHealthCheckerCountsRestarts(t *testing.T) {
	const started = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %v\n"
	const counted = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total %v\n# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total %v\n"
	tests := []struct {
		name string
		// pages are the engine's /metrics, one per step (beyond the
		// load gauges); a "" step fails the replica's checks.
		pages []string
		want  int
	}{
		{"start time changed", []string{fmt.Sprintf(started, 1.7e9), fmt.Sprintf(started, 1.7e9), fmt.Sprintf(started, 1.7e9+300)}, 1},
		{"start time kept over an ejection", []string{fmt.Sprintf(started, 1.7e9), "", "", fmt.Sprintf(started, 1.7e9)}, 0},
		{"start time changed over an ejection", []string{fmt.Sprintf(started, 1.7e9), "", "", fmt.Sprintf(started, 1.7e9+60)}, 1},
		{"counters grew over an ejection", []string{fmt.Sprintf(counted, 900, 300), "", "", fmt.Sprintf(counted, 950, 310)}, 0},
		{"counters set back", []string{fmt.Sprintf(counted, 900, 300), fmt.Sprintf(counted, 40, 8)}, 1},
		// The load gauges alone: no start time, no counters.
		{"nothing tells, ejected and re-admitted", []string{"\n", "", "", "\n"}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &engineReplica{}
			rep := newReplica(t, e.serve)
			var got reports
			h := New(Config{Timeout: 5 * time.Second, FailThreshold: 2, PassThreshold: 1}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
			for _, page := range tc.pages {
				e.mu.Lock()
				e.metrics = vllmMetrics + page
				e.mu.Unlock()
				e.failing.Store(page == "")
				h.round(t.Context())
			}
			c, _ := got.last(rep.URL)
			if !c.Healthy || c.Restarts != tc.want {
				t.Errorf("healthy %v, restarts %d; want healthy, %d", c.Healthy, c.Restarts, tc.want)
			}
		})
	}
}
