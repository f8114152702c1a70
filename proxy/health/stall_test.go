package health

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// vllmPage is a vLLM metrics page with its load and, when tokens >= 0,
// its generated-token counter.
func vllmPage(running, waiting int, tokens float64) string {
	s := fmt.Sprintf(vllmMetrics, running, waiting)
	if tokens >= 0 {
		s += fmt.Sprintf("# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} %v\n", tokens)
	}
	return s
}

// TestStallByTokenCounter: with a generated-token counter, Stall agrees
// only when the counter stood still since the requests went quiet (a
// long non-streamed answer generates without a byte; a change is dated
// at the scrape before the one that saw it), ejects the replica
// with reason "stalled", and re-admission counts only passes once the
// engine generates again.
func TestStallByTokenCounter(t *testing.T) {
	e := &engineReplica{metrics: vllmPage(2, 0, 100)}
	e.stuck.Store(true) // nor does it answer the probe
	rep := newReplica(t, e.serve)
	var got reports
	reg := prometheus.NewPedanticRegistry()
	h := New(Config{Timeout: 5 * time.Second, PassThreshold: 2}, []string{rep.URL}, nil, got.add, 1024, nil, reg)
	ctx := t.Context()
	h.round(ctx)
	h.round(ctx)
	healthy := func() bool { c, _ := got.last(rep.URL); return c.Healthy }
	if !healthy() {
		t.Fatal("not admitted")
	}
	setPage := func(s string) { e.mu.Lock(); e.metrics = s; e.mu.Unlock() }

	quiet := time.Now()
	h.round(ctx) // a scrape after the silence began
	setPage(vllmPage(2, 0, 150))
	h.round(ctx)
	if h.Stall(rep.URL, quiet, false) || !healthy() {
		t.Fatal("judged stalled while its engine generated")
	}
	// Tokens generated before the silence began and first seen by a
	// scrape after it (a frozen engine's last ones) are no progress in it.
	setPage(vllmPage(2, 0, 160))
	quiet = time.Now()
	h.round(ctx)
	h.round(ctx) // the counter stands still
	if !h.Stall(rep.URL, quiet, false) || healthy() {
		t.Fatal("not judged stalled with its counter still since the silence began")
	}
	if n := testutil.ToFloat64(h.ejections.WithLabelValues(ReasonStalled)); n != 1 {
		t.Errorf("ejections{stalled} = %v, want 1", n)
	}
	if !h.Stall(rep.URL, quiet, false) {
		t.Error("an ejected replica still stuck is no longer judged stalled (its requests would stay)")
	}
	for i := range 3 {
		h.round(ctx) // health passes, the engine still stuck with requests
		if healthy() {
			t.Fatalf("re-admitted at pass %d with its engine still stuck", i+1)
		}
	}
	setPage(vllmPage(2, 0, 170))
	h.round(ctx)
	if healthy() {
		t.Fatal("re-admitted at its first pass, PassThreshold 2")
	}
	h.round(ctx)
	if !healthy() {
		t.Fatal("not re-admitted after PassThreshold passes of an engine that generates again")
	}
	if n := testutil.ToFloat64(h.ejections.WithLabelValues(ReasonStalled)); n != 1 {
		t.Errorf("ejections{stalled} = %v, want 1", n)
	}
}

// TestStallWithoutTokenCounter: without a counter only a stream's
// silence is evidence, and an ejected replica counts its passes once its
// engine answers the probe's one-token completion, not because it runs
// nothing.
func TestStallWithoutTokenCounter(t *testing.T) {
	e := &engineReplica{metrics: vllmPage(2, 0, -1)}
	e.stuck.Store(true)
	rep := newReplica(t, e.serve)
	var got reports
	h := New(Config{Timeout: 5 * time.Second, PassThreshold: 2}, []string{rep.URL}, nil, got.add, 1024, nil, prometheus.NewPedanticRegistry())
	ctx := t.Context()
	h.round(ctx)
	healthy := func() bool { c, _ := got.last(rep.URL); return c.Healthy }
	quiet := time.Now().Add(-time.Minute)
	if h.Stall(rep.URL, quiet, false) || !healthy() {
		t.Fatal("non-streamed requests' silence alone judged a stall")
	}
	if !h.Stall(rep.URL, quiet, true) || healthy() {
		t.Fatal("a silent stream not judged a stall")
	}
	h.round(ctx)
	h.round(ctx)
	if healthy() {
		t.Fatal("re-admitted while its engine runs the requests it is stuck on")
	}
	e.mu.Lock()
	e.metrics = vllmPage(0, 0, -1)
	e.mu.Unlock()
	h.round(ctx)
	h.round(ctx)
	if healthy() {
		t.Fatal("re-admitted as it runs nothing, its engine still stuck")
	}
	if e.probes.Load() == 0 {
		t.Fatal("no probe asked of the stalled replica")
	}
	e.stuck.Store(false)
	h.round(ctx)
	h.round(ctx)
	if !healthy() {
		t.Fatal("not re-admitted after PassThreshold passes of an engine that answers the probe")
	}
	n := e.probes.Load()
	h.round(ctx)
	if e.probes.Load() != n {
		t.Error("a re-admitted replica still probed")
	}
	if h.Stall("http://unknown", quiet, true) {
		t.Error("an unknown replica judged stalled")
	}
}

// TestStallByPromptCounter: a prefill that completes moves the engine's
// prompt-token counter with no token generated yet (a queue of long
// prompts): that is progress, not a stall.
func TestStallByPromptCounter(t *testing.T) {
	page := func(prompt float64) string {
		return vllmPage(4, 0, 100) + fmt.Sprintf("# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} %v\n", prompt)
	}
	e := &engineReplica{metrics: page(1000)}
	rep := newReplica(t, e.serve)
	var got reports
	h := New(Config{Timeout: 5 * time.Second}, []string{rep.URL}, nil, got.add, 1024, nil, prometheus.NewPedanticRegistry())
	ctx := t.Context()
	h.round(ctx)
	h.round(ctx)
	quiet := time.Now()
	h.round(ctx)
	e.mu.Lock()
	e.metrics = page(5096)
	e.mu.Unlock()
	h.round(ctx)
	if h.Stall(rep.URL, quiet, true) {
		t.Fatal("judged stalled while its engine completed a prefill")
	}
	quiet = time.Now()
	h.round(ctx)
	if !h.Stall(rep.URL, quiet, true) {
		t.Fatal("not judged stalled with every counter still")
	}
}

// TestStallUnreadCounters: a replica whose progress counters no scrape
// read since its silence began (its metrics page too slow under load)
// is not judged stalled on that silence, until the silence outlasts
// unreadProgressLimit; a read that finds them still decides at once.
func TestStallUnreadCounters(t *testing.T) {
	e := &engineReplica{metrics: vllmPage(2, 0, 100)}
	e.stuck.Store(true)
	rep := newReplica(t, e.serve)
	var got reports
	h := New(Config{Timeout: 5 * time.Second, PassThreshold: 2}, []string{rep.URL}, nil, got.add, 1024, nil, prometheus.NewPedanticRegistry())
	ctx := t.Context()
	h.round(ctx)
	h.round(ctx)
	healthy := func() bool { c, _ := got.last(rep.URL); return c.Healthy }
	if !healthy() {
		t.Fatal("not admitted")
	}
	e.metricsFailing.Store(true)
	quiet := time.Now()
	h.round(ctx) // the scrape fails: nothing read since quiet
	if h.Stall(rep.URL, quiet, true) || !healthy() {
		t.Fatal("judged stalled with no read of its counters since the silence began")
	}
	if !h.Stall(rep.URL, quiet.Add(-unreadProgressLimit), true) || healthy() {
		t.Fatal("not judged stalled after a silence past the limit with its counters unread")
	}
}
