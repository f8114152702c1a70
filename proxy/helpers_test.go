package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/deadaddr"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testContract has small blocks so short test prompts span many.
var testContract = summary.Contract{BlockBytes: 16, Seed: 7}

// testWait bounds every wait of these tests (a channel, a WaitGroup, a
// poll, a client's request): a liveness bound, never a speed assertion.
// Under a parallel `go test -race ./...` on two cores a wait of
// milliseconds can take seconds; past the bound a test fails saying what
// it waited for, where an unbounded wait hung the binary to its timeout.
const testWait = 60 * time.Second

// TestMain bounds the requests the tests send through net/http's default
// client (http.Get, http.Post, post): a proxy that never answers fails the
// test instead of hanging it.
func TestMain(m *testing.M) {
	http.DefaultClient.Timeout = testWait
	os.Exit(m.Run())
}

// recv receives from ch within testWait.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// waitGroup waits for wg within testWait.
func waitGroup(t testing.TB, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done, what)
}

// fixedMatch is a summary that claims the same prefix match for any request.
type fixedMatch int

func (m fixedMatch) Match(p []summary.Probe) int { return min(int(m), len(p)) }

// fakeReplica is one replica as the fake view describes it.
type fakeReplica struct {
	id       string
	owner    string // "" for local
	match    int    // the prefix match its summary claims
	inFlight int
	pending  float64 // queued prefill blocks
	slots    int     // the engine's sequence slots (0: unknown)
	seqMs    float64 // a sequence's mean time in a slot (0: unknown)
	role     route.Role
	boot     uint16 // a prefill replica's bootstrap port
}

// fakeView is a View over a fixed set of replicas that records what the
// proxy tells it.
type fakeView struct {
	mu       sync.Mutex
	replicas []fakeReplica
	models   []string
	records  map[string][][]uint64
	forgets  map[string][][]uint64
	begins   map[string]int
	dones    chan string
}

func newFakeView(models []string, rs ...fakeReplica) *fakeView {
	return &fakeView{replicas: rs, models: models, records: map[string][][]uint64{}, forgets: map[string][][]uint64{}, begins: map[string]int{}, dones: make(chan string, 64)}
}

func (v *fakeView) Candidates(model string, dst []route.Candidate) []route.Candidate {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, r := range v.replicas {
		// Local as the mesh sets it (the proxy books by it): the
		// replicas this router owns.
		c := route.Candidate{Detail: &route.Detail{ID: r.id, Local: r.owner == ""}, Hash: route.HashID(r.id),
			InFlight: route.Count32(r.inFlight), PendingPrefillBlocks: r.pending, EngineLoad: route.EngineLoad{Slots: route.Count32(r.slots)}}
		c.Detail.SeqMs, c.Detail.Bootstrap, c.Role = r.seqMs, r.boot, r.role
		c.Summary = fixedMatch(r.match)
		dst = append(dst, c)
	}
	return dst
}

// PooledCandidates lends what Candidates returns; nothing is pooled.
func (v *fakeView) PooledCandidates(model string) ([]route.Candidate, func()) {
	return v.Candidates(model, nil), func() {}
}

// LoadHeard: the fake's owners were never heard (heardView tells).
func (v *fakeView) LoadHeard(string) (time.Time, bool) { return time.Time{}, false }

// WatchGone: no router is ever gone (goneView tells).
func (v *fakeView) WatchGone(func(string)) func() { return func() {} }

func (v *fakeView) Locate(id string) (string, bool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, r := range v.replicas {
		if r.id == id {
			return r.owner, r.owner == "", true
		}
	}
	return "", false, false
}

func (v *fakeView) Models() []string { return v.models }

func (v *fakeView) Forget(id string, hashes []uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgets[id] = append(v.forgets[id], append([]uint64(nil), hashes...))
}

func (v *fakeView) forgotten(id string) [][]uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.forgets[id]
}

func (v *fakeView) Record(id string, hashes []uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.records[id] = append(v.records[id], append([]uint64(nil), hashes...))
}

func (v *fakeView) Begin(id string, prefill float64) (func(), func()) {
	v.mu.Lock()
	v.begins[id]++
	v.mu.Unlock()
	var once sync.Once
	return func() {}, func() {
		once.Do(func() {
			select {
			case v.dones <- id:
			default: // a test that does not read them (more than the buffer) is not held up
			}
		})
	}
}

func (v *fakeView) recorded(id string) [][]uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.records[id]
}

// waitDone waits for the proxy to finish a request at an owned replica.
func (v *fakeView) waitDone(t *testing.T) string {
	t.Helper()
	return recv(t, v.dones, "a request to finish")
}

// waitCounted waits (a bounded poll) until n requests to endpoint ep
// were counted, whatever their status. The count is the last thing a
// request's handler does (inference's first deferred call), after every
// release of what it held; the view's done (waitDone) comes before those
// releases, and a client has its last byte before them too, so what a
// finished request left behind is checked after this, not after either.
func waitCounted(t *testing.T, p *Proxy, ep string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s requests counted", n, ep), func() bool {
		p.m.mu.RLock()
		defer p.m.mu.RUnlock()
		got := 0.0
		for k, c := range p.m.reqs {
			if k.endpoint == ep {
				got += testutil.ToFloat64(c)
			}
		}
		return got >= float64(n)
	})
}

// newTestProxy serves a Proxy over view on 127.0.0.1.
func newTestProxy(t *testing.T, view View, mod func(*Config)) (*Proxy, *httptest.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg := Config{RouterName: "test", View: view, Policy: route.DefaultPolicy(), Contract: testContract, Registerer: reg, Gatherer: reg}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(p)
	srv.Config.ConnContext = ConnContext // the stream loop takes the streams it can
	srv.Start()
	t.Cleanup(p.Close) // after srv.Close (cleanups run last first)
	t.Cleanup(srv.Close)
	return p, srv, reg
}

// deadAddr returns a URL on which nothing listens: connections are
// refused until the test ends (internal/deadaddr: a listener closed at
// once had its port handed to the test's next listener under load, and
// the "dead" replica answered).
func deadAddr(t *testing.T) string {
	t.Helper()
	return "http://" + deadaddr.Addr(t)
}

// chatBody is a chat request whose prompt is long enough for many blocks.
func chatBody(model string, stream bool, msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := struct {
		Model    string `json:"model"`
		Messages []msg  `json:"messages"`
		Stream   bool   `json:"stream,omitempty"`
	}{Model: model, Stream: stream}
	for i, m := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		req.Messages = append(req.Messages, msg{role, m})
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// sseChat writes an OpenAI chat stream of the given deltas.
func sseChat(w http.ResponseWriter, deltas []string, cached int) {
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	for _, d := range deltas {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": d}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		f.Flush()
	}
	if cached >= 0 {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", cached)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// jsonChat writes a non-streaming chat completion.
func jsonChat(w http.ResponseWriter, answer string, cached int) {
	w.Header().Set("Content-Type", "application/json")
	resp := map[string]any{
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": answer}}},
		"usage":   map[string]any{"prompt_tokens": 100, "prompt_tokens_details": map[string]any{"cached_tokens": cached}},
	}
	_ = json.NewEncoder(w).Encode(resp)
}

// replicaServer is a fake OpenAI replica counting its requests.
type replicaServer struct {
	*httptest.Server
	mu      sync.Mutex
	hits    int
	headers []http.Header
}

func newReplica(t *testing.T, h http.HandlerFunc) *replicaServer {
	t.Helper()
	rs := &replicaServer{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.mu.Lock()
		rs.hits++
		rs.headers = append(rs.headers, r.Header.Clone())
		rs.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(rs.Close)
	return rs
}

func (rs *replicaServer) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.hits
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return string(b)
}

// deltas are n distinct stream tokens.
func deltas(n, size int) []string {
	d := make([]string, n)
	for i := range d {
		s := fmt.Sprintf("[%d]", i)
		d[i] = s + strings.Repeat("x", max(size-len(s), 0))
	}
	return d
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
