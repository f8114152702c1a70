//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// stalledStream sends a streaming chat request over a connection with a
// small receive buffer and never reads: a stalled reader.
func stalledStream(t *testing.T, url string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := chatBody("m", true, longPrompt)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return c
}

// endlessReplica streams tokens until its client goes away, and reports
// that on gone.
func endlessReplica(t *testing.T, gone chan<- struct{}) *replicaServer {
	tok := strings.Repeat("x", 200)
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		defer func() {
			select {
			case gone <- struct{}{}:
			default: // reported already (a request retried): never hold the handler
			}
		}()
		for {
			if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			default:
			}
		}
	})
}

// TestWriteTimeoutEndsStalledStream: a client that reads nothing of its
// stream has its request ended once a write waited WriteTimeout (by the
// normal path, and after the stream loop handed it back): counted as a
// write timeout, the replica's request cancelled, nothing left in flight.
func TestWriteTimeoutEndsStalledStream(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("no_loop=%v", off), func(t *testing.T) {
			gone := make(chan struct{}, 1)
			rep := endlessReplica(t, gone)
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
			p, srv, _ := newTestProxy(t, view, func(c *Config) {
				c.NoStreamLoop = off
				c.WriteTimeout = 100 * time.Millisecond
			})
			stalledStream(t, srv.URL)
			view.waitDone(t)
			select {
			case <-gone:
			case <-time.After(10 * time.Second):
				t.Fatal("the replica's request was never cancelled")
			}
			// The handler still releases what it held after both.
			waitCounted(t, p, epChat, 1)
			if n := testutil.ToFloat64(p.edge.rejected.WithLabelValues(rejectWriteTimeout)); n != 1 {
				t.Errorf("write timeouts counted: %v, want 1", n)
			}
			if n := testutil.ToFloat64(p.m.requests.WithLabelValues(epChat, "499")); n != 1 {
				t.Errorf("499s counted: %v, want 1", n)
			}
			requireReleased(t, p, rep.URL)
		})
	}
}

// TestWriteTimeoutLiftedForNextRequest: the write deadline a stream left
// on its connection (net/http lifts it after each response) does not fail
// the connection's next answer, however long after it comes.
func TestWriteTimeoutLiftedForNextRequest(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, deltas(20, 8), 3) })
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	// The stream's writes must all meet the timeout (20 ms is too short:
	// under a loaded -race run a handler descheduled between its deadline
	// and its write misses it and the stream is cut), and the next
	// request comes after it has passed.
	const writeTimeout = 500 * time.Millisecond
	_, srv, _ := newTestProxy(t, view, func(c *Config) { c.WriteTimeout = writeTimeout })
	c, br, resp := rawStream(t, srv.URL)
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	view.waitDone(t)
	time.Sleep(writeTimeout + 100*time.Millisecond) // the deadline is in the past now
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	next, err := http.ReadResponse(br, nil)
	if err != nil || next.StatusCode != 200 {
		t.Fatalf("next request on the connection: %v", err)
	}
	next.Body.Close()
}

// TestUpstreamIdleTimeoutSparesSlowClient: a stream whose client stops
// reading for longer than UpstreamIdleTimeout (but within WriteTimeout)
// is not cut for the upstream's silence: the router, not the replica,
// was waiting (on the client), and the stream arrives whole once the
// client reads again; by the normal path and after the loop handed it back.
func TestUpstreamIdleTimeoutSparesSlowClient(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("no_loop=%v", off), func(t *testing.T) {
			const events = 40000 // 8 MB: more than the sockets between hold
			tok := strings.Repeat("x", 150)
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for range events {
					if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok); err != nil {
						return
					}
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
			p, srv, _ := newTestProxy(t, view, func(c *Config) {
				c.NoStreamLoop = off
				c.WriteTimeout = 30 * time.Second
				// A loaded machine (-race, 2 cores, load 10+) may not
				// schedule the replica's writer for a second or more
				// (2 s cut a stream once in CI's -race run).
				c.UpstreamIdleTimeout = 4 * time.Second
			})
			c := stalledStream(t, srv.URL)
			time.Sleep(6 * time.Second) // the router's writes wait on the client, past the idle timeout
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("stream not whole (%d bytes, %v; idle timeouts %v)", len(b), err, idleTimeouts(p))
			}
			if n := strings.Count(string(b), "data: {"); n != events {
				t.Errorf("got %d events, want %d", n, events)
			}
			if n := idleTimeouts(p); n != 0 {
				t.Errorf("idle timeouts counted: %v, want 0", n)
			}
			if n := testutil.ToFloat64(p.m.loopClientWaits); !off && n != 1 {
				t.Errorf("loop handbacks to a waiting client: %v, want 1", n)
			}
		})
	}
}
