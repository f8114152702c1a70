package engine

import (
	"fmt"
	"testing"
)

// TestRestartedSince: a new start time is a restart and the same one is
// not, whatever the counters did; without one, most counters going down
// is, and a gauge typed as a counter going down alone is not.
func TestRestartedSince(t *testing.T) {
	page := func(s string) Uptime {
		t.Helper()
		f, err := ParseMetrics([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return ReadUptime(f)
	}
	const llama = `# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total %s
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total %s
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode %s
`
	fill := func(a, b, c string) string { return fmt.Sprintf(llama, a, b, c) }
	const started = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %s\n# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total %s\n"
	tests := []struct {
		name      string
		prev, cur string
		want      bool
	}{
		{"counters grew", fill("100", "50", "1.5"), fill("180", "70", "1.5"), false},
		{"busy slots ratio fell", fill("100", "50", "1.5"), fill("180", "70", "1.2"), false},
		{"counters reset", fill("100", "50", "1.5"), fill("12", "3", "1"), true},
		{"start time changed", fmt.Sprintf(started, "1700000000.5", "900"), fmt.Sprintf(started, "1700000300.25", "1000"), true},
		{"start time kept, counters fell", fmt.Sprintf(started, "1700000000.5", "900"), fmt.Sprintf(started, "1700000000.5", "10"), false},
		{"nothing published", "vllm:num_requests_running 1\n", "vllm:num_requests_running 0\n", false},
	}
	for _, tc := range tests {
		if got := page(tc.cur).RestartedSince(page(tc.prev)); got != tc.want {
			t.Errorf("%s: restarted %v, want %v", tc.name, got, tc.want)
		}
	}
	if page("vllm:num_requests_running 1\n").Known() {
		t.Error("a page without start time or counters tells restarts")
	}
}

// TestProgress: every engine's recorded page publishes progress
// counters (TGI's batches, not its token histogram), a page without any
// does not, and each kind of work moves the sum alone: prompt tokens
// counted when a prefill completes move it with no token generated.
func TestProgress(t *testing.T) {
	for _, name := range []string{"vllm.metrics.txt", "sglang.metrics.txt", "llamacpp.metrics.txt", "llamacpp-b11312.metrics.txt", "tgi.metrics.txt"} {
		f, err := ParseMetrics(readPage(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := ReadUptime(f).Progress(); !ok || v <= 0 {
			t.Errorf("%s: progress %v, %v; want a positive sum", name, v, ok)
		}
	}
	page := func(s string) Uptime {
		t.Helper()
		f, err := ParseMetrics([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return ReadUptime(f)
	}
	if _, ok := page("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n").Progress(); ok {
		t.Error("progress from a page without progress counters")
	}
	const vllm = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total %d\n# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total %d\n"
	a, _ := page(fmt.Sprintf(vllm, 100, 50)).Progress()
	b, _ := page(fmt.Sprintf(vllm, 4196, 50)).Progress()
	if a == b {
		t.Error("a completed prefill (prompt tokens only) did not move progress")
	}
}
