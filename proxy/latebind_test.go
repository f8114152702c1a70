package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
)

// liveView is a fakeView whose in-flight counts follow the proxy's
// bookings, as the mesh's do.
type liveView struct {
	*fakeView
	mu   sync.Mutex
	live map[string]int
}

func (v *liveView) Candidates(model string, dst []route.Candidate) []route.Candidate {
	n := len(dst)
	dst = v.fakeView.Candidates(model, dst)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := n; i < len(dst); i++ {
		dst[i].InFlight += route.Count32(v.live[dst[i].ID()])
	}
	return dst
}

func (v *liveView) PooledCandidates(model string) ([]route.Candidate, func()) {
	return v.Candidates(model, nil), func() {}
}

func (v *liveView) Begin(id string, prefill float64) (func(), func()) {
	first, done := v.fakeView.Begin(id, prefill)
	v.mu.Lock()
	v.live[id]++
	v.mu.Unlock()
	var once sync.Once
	return first, func() {
		once.Do(func() {
			v.mu.Lock()
			v.live[id]--
			v.mu.Unlock()
		})
		done()
	}
}

// With late binding, a request for an owned replica whose slots are all
// taken waits at the router, not in an engine's queue, and goes to the
// first replica whose slot frees, decided again there: here B's, though
// it was decided for A (the holder of its prefix). Without it, it is
// sent at once to wait in an engine.
func TestLateBind(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[late], func(t *testing.T) {
			type arrival struct {
				replica string
				release chan struct{}
			}
			arrived := make(chan arrival, 8)
			handler := func(name string) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					rel := make(chan struct{})
					arrived <- arrival{name, rel}
					select {
					case <-rel:
					case <-r.Context().Done():
						return
					}
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10}}`))
				}
			}
			a, b := newReplica(t, handler("A")), newReplica(t, handler("B"))
			view := &liveView{fakeView: newFakeView([]string{"m"},
				fakeReplica{id: a.URL, match: 8, slots: 1}, fakeReplica{id: b.URL, slots: 1}), live: map[string]int{}}
			p, srv, reg := newTestProxy(t, view, func(c *Config) { c.LateBind = late })
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			codes := make(chan int, 3)
			send := func() {
				go func() {
					resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", false, strings.Repeat("a shared prefix ", 40)))
					_ = readAll(t, resp)
					codes <- resp.StatusCode
				}()
			}
			next := func(what string) arrival {
				t.Helper()
				select {
				case x := <-arrived:
					return x
				case <-ctx.Done():
					t.Fatalf("no request reached a replica: %s", what)
				}
				return arrival{}
			}
			send()
			first := next("the first request")
			if first.replica != "A" {
				t.Fatalf("first request went to %s, want A (the holder)", first.replica)
			}
			send()
			second := next("the second request")
			if second.replica != "B" {
				t.Fatalf("second request went to %s, want B (A is full)", second.replica)
			}
			send()
			var third arrival
			if !late {
				// Both full: it is sent to wait in an engine's queue.
				third = next("the third request, into an engine's queue")
				close(second.release)
			} else {
				waitFor(t, "the third request held", func() bool { return p.late.heldAt(a.URL)+p.late.heldAt(b.URL) == 1 })
				select {
				case x := <-arrived:
					t.Fatalf("the third request reached %s while both replicas were full", x.replica)
				default:
				}
				close(second.release) // B's slot frees first
				if third = next("the held request"); third.replica != "B" {
					t.Fatalf("the held request went to %s, want B, whose slot freed", third.replica)
				}
			}
			close(third.release)
			close(first.release)
			for range 3 {
				if code := <-codes; code != http.StatusOK {
					t.Errorf("status %d", code)
				}
			}
			if late {
				if n := p.late.heldAt(a.URL) + p.late.heldAt(b.URL); n != 0 {
					t.Errorf("%d still held", n)
				}
				if got := metricOf(t, reg, "kvmesh_late_bind_holds_total"); got != 1 {
					t.Errorf("kvmesh_late_bind_holds_total = %v, want 1", got)
				}
				if got := metricOf(t, reg, "kvmesh_late_bind_held"); got != 0 {
					t.Errorf("kvmesh_late_bind_held = %v, want 0", got)
				}
			}
		})
	}
}

// newSlotHolder is a replica of one slot whose first request holds it
// until release is closed; every later request is answered at once.
func newSlotHolder(t *testing.T) (*replicaServer, chan struct{}) {
	release := make(chan struct{})
	var once sync.Once
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { <-release })
		jsonChat(w, "from R", 0)
	})
	return rep, release
}

// A forwarded request held at its owner announces its dispatch when it
// is held (its entry would otherwise give it up after the hop dispatch
// timeout), once, and is sent when the replica's slot frees, though
// that is past the entry's dispatch deadline: the owner took it on
// before the deadline.
func TestLateBindHoldsAHopAnnounced(t *testing.T) {
	rep, release := newSlotHolder(t)
	// Another owned replica, always full: an owner of one replica holds nothing.
	full := newReplica(t, func(w http.ResponseWriter, r *http.Request) { t.Error("the full replica got a request") })
	view := &liveView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL, slots: 1}, fakeReplica{id: full.URL, slots: 1, inFlight: 1}), live: map[string]int{}}
	p, srv, _ := newEdgeProxy(t, view, func(c *Config) { c.HopKey, c.LateBind = testHopKey, true })
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	firstDone := make(chan int, 1)
	go func() {
		resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", false, "the first"))
		_ = readAll(t, resp)
		firstDone <- resp.StatusCode
	}()
	waitFor(t, "the first request at the replica", func() bool { return rep.count() == 1 })
	type result struct {
		status int
		got1xx int
	}
	hopDone := make(chan result, 1)
	// A deadline the hop surely reaches its owner by, and that passes
	// while it is held.
	deadline := time.Now().Add(3 * time.Second)
	go func() {
		status, _, got1xx, _ := ownerHop(t, srv.URL, rep.URL, true,
			map[string]string{hop.HeaderDispatchBy: strconv.FormatInt(deadline.UnixMilli(), 10)})
		hopDone <- result{status, len(got1xx)}
	}()
	waitFor(t, "the hop held", func() bool { return p.late.heldAt(rep.URL)+p.late.heldAt(full.URL) == 1 })
	if n := rep.count(); n != 1 {
		t.Fatalf("the replica got %d requests while its slot was taken, want 1", n)
	}
	time.Sleep(time.Until(deadline) + 100*time.Millisecond)
	close(release)
	if code := <-firstDone; code != http.StatusOK {
		t.Errorf("first request: status %d", code)
	}
	res := <-hopDone
	if res.status != http.StatusOK || res.got1xx != 1 {
		t.Errorf("hop: status %d with %d informational responses, want 200 with one 103", res.status, res.got1xx)
	}
	if n := rep.count(); n != 2 {
		t.Errorf("the replica got %d requests, want 2", n)
	}
}

// A client that leaves while its request is held is never sent: the
// replica never sees it, and the hold ends.
func TestLateBindClientGoneWhileHeld(t *testing.T) {
	rep, release := newSlotHolder(t)
	// Another owned replica, always full: an owner of one replica holds nothing.
	full := newReplica(t, func(w http.ResponseWriter, r *http.Request) { t.Error("the full replica got a request") })
	view := &liveView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL, slots: 1}, fakeReplica{id: full.URL, slots: 1, inFlight: 1}), live: map[string]int{}}
	p, srv, _ := newTestProxy(t, view, func(c *Config) { c.LateBind = true })
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	firstDone := make(chan int, 1)
	go func() {
		resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", false, "the first"))
		_ = readAll(t, resp)
		firstDone <- resp.StatusCode
	}()
	waitFor(t, "the first request at the replica", func() bool { return rep.count() == 1 })
	gone, leave := context.WithCancel(ctx)
	secondDone := make(chan struct{})
	go func() {
		defer close(secondDone)
		req, _ := http.NewRequestWithContext(gone, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", false, "the second")))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the second request held", func() bool { return p.late.heldAt(rep.URL)+p.late.heldAt(full.URL) == 1 })
	leave()
	<-secondDone
	waitFor(t, "the hold to end", func() bool { return p.late.heldAt(rep.URL)+p.late.heldAt(full.URL) == 0 })
	close(release)
	if code := <-firstDone; code != http.StatusOK {
		t.Errorf("first request: status %d", code)
	}
	if n := rep.count(); n != 1 {
		t.Errorf("the replica got %d requests, want 1 (the second left while held)", n)
	}
}

// An owner of a single replica (for the model) holds nothing: its queue
// would be that engine's queue again.
func TestLateBindNeedsTwoOwnedReplicas(t *testing.T) {
	rep, release := newSlotHolder(t)
	view := &liveView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL, slots: 1}), live: map[string]int{}}
	p, srv, reg := newTestProxy(t, view, func(c *Config) { c.LateBind = true })
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	done := make(chan int, 2)
	for i := range 2 {
		go func() {
			resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", false, fmt.Sprintf("request %d", i)))
			_ = readAll(t, resp)
			done <- resp.StatusCode
		}()
	}
	waitFor(t, "both requests at the replica", func() bool { return rep.count() == 2 })
	close(release)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("status %d", code)
		}
	}
	if got := metricOf(t, reg, "kvmesh_late_bind_holds_total"); got != 0 {
		t.Errorf("kvmesh_late_bind_holds_total = %v, want 0", got)
	}
}

// A slot count learnt from an engine's queue is a floor: while the
// engine's last scrape showed nothing waiting, late binding sends it one
// request past the count (which it runs, raising the count, or queues);
// a published count, or an engine seen queueing, is held to exactly.
func TestLateBindLearnedSlotsAreAFloor(t *testing.T) {
	b := newLateBinder(nil, func(id string) bool { return id == "learned" })
	cand := func(id string, inFlight, slots, waiting int) route.Candidate {
		return route.Candidate{InFlight: route.Count32(inFlight), EngineLoad: route.EngineLoad{Slots: route.Count32(slots), Waiting: route.Count32(waiting)},
			Detail: &route.Detail{ID: id, Local: true}}
	}
	for _, tc := range []struct {
		name                     string
		id                       string
		inFlight, slots, waiting int
		full                     bool
	}{
		{"published, every slot taken", "published", 2, 2, 0, true},
		{"published, a slot free", "published", 1, 2, 0, false},
		{"learnt, nothing waiting: one more", "learned", 2, 2, 0, false},
		{"learnt, the one more sent", "learned", 3, 2, 0, true},
		{"learnt, the engine queueing", "learned", 2, 2, 1, true},
		{"unknown slots", "learned", 9, 0, 0, false},
	} {
		c := cand(tc.id, tc.inFlight, tc.slots, tc.waiting)
		if got := b.engineFull(&c); got != tc.full {
			t.Errorf("%s: full %v, want %v", tc.name, got, tc.full)
		}
	}
}
