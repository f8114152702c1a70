package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// loadView is a fakeView whose replicas publish their slots and count
// the requests the proxy begins there, as the mesh does for owned
// replicas.
type loadView struct {
	*fakeView
	slots    int
	mu       sync.Mutex
	inFlight map[string]int
}

func (v *loadView) PooledCandidates(model string) ([]route.Candidate, func()) {
	cands := v.fakeView.Candidates(model, nil)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range cands {
		cands[i].InFlight = route.Count32(v.inFlight[cands[i].ID()])
		cands[i].Slots = route.Count32(v.slots)
	}
	return cands, func() {}
}

func (v *loadView) Begin(id string, prefill float64) (func(), func()) {
	v.mu.Lock()
	v.inFlight[id]++
	v.mu.Unlock()
	var once sync.Once
	return func() {}, func() {
		once.Do(func() {
			v.mu.Lock()
			v.inFlight[id]--
			v.mu.Unlock()
		})
	}
}

// newGatedReplica answers a request only once the test opens log's
// gate, and records the class of each request it received (the first
// word of its message: the router's own headers do not go upstream).
func newGatedReplica(t *testing.T, log *gatedLog) *replicaServer {
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, content, _ := strings.Cut(string(b), `"content":"`)
		class, _, _ := strings.Cut(content, " ")
		log.add(class)
		select {
		case <-log.gate:
		case <-r.Context().Done():
			return
		}
		jsonChat(w, "ok", 0)
	})
}

// gatedLog is what the gated replicas share: the gate and the order in
// which requests reached any of them.
type gatedLog struct {
	gate chan struct{}
	mu   sync.Mutex
	seen []string
}

func (l *gatedLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, s)
}

func (l *gatedLog) arrived() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

type classAnswer struct {
	class  string
	status int
	retry  string
	body   string
}

// TestAdmissionOverload: a replica of 4 slots and a router that lets it
// queue 2 more (6 in flight) while it is stuck: a burst of
// high requests (by header or by the body's priority) and low ones
// queues at the router; the low ones, with a short
// queue deadline, are all shed with 429/503, Retry-After and an OpenAI
// error while the replica still holds the first 6; once it moves, every
// high request is served, all before any later request, and
// the queue is empty.
func TestAdmissionOverload(t *testing.T) {
	log := &gatedLog{gate: make(chan struct{})}
	// One replica: with two, the decision may place the first 6 unevenly
	// and leave a slot free on one, which a low request may rightly take.
	r1 := newGatedReplica(t, log)
	view := &loadView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: r1.URL}), slots: 4, inFlight: map[string]int{}}
	p, srv, reg := newTestProxy(t, view, func(c *Config) {
		c.Admission = &admit.Config{MaxWaiting: 2, MaxQueue: 12, Timeout: testWait}
	})
	out := make(chan classAnswer, 64)
	send := func(class, timeout string, i int) {
		body := chatBody("m", false, class+" request "+strconv.Itoa(i))
		if class == "high" && i%2 == 0 {
			// vLLM's priority field instead of the header.
			body = `{"priority":-1,` + body[1:]
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if class != "high" || i%2 == 1 {
			req.Header.Set(admit.HeaderPriority, class)
		}
		req.Header.Set(admit.HeaderTenant, "tenant-"+strconv.Itoa(i%3))
		if timeout != "" {
			req.Header.Set(admit.HeaderQueueTimeout, timeout)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- classAnswer{class: class, status: -1, body: err.Error()}
			return
		}
		out <- classAnswer{class, resp.StatusCode, resp.Header.Get("Retry-After"), readAll(t, resp)}
	}
	for i := range 6 {
		go send("normal", "", i)
	}
	waitFor(t, "6 requests at the replica", func() bool { return len(log.arrived()) == 6 })
	for i := range 10 {
		go send("low", "50ms", i)
		go send("high", "", i)
	}
	// The replica holds its 6: each low request leaves the queue by its
	// deadline (or is displaced), answered.
	for got := 0; got < 10; {
		a := recv(t, out, "an answer to a low request")
		if a.class != "low" {
			t.Fatalf("a %s request was answered (%d %s) while the replica was stuck", a.class, a.status, a.body)
		}
		if a.status != http.StatusServiceUnavailable && a.status != http.StatusTooManyRequests {
			t.Fatalf("low request: %d %s, want 429 or 503", a.status, a.body)
		}
		if n, err := strconv.Atoi(a.retry); err != nil || n < 1 {
			t.Errorf("low request shed with Retry-After %q", a.retry)
		}
		var e apiError
		if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Error.Message == "" {
			t.Errorf("low request's body %q is not an OpenAI error", a.body)
		}
		got++
	}
	// The lows can all be answered before the last high request reaches
	// the router (a loaded machine schedules the senders late).
	waitFor(t, "the 10 high requests queued", func() bool {
		return p.admit.depth() == [admit.NumClasses]int{10, 0, 0}
	})
	if n := len(log.arrived()); n != 6 {
		t.Fatalf("%d requests reached the replica, want the first 6 only", n)
	}
	close(log.gate)
	for range 16 {
		if a := recv(t, out, "an answer"); a.status != http.StatusOK {
			t.Errorf("%s request: %d %s, want 200", a.class, a.status, a.body)
		}
	}
	for i, c := range log.arrived()[6:] {
		if c != "high" {
			t.Errorf("request %d at the replica is %q, want high", i+6, c)
		}
	}
	waitCounted(t, p, epChat, 26)
	if d := p.admit.depth(); d != [admit.NumClasses]int{} {
		t.Errorf("queue %v after the burst, want empty", d)
	}
	if got := metricValue(t, reg, "kvmesh_admission_admitted_total", "high", "queued"); got != 10 {
		t.Errorf("high admitted after queueing = %v, want 10", got)
	}
	if got := metricValue(t, reg, "kvmesh_admission_queue_depth", "high"); got != 0 {
		t.Errorf("high queue depth gauge = %v after the burst, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kvmesh_admission_shed_total"); err != nil || n == 0 {
		t.Errorf("no kvmesh_admission_shed_total series (%v)", err)
	}
}

// metricValue is the value of the series of name whose label values are
// values (in the labels' order), 0 when absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(values) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != values[i] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
