package mesh

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
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
