package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

func TestLoadBookHeat(t *testing.T) {
	b := newLoadBook()
	n1, end1 := b.begin(7)
	n2, end2 := b.begin(7)
	n3, end3 := b.begin(9)
	if n1 != 1 || n2 != 2 || n3 != 1 {
		t.Fatalf("counts %d %d %d, want 1 2 1", n1, n2, n3)
	}
	end1()
	end1() // ending twice must not count twice
	if got := b.inFlight(7); got != 1 {
		t.Fatalf("after one end: %d in flight under 7, want 1", got)
	}
	end2()
	end3()
	if len(b.heat) != 0 {
		t.Fatalf("ended requests left %d keys", len(b.heat))
	}
}

func TestLoadBookHeatBounded(t *testing.T) {
	b := newLoadBook()
	for k := range maxHeatKeys {
		b.begin(uint64(k))
	}
	n, end := b.begin(1 << 40)
	end()
	if n != 0 || len(b.heat) != maxHeatKeys {
		t.Fatalf("new key on a full map: count %d, %d keys; want 0 (unknown), %d", n, len(b.heat), maxHeatKeys)
	}
	if n, _ := b.begin(3); n != 2 {
		t.Fatalf("known key on a full map: count %d, want 2", n)
	}
}

// The stem records are bounded like the heat counts: a full map keeps
// updating its keys and takes no new one.
func TestLoadBookStemsBounded(t *testing.T) {
	b := newLoadBook()
	rec := route.Stem{Len: 3, Depth: 2, Hash: 5}
	for k := range maxHeatKeys {
		b.setStem(uint64(k), rec)
	}
	b.setStem(1<<40, rec)
	if got := b.stem(1 << 40); got != (route.Stem{}) || len(b.stems) != maxHeatKeys {
		t.Fatalf("new key on a full map: %+v kept, %d keys; want nothing, %d", got, len(b.stems), maxHeatKeys)
	}
	upd := route.Stem{Len: 4, Depth: 3, Hash: 6}
	b.setStem(3, upd)
	if got := b.stem(3); got != upd {
		t.Fatalf("known key on a full map: %+v, want %+v", got, upd)
	}
}

func TestLoadBookSeq(t *testing.T) {
	tests := []struct {
		name string
		obs  []float64
		want float64
	}{
		{"none", nil, 0},
		{"first sets", []float64{800}, 800},
		{"then a sixteenth", []float64{800, 2400}, 900},
		{"non-positive ignored", []float64{800, 0, -5}, 800},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newLoadBook()
			for _, ms := range tt.obs {
				b.observe("a", ms)
			}
			cands := []route.Candidate{{Detail: &route.Detail{ID: "a"}}, {Detail: &route.Detail{ID: "b"}}, {Detail: &route.Detail{ID: "a", SeqMs: 5}}}
			b.fill(cands)
			if cands[0].SeqMs() != tt.want || cands[1].SeqMs() != 0 || cands[2].SeqMs() != 5 {
				t.Fatalf("SeqMs %v %v %v, want %v 0 5 (the view's own kept)", cands[0].SeqMs(), cands[1].SeqMs(), cands[2].SeqMs(), tt.want)
			}
		})
	}
}

func TestSlotMs(t *testing.T) {
	t0 := time.Unix(100, 0)
	tests := []struct {
		name        string
		first, last time.Time
		miss        int
		blockMs     float64
		want        float64
	}{
		{"decode plus prefill", t0, t0.Add(300 * time.Millisecond), 5, 20, 400},
		{"no first byte", time.Time{}, t0, 5, 20, 0},
		{"clock went back", t0, t0.Add(-time.Second), 5, 20, 0},
		{"negative miss", t0, t0.Add(50 * time.Millisecond), -1, 20, 50},
	}
	for _, tt := range tests {
		if got := slotMs(tt.first, tt.last, tt.miss, tt.blockMs); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The proxy counts its in-flight requests by heat key while they run and
// forgets them when they end, and times successful requests only.
func TestProxyLoadBook(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 4)
	good := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		sseChat(w, []string{"a", "b"}, -1)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: good.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // a test failed before it ends: before the servers close, which wait for the handlers
	body := chatBody("m", true, "the same long prompt that two clients send at once, many blocks long")

	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Not post and readAll: their t.Fatal belongs to the test's goroutine.
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Errorf("reading response: %v", err)
			}
		}()
	}
	for range 2 {
		recv(t, arrived, "the requests at the replica")
	}
	p.load.mu.Lock()
	keys, count := len(p.load.heat), 0
	for _, n := range p.load.heat {
		count = n
	}
	p.load.mu.Unlock()
	if keys != 1 || count != 2 {
		t.Fatalf("in flight: %d keys, count %d; want one key counting 2", keys, count)
	}
	free()
	waitGroup(t, &wg, "the clients' responses")
	waitCounted(t, p, epChat, 2) // the clients had their last byte before the handlers' releases
	p.load.mu.Lock()
	keys = len(p.load.heat)
	seq := p.load.seq[good.URL]
	stems := len(p.load.stems)
	p.load.mu.Unlock()
	if keys != 0 {
		t.Fatalf("%d heat keys left after the requests ended", keys)
	}
	// Each finished request became the record of its heat key.
	if stems != 1 {
		t.Fatalf("%d stem records after two requests under one heat key, want 1", stems)
	}
	// The replica held no prefix (match 0): the slot time includes the
	// estimated prefill of every block, at least one.
	if min := route.DefaultPolicy().DefaultBlockMs; seq < min {
		t.Fatalf("slot time %v ms, want at least the prefill estimate %v", seq, min)
	}

	bad := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})
	view2 := newFakeView([]string{"m"}, fakeReplica{id: bad.URL})
	p2, srv2, _ := newTestProxy(t, view2, nil)
	readAll(t, post(t, context.Background(), srv2.URL+"/v1/chat/completions", body))
	waitCounted(t, p2, epChat, 1)
	p2.load.mu.Lock()
	_, timed := p2.load.seq[bad.URL]
	keys = len(p2.load.heat)
	stems = len(p2.load.stems)
	p2.load.mu.Unlock()
	if timed || keys != 0 || stems != 0 {
		t.Fatalf("refused request: timed %v, %d heat keys, %d stem records left; want none", timed, keys, stems)
	}
}

// The age of the oldest request in flight at an owned replica dates its
// next free slot; it follows the requests as they end, in any order.
func TestLoadBookSlotAge(t *testing.T) {
	b := newLoadBook()
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	end1 := b.dispatch("a", true)
	now = now.Add(time.Second)
	end2 := b.dispatch("a", true)
	now = now.Add(time.Second)
	end3 := b.dispatch("a", true)
	age := func() float64 {
		cands := []route.Candidate{{Detail: &route.Detail{ID: "a"}}, {Detail: &route.Detail{ID: "b"}}}
		b.fill(cands)
		if cands[1].SlotAgeMs() != 0 {
			t.Fatalf("replica with nothing in flight has age %v", cands[1].SlotAgeMs())
		}
		return cands[0].SlotAgeMs()
	}
	if got := age(); got != 2000 {
		t.Fatalf("age %v ms, want 2000 (the first request's)", got)
	}
	end2() // a younger request ending changes nothing
	if got := age(); got != 2000 {
		t.Fatalf("after the second ended: age %v, want 2000", got)
	}
	end1()
	end1()
	// The third began now: its age is 0, floored to 1 µs (0 is unknown).
	if got := age(); got != 1e-3 {
		t.Fatalf("after the first ended: age %v, want the third's (floored to 1e-3)", got)
	}
	end3()
	if got := age(); got != 0 || len(b.runs) != 0 {
		t.Fatalf("all ended: age %v, %d replicas tracked; want 0 and none", got, len(b.runs))
	}
}

// A full owned replica gets the owner's estimate of when its first running
// request ends (route.Detail.FreeMs), from the slot times seen there and
// the ages of the requests it runs: with heavy-tailed slot times, a request
// running past most of them is expected to run on. A replica with a free
// slot, or with no slot time seen, gets none (route does not ask it).
func TestLoadBookFreeMs(t *testing.T) {
	b := newLoadBook()
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	for i := range 200 {
		if i%10 == 0 {
			b.observe("a", 60000)
		} else {
			b.observe("a", 500)
		}
	}
	b.dispatch("a", true)
	b.dispatch("c", true) // no slot time seen at c
	now = now.Add(3 * time.Second)
	cands := []route.Candidate{
		{EngineLoad: route.EngineLoad{Slots: 1}, InFlight: 1, Detail: &route.Detail{ID: "a"}},
		{EngineLoad: route.EngineLoad{Slots: 2}, InFlight: 1, Detail: &route.Detail{ID: "a"}},
		{EngineLoad: route.EngineLoad{Slots: 1}, InFlight: 1, Detail: &route.Detail{ID: "c"}},
	}
	b.fill(cands)
	if got, mean := cands[0].Detail.FreeMs, cands[0].SeqMs(); !(got > 10000) || !(got > mean) {
		t.Fatalf("full replica: free in %v ms (mean %v), want a long answer's remaining time, > 10 s", got, mean)
	}
	if got := cands[1].Detail.FreeMs; got != 0 {
		t.Fatalf("replica with a free slot: FreeMs %v, want 0 (not asked)", got)
	}
	if got := cands[2].Detail.FreeMs; got != 0 {
		t.Fatalf("no slot time seen: FreeMs %v, want 0 (unknown)", got)
	}
}

// TestLoadFillNilDetail: a candidate without a Detail has no ID to look up
// and nowhere to write: fill leaves it as the zero Detail and fills the
// others.
func TestLoadFillNilDetail(t *testing.T) {
	b := newLoadBook()
	b.observe("a", 800)
	cands := []route.Candidate{{}, {Detail: &route.Detail{ID: "a"}}}
	b.fill(cands)
	if cands[0].Detail != nil || cands[0].SeqMs() != 0 || cands[1].SeqMs() != 800 {
		t.Fatalf("Detail %v, SeqMs %v and %v, want nil, 0 and 800", cands[0].Detail, cands[0].SeqMs(), cands[1].SeqMs())
	}
}
