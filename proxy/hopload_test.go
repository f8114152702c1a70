package proxy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// clockFunc is a loadClock.
type clockFunc func(id string) (time.Time, bool)

func (f clockFunc) LoadHeard(id string) (time.Time, bool) { return f(id) }

// TestHopBookAddsWhatTheOwnerHasNotSaid: a remote candidate's load gets
// the requests this router sent it after the owner's last state, their
// prefill until the first byte, nothing once they end; an owned, unknown
// or stale candidate gets nothing.
func TestHopBookAddsWhatTheOwnerHasNotSaid(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b := newHopBook()
	b.now = func() time.Time { return now }
	heard := map[string]time.Time{"a": t0.Add(5 * time.Millisecond), "b": t0.Add(-time.Second), "s": t0.Add(-time.Second)}
	clock := clockFunc(func(id string) (time.Time, bool) { h, ok := heard[id]; return h, ok })

	_, doneA1 := b.send("a", 10) // before a's last state: in it already
	now = t0.Add(10 * time.Millisecond)
	firstA2, _ := b.send("a", 7)
	_, _ = b.send("b", 3)
	firstB2, doneB2 := b.send("b", 4)
	_, _ = b.send("own", 5) // owned here: the clock does not know it
	_, _ = b.send("s", 6)   // stale below
	firstB2()
	cands := func() []route.Candidate {
		cs := []route.Candidate{{Detail: &route.Detail{ID: "a"}, InFlight: 2, PendingPrefillBlocks: 1}, {Detail: &route.Detail{ID: "b"}}, {Detail: &route.Detail{ID: "own"}, InFlight: 1}, {Detail: &route.Detail{ID: "s"}, Stale: true}}
		b.fill(cs, clock)
		return cs
	}
	type want struct {
		inFlight int
		pending  float64
	}
	check := func(step string, cs []route.Candidate, w map[string]want) {
		t.Helper()
		for _, c := range cs {
			if g := (want{int(c.InFlight), c.PendingPrefillBlocks}); g != w[c.ID()] {
				t.Errorf("%s: %s has %+v, want %+v", step, c.ID(), g, w[c.ID()])
			}
		}
	}
	check("sent", cands(), map[string]want{"a": {3, 8}, "b": {2, 3}, "own": {1, 0}, "s": {0, 0}})
	firstA2()
	doneB2()
	doneA1()
	check("after a first byte and two ends", cands(), map[string]want{"a": {3, 1}, "b": {1, 3}, "own": {1, 0}, "s": {0, 0}})
	heard["a"] = now // the owner's next state counts them itself
	check("owner heard again", cands(), map[string]want{"a": {2, 1}, "b": {1, 3}, "own": {1, 0}, "s": {0, 0}})
	now = now.Add(hopMarkFresh + time.Second) // long since: the owners have said it
	check("long after", cands(), map[string]want{"a": {2, 1}, "b": {0, 0}, "own": {1, 0}, "s": {0, 0}})
	b.fill(nil, nil) // no clock, no candidates: nothing to do
	if n := b.inFlight("b"); n != 1 {
		t.Errorf("%d requests to b remembered, want 1", n)
	}
}

// TestForwardedRequestCounts: a request this router forwards to another
// router's replica is in its hop book until it ends.
func TestForwardedRequestCounts(t *testing.T) {
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		jsonChat(w, "ok", 0)
	})
	_, owner, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), nil)
	p, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, owner: owner.URL}), nil)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the servers close, which wait for the handler
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, longPrompt)))
		if err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.hops.inFlight(rep.URL) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the forwarded request never counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	free()
	recv(t, done, "the client's response")
	for p.hops.inFlight(rep.URL) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the forwarded request still counts after it ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHopValue: the deciding router's counts ride the hop header and
// read back; junk reads as unknown; an earlier version's "1" is plain.
func TestHopValue(t *testing.T) {
	for _, tc := range []struct {
		c, f         int
		want         string
		backC, backF int
	}{
		{0, 0, "1", 0, 0},
		{1, 0, "1", 0, 0},
		{3, 0, "1;c=3", 3, 0},
		{0, 24, "1;f=24", 0, 24},
		{5, 7, "1;c=5;f=7", 5, 7},
		{1 << 30, 0, "1;c=1048576", 1 << 20, 0},
	} {
		if got := hopValue(tc.c, tc.f); got != tc.want {
			t.Errorf("hopValue(%d, %d) = %q, want %q", tc.c, tc.f, got, tc.want)
		}
		if c, f := parseHop(tc.want); c != tc.backC || f != tc.backF {
			t.Errorf("parseHop(%q) = %d, %d", tc.want, c, f)
		}
	}
	for _, junk := range []string{"", "1;", "1;c=", "1;c=-4", "1;f=x", "1;c=99999999999", ";;;", "1;z=3",
		"1;c=+5", "1;c=05", "1;c= 5", "1;c=5 ", "1;c=1048577", "1;c=3;c=3", "1;f=2;f=9", "2;c=3", "x;c=3", "c=3",
		"1;c=3;" + strings.Repeat("z", maxHopValue)} {
		if c, f := parseHop(junk); c != 0 || f != 0 {
			t.Errorf("parseHop(%q) = %d, %d, want 0, 0", junk, c, f)
		}
	}
	// A later version's field is skipped; a bad count leaves the other.
	for v, want := range map[string][2]int{"1;z=3;c=4": {4, 0}, "1;c=4;f=0x1": {4, 0}, "1;c=7;c=8;f=2": {0, 2}} {
		if c, f := parseHop(v); c != want[0] || f != want[1] {
			t.Errorf("parseHop(%q) = %d, %d, want %v", v, c, f, want)
		}
	}
}

// FuzzParseHop: whatever a stranger puts in the header, the counts are
// in range and stable: written back by hopValue they read the same.
func FuzzParseHop(f *testing.F) {
	for _, s := range []string{"1", "1;c=3", "1;f=24", "1;c=5;f=7", "1;c=1048576;f=1048576", "1;c=05", "1;c=3;c=4",
		"1;z=9;f=2", "2;c=3", "1;c=-1", ";", "1;c=" + strings.Repeat("9", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c, fk := parseHop(v)
		if c < 0 || c > maxHopCount || fk < 0 || fk > maxHopCount {
			t.Fatalf("parseHop(%q) = %d, %d: out of range", v, c, fk)
		}
		wc := c
		if wc == 1 {
			wc = 0 // hopValue leaves out what says nothing
		}
		if c2, f2 := parseHop(hopValue(c, fk)); c2 != wc || f2 != fk {
			t.Fatalf("parseHop(%q) = %d, %d; written back as %q, read %d, %d", v, c, fk, hopValue(c, fk), c2, f2)
		}
	})
}

// TestSignedHopCarriesCounts: the counts are under the hop's MAC: the
// owner verifies a hop that carries them, and refuses one whose counts
// were changed on the way.
func TestSignedHopCarriesCounts(t *testing.T) {
	key := HopKey([]byte("0123456789abcdef0123456789abcdef"))
	p, _, _ := newTestProxy(t, newFakeView([]string{"m"}), func(c *Config) { c.HopKey = key })
	out, _ := http.NewRequest(http.MethodPost, "http://owner/v1/chat/completions", nil)
	p.signHop(out, "http://replica", 3, 4, 9)
	if hop, auth := p.hopOf(out.Clone(out.Context())); !hop || !auth {
		t.Fatalf("a signed hop with counts is not accepted (hop %v, authenticated %v)", hop, auth)
	}
	if c, f := parseHop(out.Header.Get(HeaderHop)); c != 4 || f != 9 {
		t.Errorf("the hop carries %d, %d", c, f)
	}
	forged := out.Clone(out.Context())
	forged.Header.Set(HeaderHop, "1;c=400")
	if _, auth := p.hopOf(forged); auth {
		t.Error("a hop whose counts were changed is authenticated")
	}
}

// TestHopBookFollowsTheOwner: a request the owner sent to another of its
// replicas than the hinted one counts there (the dispatch 103 names it),
// in dispatch order, until it ends.
func TestHopBookFollowsTheOwner(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b := newHopBook()
	b.now = func() time.Time { return now }
	m1, _, done1 := b.sendMark("a", 4)
	now = now.Add(time.Millisecond)
	_, _, _ = b.sendMark("b", 1)
	b.move(m1, "b") // older than b's mark: goes first
	if q := b.marks["b"]; len(q) != 2 || q[0] != m1 || b.inFlight("a") != 0 {
		t.Fatalf("after the move: a has %d, b %v", b.inFlight("a"), q)
	}
	b.move(m1, "b") // again: nothing
	b.move(nil, "c")
	done1()
	if b.inFlight("b") != 1 {
		t.Errorf("b has %d after the moved request ended, want 1", b.inFlight("b"))
	}
	b.move(m1, "c") // ended: stays gone
	if b.inFlight("c") != 0 {
		t.Error("an ended request moved")
	}
}

// TestDispatchNamesTheReplica: when the owner decides again (it does not
// have the hinted replica among its own), the entry's hop book counts the
// request at the replica the owner's 103 names.
func TestDispatchNamesTheReplica(t *testing.T) {
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		jsonChat(w, "ok", 0)
	})
	_, owner, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.HopKey = testHopKey })
	const hinted = "http://gone:8000"
	p, entry, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: hinted, owner: owner.URL, match: 20}, fakeReplica{id: rep.URL, owner: owner.URL}),
		func(c *Config) { c.HopKey = testHopKey })
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(entry.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, longPrompt)))
		if err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.hops.inFlight(rep.URL) != 1 || p.hops.inFlight(hinted) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("hop book: %d at the hint, %d where it runs, want 0 and 1", p.hops.inFlight(hinted), p.hops.inFlight(rep.URL))
		}
		time.Sleep(5 * time.Millisecond)
	}
	free()
	recv(t, done, "the client's response")
}

// TestHopBookFillAsksTheClockUnlocked: fill reads the owners' clocks (the
// mesh's lock) without the book's lock, which a commit takes under the
// placement lock: a decision never waits for gossip through it.
func TestHopBookFillAsksTheClockUnlocked(t *testing.T) {
	b := newHopBook()
	t0 := time.Unix(1000, 0)
	b.now = func() time.Time { return t0 }
	for _, id := range []string{"a", "b"} {
		b.send(id, 2)
	}
	asked := 0
	clock := clockFunc(func(id string) (time.Time, bool) {
		asked++
		if !b.mu.TryLock() {
			t.Errorf("LoadHeard(%s) asked under the hop book's lock", id)
			return time.Time{}, false
		}
		b.mu.Unlock()
		return t0.Add(-time.Second), true
	})
	cs := []route.Candidate{{Detail: &route.Detail{ID: "a"}}, {Detail: &route.Detail{ID: "b"}}}
	b.fill(cs, clock)
	if asked != 2 || cs[0].InFlight != 1 || cs[1].InFlight != 1 || cs[0].PendingPrefillBlocks != 2 || cs[0].Detail.Own != 1 {
		t.Fatalf("asked %d clocks; candidates %+v %+v", asked, cs[0], cs[1])
	}
}

// TestOwnerRedecidesWithTheHopsCounts: an owner that cannot keep the
// hint (its replica holds the prefix but has no free slot) decides again
// with the deciding router's Concurrent and ForkBlocks from the hop, as
// the simulator's owner does: one request alone waits at the holder; one
// of several concurrent ones for the prefix, or one forking from a stem
// it shares, starts at once on another replica of the owner's.
func TestOwnerRedecidesWithTheHopsCounts(t *testing.T) {
	prompt := chatBody("m", false, longPrompt)
	for _, tc := range []struct {
		name, hop string
		holder    bool
	}{
		{"no counts: the holder", "1", true},
		{"alone: the holder", "1;c=1", true},
		{"several for the prefix: another replica", "1;c=3", false},
		{"a stem's fork: another replica", "1;f=1000", false},
		{"the largest count acts as any over the holders", "1;c=1048576", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chat := func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) }
			holder := newReplica(t, chat)
			others := []*replicaServer{newReplica(t, chat), newReplica(t, chat), newReplica(t, chat)}
			// The holder: two requests ahead for its 4 slots (2 s of
			// wait at 4 s a sequence); the others idle, holding nothing.
			rs := []fakeReplica{{id: holder.URL, match: 1 << 20, slots: 4, inFlight: 5, seqMs: 4000}}
			for _, o := range others {
				rs = append(rs, fakeReplica{id: o.URL, slots: 4, seqMs: 4000})
			}
			// The test sends the hop itself: an insecure mesh's owner.
			_, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, rs...), func(c *Config) { c.InsecureHops = true })
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(prompt))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(HeaderHop, tc.hop)
			req.Header.Set(HeaderReplica, holder.URL)
			req.Header.Set(HeaderMatch, "1000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := holder.count() == 1; got != tc.holder {
				t.Fatalf("served at the holder %v, want %v", got, tc.holder)
			}
		})
	}
}
