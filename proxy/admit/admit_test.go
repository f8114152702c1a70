package admit

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testWait bounds every wait of these tests: a liveness bound, never a
// speed assertion.
const testWait = 60 * time.Second

// capacity is a model with a fixed number of requests it runs at once,
// held by the Admitter's own count (Visible 0).
type capacity struct{ n atomic.Int64 }

func (c *capacity) room(string) Room { n := int(c.n.Load()); return Room{Free: n, FreeSlots: n} }

func newTest(t *testing.T, cap int, mod func(*Config)) (*Admitter, *capacity, *prometheus.Registry) {
	t.Helper()
	c := &capacity{}
	c.n.Store(int64(cap))
	reg := prometheus.NewPedanticRegistry()
	cfg := Config{Room: c.room, Registerer: reg, Timeout: testWait}
	if mod != nil {
		mod(&cfg)
	}
	a := New(cfg)
	t.Cleanup(a.Close)
	return a, c, reg
}

// outcome is one Admit's result.
type outcome struct {
	name    string
	release func()
	v       Verdict
}

// admitAsync admits req in a goroutine (as a handler would) and sends
// the outcome on out once decided.
func admitAsync(a *Admitter, ctx context.Context, name string, req Request, room Room, out chan<- outcome) {
	go func() {
		rel, v := a.Admit(ctx, req, room, nil)
		out <- outcome{name, rel, v}
	}()
}

func recv(t *testing.T, ch <-chan outcome, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// waitQueued waits until n requests are queued in all.
func waitQueued(t *testing.T, a *Admitter, n int) {
	t.Helper()
	for deadline := time.Now().Add(testWait); ; time.Sleep(time.Millisecond) {
		d := a.Depth()
		if d[0]+d[1]+d[2] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d queued (have %v)", n, d)
		}
	}
}

// full is a room with nothing free: every request queues.
var full = Room{}

func TestOpenRoomPassesThrough(t *testing.T) {
	a, _, reg := newTest(t, 0, nil)
	var rels []func()
	for i := range 100 {
		rel, v := a.Admit(context.Background(), Request{Model: "m", Tenant: uint64(i)}, Room{Open: true}, func() { t.Error("an open model made a request wait") })
		if !v.Admitted() || v.Queued {
			t.Fatalf("request %d: %+v, want admitted at once", i, v)
		}
		rels = append(rels, rel)
	}
	for _, r := range rels {
		r()
	}
	if got := testutil.ToFloat64(a.m.admitted.WithLabelValues("normal", "direct")); got != 100 {
		t.Errorf("admitted direct = %v, want 100", got)
	}
	if n, _ := testutil.GatherAndCount(reg, "kvmesh_admission_queue_depth"); n != NumClasses {
		t.Errorf("queue depth series = %d, want one per class", n)
	}
	if len(a.q) != 0 {
		t.Errorf("%d models tracked after every request ended, want 0", len(a.q))
	}
}

func TestFreeRoomAdmitsUpToCapacity(t *testing.T) {
	a, c, _ := newTest(t, 2, nil)
	out := make(chan outcome, 4)
	for i := range 3 {
		admitAsync(a, context.Background(), fmt.Sprint(i), Request{Model: "m"}, c.room("m"), out)
	}
	first, second := recv(t, out, "a first admission"), recv(t, out, "a second admission")
	waitQueued(t, a, 1)
	if !first.v.Admitted() || !second.v.Admitted() {
		t.Fatalf("verdicts %+v %+v, want both admitted", first.v, second.v)
	}
	first.release()
	third := recv(t, out, "the third admission after a release")
	if !third.v.Admitted() || !third.v.Queued {
		t.Fatalf("third: %+v, want admitted after queueing", third.v)
	}
	first.release() // idempotent: the room is not given back twice
	second.release()
	third.release()
}

// TestStrictClasses: with one slot busy, a high request that arrives
// last starts first, then normal, then low; each lower class waits too
// for the slot the class above it held (its peak) to be forgotten.
func TestStrictClasses(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	a, c, _ := newTest(t, 1, func(cfg *Config) { cfg.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	busy, v := a.Admit(context.Background(), Request{Model: "m"}, c.room("m"), nil)
	if !v.Admitted() {
		t.Fatal(v)
	}
	out := make(chan outcome, 3)
	for i, cl := range []Class{Low, Normal, High} {
		admitAsync(a, context.Background(), cl.String(), Request{Model: "m", Class: cl, Tenant: 1}, full, out)
		waitQueued(t, a, i+1)
	}
	busy()
	var order []string
	for i := range 3 {
		o := recv(t, out, "a grant")
		if !o.v.Admitted() {
			t.Fatalf("%s: %+v", o.name, o.v)
		}
		order = append(order, o.name)
		if i < 2 {
			// The next class waits for the slot this one held.
			waitQueued(t, a, 2-i)
			if d := a.Depth(); d[High.idx()] != 0 {
				t.Fatalf("depth %v", d)
			}
		}
		o.release()
		now.Add(int64(peakWindow * time.Second))
	}
	if fmt.Sprint(order) != "[high normal low]" {
		t.Errorf("start order %v, want high, normal, low", order)
	}
}

// TestHighPassesLowerQueue: a high request with only low ones queued
// starts at once into room the low class may not use (an engine's
// queue).
func TestHighPassesLowerQueue(t *testing.T) {
	a, _, _ := newTest(t, 0, nil)
	room := Room{Free: 1} // a place in an engine's queue, no free slot
	out := make(chan outcome, 1)
	admitAsync(a, context.Background(), "low", Request{Model: "m", Class: Low}, room, out)
	waitQueued(t, a, 1)
	rel, v := a.Admit(context.Background(), Request{Model: "m", Class: High}, room, func() { t.Error("the high request waited") })
	if !v.Admitted() || v.Queued {
		t.Fatalf("high: %+v, want admitted at once", v)
	}
	rel()
	if d := a.Depth(); d[Low.idx()] != 1 {
		t.Errorf("depth %v, want the low request still queued", d)
	}
}

// TestFairTenants: a tenant that queued six requests does not hold back
// another's two: they alternate by virtual finish time.
func TestFairTenants(t *testing.T) {
	a, c, _ := newTest(t, 1, nil)
	busy, _ := a.Admit(context.Background(), Request{Model: "m"}, c.room("m"), nil)
	out := make(chan outcome, 8)
	n := 0
	for i := range 6 {
		admitAsync(a, context.Background(), fmt.Sprintf("A%d", i+1), Request{Model: "m", Tenant: 1, Cost: 10}, full, out)
		n++
		waitQueued(t, a, n)
	}
	for i := range 2 {
		admitAsync(a, context.Background(), fmt.Sprintf("B%d", i+1), Request{Model: "m", Tenant: 2, Cost: 10}, full, out)
		n++
		waitQueued(t, a, n)
	}
	busy()
	var order []string
	for range 8 {
		o := recv(t, out, "a grant")
		order = append(order, o.name)
		o.release()
	}
	if got, want := fmt.Sprint(order), "[A1 B1 A2 B2 A3 A4 A5 A6]"; got != want {
		t.Errorf("start order %v, want %v", got, want)
	}
}

// TestFairByCost: a tenant's expensive requests weigh by their cost: a
// tenant of short prompts gets several starts per long one.
func TestFairByCost(t *testing.T) {
	a, c, _ := newTest(t, 1, nil)
	busy, _ := a.Admit(context.Background(), Request{Model: "m"}, c.room("m"), nil)
	out := make(chan outcome, 8)
	n := 0
	add := func(name string, tenant uint64, cost float64) {
		admitAsync(a, context.Background(), name, Request{Model: "m", Tenant: tenant, Cost: cost}, full, out)
		n++
		waitQueued(t, a, n)
	}
	add("L1", 1, 300)
	add("L2", 1, 300)
	for i := range 4 {
		add(fmt.Sprintf("S%d", i+1), 2, 100)
	}
	busy()
	var order []string
	for range 6 {
		o := recv(t, out, "a grant")
		order = append(order, o.name)
		o.release()
	}
	if got, want := fmt.Sprint(order), "[S1 S2 L1 S3 S4 L2]"; got != want {
		t.Errorf("start order %v, want %v", got, want)
	}
}

func TestDeadline(t *testing.T) {
	a, _, _ := newTest(t, 0, nil)
	// The request's own, shorter timeout bounds its wait (the Admitter's
	// is testWait).
	rel, v := a.Admit(context.Background(), Request{Model: "m", Class: Low, Timeout: 10 * time.Millisecond}, full, nil)
	if rel != nil || v.Status != http.StatusServiceUnavailable || v.Reason != ReasonDeadline || !v.Queued || v.RetryAfter < time.Second {
		t.Fatalf("verdict %+v, want 503 deadline with Retry-After after queueing", v)
	}
	if v.Wait < 10*time.Millisecond {
		t.Errorf("waited %v, less than its deadline", v.Wait)
	}
	waitQueued(t, a, 0)
	if got := testutil.ToFloat64(a.m.shedding.WithLabelValues("low", ReasonDeadline)); got != 1 {
		t.Errorf("shed{low,deadline} = %v, want 1", got)
	}
}

func TestClientGoneLeavesQueue(t *testing.T) {
	a, c, _ := newTest(t, 1, nil)
	busy, _ := a.Admit(context.Background(), Request{Model: "m"}, c.room("m"), nil)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan outcome, 2)
	admitAsync(a, ctx, "gone", Request{Model: "m", Tenant: 1}, full, out)
	waitQueued(t, a, 1)
	admitAsync(a, context.Background(), "stays", Request{Model: "m", Tenant: 2}, full, out)
	waitQueued(t, a, 2)
	cancel()
	o := recv(t, out, "the cancelled request")
	if o.name != "gone" || o.v.Status != 499 || o.release != nil {
		t.Fatalf("%s: %+v, want the cancelled request out with 499", o.name, o.v)
	}
	waitQueued(t, a, 1)
	busy()
	o = recv(t, out, "the other request")
	if o.name != "stays" || !o.v.Admitted() {
		t.Fatalf("%s: %+v, want admitted", o.name, o.v)
	}
	o.release()
	if got := testutil.ToFloat64(a.m.gone.WithLabelValues("normal")); got != 1 {
		t.Errorf("cancelled = %v, want 1", got)
	}
}

// TestFullQueue: a full queue sheds the lowest class first (503), the
// tenant over its share (429), and a newcomer below everything queued
// (503).
func TestFullQueue(t *testing.T) {
	a, _, _ := newTest(t, 0, func(c *Config) { c.MaxQueue = 4 })
	out := make(chan outcome, 16)
	for i := range 4 {
		admitAsync(a, context.Background(), fmt.Sprintf("A%d", i+1), Request{Model: "m", Class: Low, Tenant: 1}, full, out)
		waitQueued(t, a, i+1)
	}
	// A high request displaces tenant 1's newest low one.
	admitAsync(a, context.Background(), "H", Request{Model: "m", Class: High, Tenant: 3}, full, out)
	o := recv(t, out, "the displaced request")
	if o.name != "A4" || o.v.Status != http.StatusServiceUnavailable || o.v.Reason != ReasonPreempted || o.v.RetryAfter < time.Second {
		t.Fatalf("%s: %+v, want A4 shed 503 preempted", o.name, o.v)
	}
	waitQueued(t, a, 4)
	// Tenant 1 holds 3 of the 3 low requests: its newcomer is over its share.
	rel, v := a.Admit(context.Background(), Request{Model: "m", Class: Low, Tenant: 1}, full, nil)
	if rel != nil || v.Status != http.StatusTooManyRequests || v.Reason != ReasonTenantShare {
		t.Fatalf("tenant 1's newcomer: %+v, want 429 tenant_share", v)
	}
	// Tenant 2 holds none: tenant 1's newest gives way to it.
	admitAsync(a, context.Background(), "B1", Request{Model: "m", Class: Low, Tenant: 2}, full, out)
	o = recv(t, out, "the request over its tenant's share")
	if o.name != "A3" || o.v.Status != http.StatusTooManyRequests || o.v.Reason != ReasonTenantShare {
		t.Fatalf("%s: %+v, want A3 shed 429 tenant_share", o.name, o.v)
	}
	waitQueued(t, a, 4)
	// Fill with high requests: a normal newcomer is below all of them.
	for i := range 3 {
		admitAsync(a, context.Background(), fmt.Sprintf("H%d", i+2), Request{Model: "m", Class: High, Tenant: uint64(10 + i)}, full, out)
		recv(t, out, "a displaced low request")
		waitQueued(t, a, 4)
	}
	if d := a.Depth(); d != [NumClasses]int{4, 0, 0} {
		t.Fatalf("depth %v, want 4 high", d)
	}
	rel, v = a.Admit(context.Background(), Request{Model: "m", Class: Normal, Tenant: 5}, full, nil)
	if rel != nil || v.Status != http.StatusServiceUnavailable || v.Reason != ReasonQueueFull {
		t.Fatalf("normal newcomer: %+v, want 503 queue_full", v)
	}
	a.Close()
	for range 4 {
		o := recv(t, out, "a request shed by Close")
		if o.v.Status != http.StatusServiceUnavailable || o.v.Reason != ReasonClosed {
			t.Errorf("%s: %+v, want 503 closed", o.name, o.v)
		}
	}
	if len(a.q) != 0 {
		t.Errorf("%d models tracked after Close drained them", len(a.q))
	}
	// Closed, it still admits what has room, and sheds what would wait.
	rel, v = a.Admit(context.Background(), Request{Model: "m"}, Room{Open: true}, nil)
	if !v.Admitted() {
		t.Errorf("after Close, with room: %+v", v)
	} else {
		rel()
	}
	if _, v = a.Admit(context.Background(), Request{Model: "m", Class: 9}, full, nil); v.Status != http.StatusServiceUnavailable || v.Reason != ReasonClosed {
		t.Errorf("after Close, without room: %+v, want 503 closed", v)
	}
}

// TestUnmeetableDeadline: at the measured drain rate, a request whose
// wait would exceed its deadline is shed at once, with a Retry-After of
// the queue's drain time.
func TestUnmeetableDeadline(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	a, c, _ := newTest(t, 10, func(cfg *Config) { cfg.Now = clock; cfg.Timeout = time.Second })
	// Ten requests end within a second: 10 per second.
	for range 10 {
		rel, v := a.Admit(context.Background(), Request{Model: "m"}, c.room("m"), nil)
		if !v.Admitted() {
			t.Fatal(v)
		}
		defer rel()
	}
	out := make(chan outcome, 32)
	for i := range 15 {
		// No rate measured yet: these queue.
		admitAsync(a, context.Background(), fmt.Sprint(i), Request{Model: "m", Tenant: 1}, full, out)
		waitQueued(t, a, i+1)
	}
	now.Add(int64(500 * time.Millisecond))
	c.n.Store(0)
	// The releases measure the rate; the room stays 0, so nobody starts.
	a.mu.Lock()
	m := a.q["m"]
	for range 10 {
		m.rate.add(clock())
	}
	a.mu.Unlock()
	_, v := a.Admit(context.Background(), Request{Model: "m", Tenant: 1}, full, nil)
	if v.Status != http.StatusServiceUnavailable || v.Reason != ReasonDeadline || v.Queued || v.RetryAfter < time.Second {
		t.Fatalf("verdict %+v, want 503 deadline without queueing", v)
	}
	// A high request has nobody ahead of it: it queues.
	admitAsync(a, context.Background(), "high", Request{Model: "m", Class: High, Tenant: 2}, full, out)
	waitQueued(t, a, 16)
	a.Close()
}

func TestConcurrentChurn(t *testing.T) {
	a, c, _ := newTest(t, 4, func(cfg *Config) { cfg.MaxQueue = 16; cfg.Timeout = 20 * time.Millisecond })
	var wg sync.WaitGroup
	var admitted, shed, gone atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == 0 {
					cancel()
				}
				rel, v := a.Admit(ctx, Request{Model: fmt.Sprint("m", g%2), Class: classAt(i % NumClasses), Tenant: uint64(i % 5)}, c.room(""), nil)
				switch {
				case v.Admitted():
					admitted.Add(1)
					rel()
				case v.Status == 499:
					gone.Add(1)
				default:
					shed.Add(1)
					if v.RetryAfter < time.Second {
						t.Errorf("shed without Retry-After: %+v", v)
					}
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if admitted.Load()+shed.Load()+gone.Load() != 1600 {
		t.Errorf("%d admitted + %d shed + %d gone, want 1600 answered", admitted.Load(), shed.Load(), gone.Load())
	}
	if d := a.Depth(); d != [NumClasses]int{} {
		t.Errorf("depth %v after every request ended", d)
	}
	a.mu.Lock()
	n := len(a.q)
	a.mu.Unlock()
	if n != 0 {
		t.Errorf("%d models tracked after every request ended", n)
	}
}

func TestRoomOf(t *testing.T) {
	cand := func(inFlight, slots, waiting int, hasLoad bool) route.Candidate {
		return route.Candidate{InFlight: int32(inFlight), EngineLoad: route.EngineLoad{Slots: int32(slots), Waiting: int32(waiting), HasLoad: hasLoad}}
	}
	for _, tc := range []struct {
		name  string
		cands []route.Candidate
		want  Room
		free  int // with 0 held
	}{
		{"no signal", []route.Candidate{cand(50, 0, 0, false)}, Room{Open: true, Visible: 50}, -1},
		{"slots", []route.Candidate{cand(10, 8, 0, true), cand(3, 8, 0, true)}, Room{Free: 19, FreeSlots: 5, Visible: 13}, 19},
		{"full", []route.Candidate{cand(16, 8, 8, true)}, Room{Visible: 16}, 0},
		{"a scrape's waiting does not hold back known slots", []route.Candidate{cand(2, 8, 9, true)}, Room{Free: 14, FreeSlots: 6, Visible: 2}, 14},
		{"no slots, short queue", []route.Candidate{cand(2, 0, 7, true)}, Room{Open: true, Visible: 2}, -1},
		{"no slots, long queue", []route.Candidate{cand(2, 0, 8, true)}, Room{Visible: 2}, 0},
	} {
		got := RoomOf(tc.cands, Limits{MaxWaiting: 8})
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if f := (&modelQ{}).free(got, Normal, time.Now()); tc.free >= 0 && f != tc.free {
			t.Errorf("%s: free %d, want %d", tc.name, f, tc.free)
		}
	}
	// An engine at its KV limit has no room, slots or not; below it, or
	// with the limit off, the slots count.
	kv := func(usage uint16, slots int) route.Candidate {
		return route.Candidate{InFlight: 1, EngineLoad: route.EngineLoad{Slots: int32(slots), KVUsage: usage, HasLoad: true}}
	}
	for _, tc := range []struct {
		c    route.Candidate
		lim  Limits
		want Room
	}{
		{kv(9600, 8), Limits{MaxWaiting: 2, MaxKVUsage: 0.95}, Room{Visible: 1}},
		{kv(9400, 8), Limits{MaxWaiting: 2, MaxKVUsage: 0.95}, Room{Free: 9, FreeSlots: 7, Visible: 1}},
		{kv(9600, 8), Limits{MaxWaiting: 2}, Room{Free: 9, FreeSlots: 7, Visible: 1}},
		{kv(9600, 0), Limits{MaxWaiting: 2, MaxKVUsage: 0.95}, Room{Visible: 1}},
	} {
		if got := RoomOf([]route.Candidate{tc.c}, tc.lim); got != tc.want {
			t.Errorf("KV usage %d, %+v: %+v, want %+v", tc.c.KVUsage, tc.lim, got, tc.want)
		}
	}
	// Requests admitted that the counts do not show yet take room.
}

func TestFreeByClass(t *testing.T) {
	now := time.Now()
	m := &modelQ{held: 6}
	if got := m.free(Room{Free: 5, Visible: 3}, Normal, now); got != 2 {
		t.Errorf("free with 3 not yet visible = %d, want 2", got)
	}
	// The engines' queues are not the low class's.
	four := route.EngineLoad{Slots: 4}
	r := RoomOf([]route.Candidate{{InFlight: 3, EngineLoad: four}, {InFlight: 3, EngineLoad: four}}, Limits{MaxWaiting: 2})
	m = &modelQ{}
	if h, n, l := m.free(r, High, now), m.free(r, Normal, now), m.free(r, Low, now); h != 6 || n != 6 || l != 2 {
		t.Errorf("free by class %d %d %d, want 6 6 2", h, n, l)
	}
	// High held 4 at once a moment ago and holds 1 now: the classes
	// below leave 3 slots free for it, and 2 more (√4), and stay out of
	// the engines' queues.
	for range 4 {
		m.take(High, now)
	}
	for range 3 {
		m.give(High)
	}
	r.Visible = 6 // the high requests are counted
	if h, n, l := m.free(r, High, now), m.free(r, Normal, now), m.free(r, Low, now); h != 6 || n != -3 || l != -3 {
		t.Errorf("free by class %d %d %d, want 6 -3 -3", h, n, l)
	}
	r.FreeSlots = 7
	if n, l := m.free(r, Normal, now), m.free(r, Low, now); n != 2 || l != 2 {
		t.Errorf("free with 7 free slots: normal %d low %d, want 2 2", n, l)
	}
	// The peak is forgotten after its window.
	later := now.Add(peakWindow * time.Second)
	if n := m.free(r, Normal, later); n != r.Free {
		t.Errorf("free after the window: normal %d, want %d", n, r.Free)
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]Class{"high": High, "LOW": Low, " normal ": Normal, "-1": High, "0": Normal, "5": Low} {
		if c, ok := ParseClass(s); !ok || c != want {
			t.Errorf("ParseClass(%q) = %v %v, want %v", s, c, ok, want)
		}
	}
	if _, ok := ParseClass("urgent"); ok {
		t.Error("ParseClass(urgent) ok")
	}
	for s, want := range map[string]time.Duration{"2s": 2 * time.Second, "0.5": 500 * time.Millisecond, "250ms": 250 * time.Millisecond} {
		if d, ok := ParseTimeout(s); !ok || d != want {
			t.Errorf("ParseTimeout(%q) = %v %v, want %v", s, d, ok, want)
		}
	}
	for _, s := range []string{"-1s", "x", "1e300", "NaN"} {
		if _, ok := ParseTimeout(s); ok {
			t.Errorf("ParseTimeout(%q) ok", s)
		}
	}
}

// BenchmarkAdmitWithRoom is the cost admission adds to a request of a
// model that is not saturated: Admit and its release.
func BenchmarkAdmitWithRoom(b *testing.B) {
	a := New(Config{Room: func(string) Room { return Room{Open: true} }})
	defer a.Close()
	room := Room{Free: 64, FreeSlots: 32}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rel, v := a.Admit(context.Background(), Request{Model: "m", Tenant: 1, Cost: 100}, room, nil)
			if !v.Admitted() {
				b.Fatal(v)
			}
			rel()
		}
	})
}
