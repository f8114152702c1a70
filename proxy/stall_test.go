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
	"github.com/kvmesh/kvmesh/proxy/health"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"io"
)

// metricSum sums the counters of family name (those with a label of
// value label, when not "").
func metricSum(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == label }) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
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
	var posts atomic.Int64 // the wedged replica's requests (its count has the checks too)
	wedged := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			models(w)
			return
		}
		posts.Add(1)
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

	_, srv, reg := newTestProxy(t, view, func(c *Config) {
		c.StallWindow = 200 * time.Millisecond
		c.Stalled = hc.Stall
		c.ReportFailure = hc.ReportFailure
	})
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
		runs:  map[string]map[*stallMark]struct{}{}, progress: map[string]time.Time{}}
	cancelled := 0
	cancel := func() { cancelled++ }
	start := now
	first := b.add("r", true, cancel)
	var marks []*stallMark
	for range 7 { // one more request every second
		now = now.Add(time.Second)
		marks = append(marks, b.add("r", false, cancel))
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
	a, c := b.add("r", false, cancel), b.add("r", false, cancel)
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
