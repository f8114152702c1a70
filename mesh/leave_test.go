package mesh

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLeaveWait(t *testing.T) {
	const tick = 100 * time.Millisecond
	tests := []struct {
		peers int
		want  time.Duration
	}{
		{0, 0},          // nobody to tell: memberlist does not wait either
		{1, 6 * tick},   // 4 sends, 1 a round: 4 rounds, + 2
		{2, 4 * tick},   // 4 sends, 2 a round
		{3, 4 * tick},   // 4 sends, 3 a round: 2 rounds
		{8, 4 * tick},   // 9 routers: ⌈log10(10)⌉ = 1
		{9, 5 * tick},   // 10 routers: 8 sends, 3 a round: 3 rounds
		{200, 6 * tick}, // 201 routers: 12 sends, 3 a round: 4 rounds
	}
	for _, tc := range tests {
		if got := leaveWait(tick, tc.peers); got != tc.want {
			t.Errorf("leaveWait(%v, %d) = %v, want %v", tick, tc.peers, got, tc.want)
		}
	}
}

// TestCloseAllAtOnce is issue 24's shutdown: three routers closed at the
// same moment each leave while the others do. Each leave finds fewer
// peers to hear it, or none; none of that is an error, and none of them
// waits out its whole timeout for a broadcast nobody can receive.
func TestCloseAllAtOnce(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	c := newRouter(t, "c", joining(a))
	routers := []*testRouter{a, b, c}
	eventually(t, 10*time.Second, "a mesh of three", func() error {
		for _, r := range routers {
			if n := r.alivePeers(); n != 2 {
				return fmt.Errorf("%s sees %d peers", r.cfg.Name, n)
			}
		}
		return nil
	})
	// A timeout far over what a leave needs (leaveWait: 80 ms at the test
	// profile's 20 ms gossip): a close that waited it out would show.
	const timeout = time.Minute
	var wg sync.WaitGroup
	errs := make([]error, len(routers))
	took := make([]time.Duration, len(routers))
	for i, r := range routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			errs[i] = r.Close(ctx)
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, r := range routers {
		if errs[i] != nil {
			t.Errorf("%s: Close: %v", r.cfg.Name, errs[i])
		}
		// Generous for a loaded machine, and still far below the timeout.
		if took[i] > 20*time.Second {
			t.Errorf("%s: Close took %v", r.cfg.Name, took[i])
		}
		if !strings.Contains(r.logs.String(), "left the mesh") {
			t.Errorf("%s logged no leave:\n%s", r.cfg.Name, r.logs.String())
		}
		t.Logf("%s closed in %v", r.cfg.Name, took[i].Round(time.Millisecond))
	}
}
