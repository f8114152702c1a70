package mesh

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestWatchGone: a watcher hears of a router cut off from the mesh once,
// and of nothing after it stopped watching.
func TestWatchGone(t *testing.T) {
	p := &partitioner{}
	var rs []*testRouter
	for i, name := range []string{"a", "b"} {
		tr, _ := p.transport(t, i)
		rs = append(rs, newRouter(t, name, func(c *Config) {
			c.Transport = tr
			if i > 0 {
				joining(rs[0])(c)
			}
		}))
	}
	a := rs[0]
	alive := func(n int) func() error {
		return func() error {
			if got := members(a.Mesh); got != n {
				return fmt.Errorf("a sees %d alive", got)
			}
			return nil
		}
	}
	eventually(t, wait, "two routers", alive(2))
	var mu sync.Mutex
	var got []string
	stop := a.WatchGone(func(api string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, api)
	})
	heard := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}

	p.set(true)
	eventually(t, wait, "a tells its watcher b is gone", func() error {
		if h := heard(); !slices.Equal(h, []string{"http://b.test"}) {
			return fmt.Errorf("gone: %q, want [http://b.test]", h)
		}
		return nil
	})

	// After stop, nothing more (b comes back and goes again).
	stop()
	p.set(false)
	eventually(t, wait, "b back", alive(2))
	p.set(true)
	eventually(t, wait, "b gone again", alive(1))
	if h := heard(); len(h) != 1 {
		t.Fatalf("gone after stop: %q", h)
	}
}
