package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRefusedDrainIsBounded: a replica that refuses with a 503 whose body
// never comes (its head promises more than it sends, then it stalls) does
// not hold the retry: the drain gives up after its bound (here the idle
// timeout, shorter than refusedDrainTimeout), the refusing connection is
// closed, and the request is served by the next replica; by the own
// client and by net/http.
func TestRefusedDrainIsBounded(t *testing.T) {
	for _, cl := range idleClients {
		t.Run(cl.name, func(t *testing.T) {
			gone := make(chan struct{}, 1)
			stalling := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				c, bw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				fmt.Fprint(bw, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"error\":")
				bw.Flush()
				_, _ = c.Read(make([]byte, 1)) // until the router closes it
				gone <- struct{}{}
			})
			good := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "fine", 0) })
			view := newFakeView([]string{"m"}, fakeReplica{id: stalling.URL, match: 5}, fakeReplica{id: good.URL})
			_, srv, _ := newTestProxy(t, view, func(c *Config) {
				cl.set(c)
				c.UpstreamIdleTimeout = 100 * time.Millisecond
			})
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
			if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "fine") {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			recv(t, gone, "the refusing replica's connection closed")
			if stalling.count() != 1 || good.count() != 1 {
				t.Errorf("hits %d and %d, want 1 and 1", stalling.count(), good.count())
			}
		})
	}
}
