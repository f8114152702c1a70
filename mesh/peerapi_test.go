package mesh

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// TestPeerAPIsAndLoadHeard: a router lists its live peers' API addresses
// (not its own), and knows when it last heard the load of a replica a
// peer owns, not of one it owns itself.
func TestPeerAPIsAndLoadHeard(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	c := newRouter(t, "c", joining(a))
	eventually(t, wait, "peers listed", func() error {
		if got := a.PeerAPIs(); !slices.Equal(got, []string{"http://b.test", "http://c.test"}) {
			return fmt.Errorf("a lists %v", got)
		}
		return nil
	})
	declare(b, "http://only-b:8000")
	start := time.Now()
	eventually(t, wait, "b's state heard at a", func() error {
		at, ok := a.LoadHeard("http://only-b:8000")
		if !ok || at.Before(start) {
			return errors.New("not heard yet")
		}
		return nil
	})
	if _, ok := b.LoadHeard("http://only-b:8000"); ok {
		t.Error("b reports hearing the load of the replica it owns")
	}
	if _, ok := c.LoadHeard("http://unknown:8000"); ok {
		t.Error("a replica nobody declared has a load time")
	}
}

// TestHearLoad: the load an owner reports on a hop's dispatch 103 replaces
// its last gossiped one at the forwarding router until the owner's next
// state; an older report, or one about a replica the router owns or does
// not know, changes nothing.
func TestHearLoad(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	const id = "http://only-b:8000"
	declare(b, id)
	eventually(t, wait, "b's replica known at a", func() error {
		if _, ok := a.LoadHeard(id); !ok || len(a.Candidates("m", nil)) != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	heard, _ := a.LoadHeard(id)
	a.HearLoad(id, route.Candidate{InFlight: 99, PendingPrefillBlocks: 99}, heard.Add(-time.Millisecond))
	if c := a.Candidates("m", nil)[0]; c.InFlight == 99 {
		t.Error("a report older than the owner's state was applied")
	}
	at := time.Now()
	a.HearLoad(id, route.Candidate{InFlight: 7, PendingPrefillBlocks: 12.5, Running: 3, Waiting: 4, Slots: 5}, at)
	c := a.Candidates("m", nil)[0]
	if h, _ := a.LoadHeard(id); h.Equal(at) {
		// No state from b came in between.
		if c.InFlight != 7 || c.PendingPrefillBlocks != 12.5 || c.Running != 3 || c.Waiting != 4 || c.Slots != 5 {
			t.Errorf("after the report a sees %+v", c)
		}
	}
	b.HearLoad(id, route.Candidate{InFlight: 42}, time.Now()) // b owns it
	if c := b.Candidates("m", nil)[0]; c.InFlight == 42 {
		t.Error("a report about an owned replica was applied")
	}
	a.HearLoad("http://unknown:8000", route.Candidate{InFlight: 1}, time.Now())
}
