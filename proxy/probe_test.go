package proxy

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Each request sent to an owned replica tells ProbeLoad how many this
// router then has in flight there, counting those still running: the
// count the health checker compares with what the engine was seen
// running.
func TestProbeLoadToldTheInFlightCount(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 2)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		jsonChat(w, "ok", 0)
	})
	var mu sync.Mutex
	var told []int
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, func(c *Config) {
		c.ProbeLoad = func(id string, n int) {
			if id != rep.URL {
				t.Errorf("probe of %s, want %s", id, rep.URL)
			}
			mu.Lock()
			told = append(told, n)
			mu.Unlock()
		}
	})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	done := make(chan int, 2)
	send := func() {
		go func() {
			resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", false, strings.Repeat("hello ", 20)))
			_ = readAll(t, resp)
			done <- resp.StatusCode
		}()
	}
	for range 2 {
		send()
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatal("no request reached the replica")
		}
	}
	close(release)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("status %d", code)
		}
	}
	send() // after both ended: one in flight again
	if code := <-done; code != http.StatusOK {
		t.Errorf("status %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(told, []int{1, 2, 1}) {
		t.Errorf("ProbeLoad told %v, want [1 2 1]", told)
	}
}
