package proxy

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/internal/metricsum"
	"github.com/kvmesh/kvmesh/proxy/health"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"io"
)

// metricSum sums the counters of family name (those with a label of
// value label, when not "").
func metricSum(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	return metricsum.Counter(t, g, name, metricsum.AnyValue(label))
}

func readBody(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// drop removes the fake view's replicas (a health change).
func (v *fakeView) drop(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.replicas = slices.DeleteFunc(v.replicas, func(r fakeReplica) bool { return r.id == id })
}

// TestStalledReplicaEjected: a replica that answers its health checks but
// never answers a request (a wedged engine) is ejected as stalled by the
// health checker, the requests in flight there are retried on the
// healthy replica (nothing of them reached their clients), and the next
// request goes to the healthy one. The window is short and the test's
// deadlines generous: it asserts outcomes, not durations.
func TestStalledReplicaEjected(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	models := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
	}
	// posts: the wedged replica's chat requests, the router's (its count
	// has the checks too, and the health checker's probe of an ejected
	// replica is a POST to /v1/completions).
	var posts atomic.Int64
	wedged := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			models(w)
			return
		}
		if r.URL.Path == "/v1/chat/completions" {
			posts.Add(1)
		}
		select { // accepts, sends nothing
		case <-r.Context().Done():
		case <-release:
		}
	})
	good := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			models(w)
			return
		}
		if strings.Contains(readBody(r), `"stream":true`) {
			sseChat(w, []string{"fine"}, -1)
			return
		}
		jsonChat(w, "fine", 0)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: wedged.URL, match: 1 << 20}, fakeReplica{id: good.URL})
	var mu sync.Mutex
	ejected := map[string]bool{}
	hreg := prometheus.NewPedanticRegistry()
	hc := health.New(health.Config{Interval: 20 * time.Millisecond, LoadInterval: 20 * time.Millisecond, Engine: engine.Generic},
		[]string{wedged.URL, good.URL}, nil, func(id string, s health.ReplicaStatus) {
			if !s.Healthy {
				mu.Lock()
				ejected[id] = true
				mu.Unlock()
				view.drop(id)
			}
		}, 64, nil, hreg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { hc.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "both replicas checked", hc.Ready)

	p, srv, reg := newTestProxy(t, view, func(c *Config) {
		c.StallWindow = 200 * time.Millisecond
		c.Stalled = hc.Stall
		c.ReportFailure = hc.ReportFailure
	})
	// The wedged replica never answers, so the router has no prefill
	// rate to expect its first prefill by (unmeasuredPrefill, a minute):
	// here the window alone stands for it.
	p.stalls.mu.Lock()
	p.stalls.unmeasured = 0
	p.stalls.mu.Unlock()
	const n = 4
	codes := make(chan string, n)
	var clients sync.WaitGroup
	for i := range n {
		clients.Go(func() {
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", i%2 == 0, "the same long prompt "+strings.Repeat("x", 400)))
			codes <- resp.Status + " " + readAll(t, resp)
		})
	}
	waitGroup(t, &clients, "the requests in flight at the stalled replica")
	close(codes)
	for c := range codes {
		if !strings.HasPrefix(c, "200") || !strings.Contains(c, "fine") {
			t.Errorf("a request in flight at the stalled replica got %q, want 200 from the healthy one", c)
		}
	}
	if posts.Load() == 0 {
		t.Fatal("no request went to the wedged replica: the test tests nothing")
	}
	mu.Lock()
	if !ejected[wedged.URL] || ejected[good.URL] {
		t.Errorf("ejected %v, want only the wedged replica", ejected)
	}
	mu.Unlock()
	if got := metricSum(t, hreg, "kvmesh_replica_ejections_total", "stalled"); got < 1 {
		t.Errorf("kvmesh_replica_ejections_total{reason=stalled} = %v, want ≥ 1", got)
	}
	if got := metricSum(t, reg, "kvmesh_stalled_requests_total", ""); got < 1 {
		t.Errorf("kvmesh_stalled_requests_total = %v, want ≥ 1", got)
	}
	before := posts.Load()
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", true, "the same long prompt "+strings.Repeat("x", 400)))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "fine") {
		t.Errorf("after the ejection: %d %q, want 200 from the healthy replica", resp.StatusCode, body)
	}
	if posts.Load() != before {
		t.Error("a request went to the ejected replica")
	}
}

// TestStalledMidStream: a replica that stops in the middle of a stream
// is judged stalled and the stream, begun for its client, ends with an
// OpenAI-shaped error event (not retried: the client has part of an
// answer).
func TestStalledMidStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	stuck := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	other := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"fine"}, -1) })
	view := newFakeView([]string{"m"}, fakeReplica{id: stuck.URL, match: 1 << 20}, fakeReplica{id: other.URL})
	judged := make(chan string, 4)
	_, srv, reg := newTestProxy(t, view, func(c *Config) {
		c.StallWindow = 200 * time.Millisecond
		c.Stalled = func(id string, quiet time.Time, streamed bool) bool {
			if !streamed {
				t.Errorf("a stream judged as not streamed")
			}
			judged <- id
			return true
		}
	})
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", true, "a prompt "+strings.Repeat("y", 400)))
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, "half") || !strings.Contains(body, `"error"`) || !strings.Contains(body, "stopped progressing") {
		t.Errorf("got %d %q, want the stream's start and an error event", resp.StatusCode, body)
	}
	if strings.Contains(body, "[DONE]") || other.count() != 0 {
		t.Error("a begun stream was completed or retried")
	}
	if id := recv(t, judged, "the stall judged"); id != stuck.URL {
		t.Errorf("judged %s, want the stuck replica", id)
	}
	if got := metricSum(t, reg, "kvmesh_upstream_midstream_failures_total", "stalled"); got != 1 {
		t.Errorf("midstream failures{cause=stalled} = %v, want 1", got)
	}
}

// TestStallBookQuiet: the book's judgement on a fake clock. Requests
// sent to a silent replica are no progress of it (steady arrivals do not
// hide a stall), a request ending is, a relay writing to its client is
// not judged, and a cut ends every request there through its
// cancellation.
func TestStallBookQuiet(t *testing.T) {
	now := time.Unix(1000, 0)
	var judged []time.Time
	cuts := 0
	b := &stallBook{window: 8 * time.Second, now: func() time.Time { return now },
		judge: func(id string, quiet time.Time, streamed bool) bool { judged = append(judged, quiet); return true },
		cut:   func(id string, n int) { cuts += n },
		runs:  map[string]map[*stallMark]struct{}{}, progress: map[string]time.Time{}, rates: map[string]float64{"r": 0}, noted: map[string]notedSilence{}}
	cancelled := 0
	cancel := func() { cancelled++ }
	start := now
	first := b.add("r", true, 0, cancel)
	var marks []*stallMark
	for range 7 { // one more request every second
		now = now.Add(time.Second)
		marks = append(marks, b.add("r", false, 0, cancel))
		b.check()
	}
	if len(judged) != 0 {
		t.Fatalf("judged after %v of silence, window 8s", now.Sub(start))
	}
	now = now.Add(time.Second)
	b.check()
	if len(judged) != 1 || !judged[0].Equal(start) {
		t.Fatalf("judged %v, want once, quiet since the first request was sent (%v)", judged, start)
	}
	if cancelled != 8 || cuts != 8 || !first.wasStalled() || !marks[6].wasStalled() {
		t.Errorf("cancelled %d, cut %d, want all 8 requests", cancelled, cuts)
	}
	for _, m := range append(marks, first) {
		b.remove(m)
	}
	if len(b.runs) != 0 || len(b.progress) != 0 {
		t.Fatalf("the book kept %v %v after every request ended", b.runs, b.progress)
	}

	// A request ending is progress; a relay writing to its client is not
	// judged at all.
	judged = nil
	a, c := b.add("r", false, 0, cancel), b.add("r", false, 0, cancel)
	now = now.Add(6 * time.Second)
	b.remove(c)
	now = now.Add(6 * time.Second)
	b.check()
	if len(judged) != 0 {
		t.Fatal("judged 6s after a request there ended, window 8s")
	}
	a.heard.Store(true) // headers came and no watch: not judged
	now = now.Add(time.Minute)
	b.check()
	if len(judged) != 0 {
		t.Fatal("judged a request whose silence nothing measures")
	}
	b.remove(a)
}

// testBook is a stall book on a fake clock, with no loop: the test calls
// check. It records what it judged and the outcomes it noted.
type testBook struct {
	*stallBook
	now     time.Time
	judged  []string
	outcome []string
	stalled bool // the judge's verdict
}

func newTestBook(window time.Duration) *testBook {
	tb := &testBook{now: time.Unix(1000, 0), stalled: true}
	tb.stallBook = &stallBook{window: window, now: func() time.Time { return tb.now },
		judge: func(id string, quiet time.Time, streamed bool) bool {
			tb.judged = append(tb.judged, id)
			return tb.stalled
		},
		cut: func(string, int) {}, note: func(_, o string, _ time.Duration) { tb.outcome = append(tb.outcome, o) },
		runs: map[string]map[*stallMark]struct{}{}, progress: map[string]time.Time{}, rates: map[string]float64{}, noted: map[string]notedSilence{},
		unmeasured: unmeasuredPrefill}
	return tb
}

func (tb *testBook) advance(d time.Duration) { tb.now = tb.now.Add(d); tb.check() }

// TestStallBookExpectsPrefill: a replica whose requests wait for their
// first byte is allowed the window plus twice, at the rate learned from
// its earlier first bytes, the prefill it owes them and one block for
// the step under way; requests sent once the silence has lasted a window
// add nothing; a replica never timed borrows the router's other
// replicas' rate, and with none at all is allowed unmeasuredPrefill.
func TestStallBookExpectsPrefill(t *testing.T) {
	tb := newTestBook(8 * time.Second)
	// Learn r's rate: a 10-block request answered after 5 s of silence.
	m := tb.add("r", true, 10, nil)
	tb.now = tb.now.Add(5 * time.Second)
	tb.answer(m)
	if ms, ok := tb.rate("r"); !ok || ms != 500 {
		t.Fatalf("rate %v %v, want 500 ms per block", ms, ok)
	}
	tb.remove(m)

	// 30 blocks waiting, and 9 more sent within the window: 8 s + 2 × (39
	// + 1) × 0.5 s = 48 s.
	tb.add("r", true, 30, nil)
	for i := range 46 {
		tb.advance(time.Second)
		switch {
		case i < 3:
			tb.add("r", false, 3, nil) // within the window: owed
		case i > 8:
			tb.add("r", false, 100, nil) // later: queued behind the silence
		}
	}
	if len(tb.judged) != 0 {
		t.Fatalf("judged after 46 s; it owes 40 blocks of 0.5 s twice and the 8 s window")
	}
	if len(tb.outcome) != 1 || tb.outcome[0] != stallPrefilling {
		t.Errorf("outcomes %v, want one prefilling for the silence", tb.outcome)
	}
	tb.advance(2 * time.Second)
	if len(tb.judged) != 1 || tb.judged[0] != "r" {
		t.Fatalf("judged %v after 48 s, want r", tb.judged)
	}
	if len(tb.outcome) != 2 || tb.outcome[1] != stallStalled {
		t.Errorf("outcomes %v, want prefilling then stalled", tb.outcome)
	}

	// A replica never timed here borrows r's rate.
	tb.judged = nil
	tb.add("s", true, 4, nil) // 8 s + 2 × (4 + 1) × 0.5 s = 13 s
	tb.advance(12 * time.Second)
	if slices.Contains(tb.judged, "s") {
		t.Fatal("s judged within the prefill borrowed from r")
	}
	tb.advance(time.Second)
	if !slices.Contains(tb.judged, "s") {
		t.Fatal("s not judged past the prefill borrowed from r")
	}

	// With no rate at all: unmeasuredPrefill.
	nb := newTestBook(8 * time.Second)
	nb.add("x", true, 1, nil)
	nb.advance(8*time.Second + unmeasuredPrefill - time.Second)
	if len(nb.judged) != 0 {
		t.Fatal("an unmeasured replica judged within unmeasuredPrefill")
	}
	nb.advance(time.Second)
	if len(nb.judged) != 1 {
		t.Fatal("an unmeasured replica not judged past unmeasuredPrefill")
	}
}

// TestStallBookMidStream: a replica whose requests all had their first
// byte owes no prefill, only the step under way: it is judged after the
// window and one block's time twice (on a fast engine, the window), and
// a judge that finds the engine progressing is counted as such, once a
// silence.
func TestStallBookMidStream(t *testing.T) {
	tb := newTestBook(8 * time.Second)
	tb.rates["r"] = 3000 // a slow engine: 3 s a block
	m := tb.add("r", true, 50, nil)
	tb.answer(m)
	tb.stalled = false
	tb.advance(13 * time.Second)
	if len(tb.judged) != 0 {
		t.Fatalf("judged %v within the window and a step of 6 s", tb.judged)
	}
	tb.advance(time.Second)
	if len(tb.judged) != 1 {
		t.Fatalf("judged %v past the window and a step", tb.judged)
	}
	tb.advance(time.Second) // asked again, the same silence: counted once
	if len(tb.outcome) != 2 || tb.outcome[0] != stallPrefilling || tb.outcome[1] != stallProgressing {
		t.Errorf("outcomes %v, want prefilling (the step) then progressing", tb.outcome)
	}
	fast := newTestBook(8 * time.Second)
	fast.rates["r"] = 20
	f := fast.add("r", true, 50, nil)
	fast.answer(f)
	fast.advance(8*time.Second + 40*time.Millisecond)
	if len(fast.judged) != 1 {
		t.Fatalf("a fast engine judged %v after the window", fast.judged)
	}
}

// TestStallHeadersAreNoProgress: response headers without a body byte
// (vLLM sends a stream's at once) do not move the replica's progress, so
// a stream of arrivals whose headers come at once does not hide a
// stall; a body byte does.
func TestStallHeadersAreNoProgress(t *testing.T) {
	tb := newTestBook(8 * time.Second)
	tb.rates["r"] = 0
	var watches []*upstream.IdleWatch
	defer func() {
		for _, w := range watches {
			w.Stop()
		}
	}()
	for range 9 {
		m := tb.add("r", true, 1, nil)
		w := upstream.WatchIdle(nil, func() {}, time.Hour)
		watches = append(watches, w)
		w.Saw() // the relay waits for the body from now
		m.headers(w)
		tb.advance(time.Second)
	}
	if !slices.Contains(tb.judged, "r") {
		t.Fatalf("judged %v: headers hid the stall", tb.judged)
	}
	tb.judged = nil
	m := tb.add("q", true, 1, nil)
	w := upstream.WatchIdle(nil, func() {}, time.Hour)
	watches = append(watches, w)
	m.headers(w)
	tb.advance(7 * time.Second)
	w.Heard() // a body byte, stamped by the relay's clock (now)
	w.Saw()
	tb.advance(7 * time.Second)
	if slices.Contains(tb.judged, "q") {
		t.Fatal("judged 14 s after its first request, 7 s after a body byte")
	}
}
