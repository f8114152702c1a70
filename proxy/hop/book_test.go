package hop

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// clockFunc is a Clock.
type clockFunc func(id string) (time.Time, bool)

func (f clockFunc) LoadHeard(id string) (time.Time, bool) { return f(id) }

// TestHopBookAddsWhatTheOwnerHasNotSaid: a remote candidate's load gets
// the requests this router sent it after the owner's last state, their
// prefill until the first byte, nothing once they end; an owned, unknown
// or stale candidate gets nothing.
func TestHopBookAddsWhatTheOwnerHasNotSaid(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b := NewBook()
	b.now = func() time.Time { return now }
	heard := map[string]time.Time{"a": t0.Add(5 * time.Millisecond), "b": t0.Add(-time.Second), "s": t0.Add(-time.Second)}
	clock := clockFunc(func(id string) (time.Time, bool) { h, ok := heard[id]; return h, ok })

	_, doneA1 := b.Send("a", 10) // before a's last state: in it already
	now = t0.Add(10 * time.Millisecond)
	firstA2, _ := b.Send("a", 7)
	_, _ = b.Send("b", 3)
	firstB2, doneB2 := b.Send("b", 4)
	_, _ = b.Send("own", 5) // owned here: the clock does not know it
	_, _ = b.Send("s", 6)   // stale below
	firstB2()
	cands := func() []route.Candidate {
		cs := []route.Candidate{{Detail: &route.Detail{ID: "a"}, InFlight: 2, PendingPrefillBlocks: 1}, {Detail: &route.Detail{ID: "b"}}, {Detail: &route.Detail{ID: "own"}, InFlight: 1}, {Detail: &route.Detail{ID: "s"}, Stale: true}}
		b.Fill(cs, clock)
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
	b.Fill(nil, nil) // no clock, no candidates: nothing to do
	if n := b.InFlight("b"); n != 1 {
		t.Errorf("%d requests to b remembered, want 1", n)
	}
}

// TestHopBookFollowsTheOwner: a request the owner sent to another of its
// replicas than the hinted one counts there (the dispatch 103 names it),
// in dispatch order, until it ends.
func TestHopBookFollowsTheOwner(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b := NewBook()
	b.now = func() time.Time { return now }
	m1, _, done1 := b.SendMark("a", 4)
	now = now.Add(time.Millisecond)
	_, _, _ = b.SendMark("b", 1)
	b.Move(m1, "b") // older than b's mark: goes first
	if q := b.marks["b"]; len(q) != 2 || q[0] != m1 || b.InFlight("a") != 0 {
		t.Fatalf("after the move: a has %d, b %v", b.InFlight("a"), q)
	}
	b.Move(m1, "b") // again: nothing
	b.Move(nil, "c")
	done1()
	if b.InFlight("b") != 1 {
		t.Errorf("b has %d after the moved request ended, want 1", b.InFlight("b"))
	}
	b.Move(m1, "c") // ended: stays gone
	if b.InFlight("c") != 0 {
		t.Error("an ended request moved")
	}
}

// TestHopBookFillAsksTheClockUnlocked: fill reads the owners' clocks (the
// mesh's lock) without the book's lock, which a commit takes under the
// placement lock: a decision never waits for gossip through it.
func TestHopBookFillAsksTheClockUnlocked(t *testing.T) {
	b := NewBook()
	t0 := time.Unix(1000, 0)
	b.now = func() time.Time { return t0 }
	for _, id := range []string{"a", "b"} {
		b.Send(id, 2)
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
	b.Fill(cs, clock)
	if asked != 2 || cs[0].InFlight != 1 || cs[1].InFlight != 1 || cs[0].PendingPrefillBlocks != 2 || cs[0].Detail.Own != 1 {
		t.Fatalf("asked %d clocks; candidates %+v %+v", asked, cs[0], cs[1])
	}
}
