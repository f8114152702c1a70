package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// silentReplica sends its headers and two events of a stream, then
// nothing until its request is cancelled (its connection closed), which
// it reports on gone.
func silentReplica(t *testing.T, gone chan<- struct{}) *replicaServer {
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 2 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
		gone <- struct{}{}
	})
}

// idleClients are the router's two ways to a replica: its own upstream
// client (upstream.go), and net/http's (hops, TLS), which a wrapped
// transport forces.
var idleClients = []struct {
	name string
	set  func(*Config)
}{
	{"own", func(*Config) {}},
	{"nethttp", func(c *Config) {
		c.Client = &http.Client{Transport: wrappedTransport{http.DefaultTransport.(*http.Transport).Clone()}}
	}},
}

// TestUpstreamIdleTimeoutEndsSilentStream: a replica that goes silent
// mid-stream has its response ended once UpstreamIdleTimeout passed: the
// client gets the events sent before, then an error event and a clean end
// (midstream.go), the replica's connection is closed (its request
// cancelled), and the timeout is counted; with the stream loop and
// without it, by the own client and by net/http.
func TestUpstreamIdleTimeoutEndsSilentStream(t *testing.T) {
	for _, cl := range idleClients {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/no_loop=%v", cl.name, off), func(t *testing.T) {
				gone := make(chan struct{}, 1)
				rep := silentReplica(t, gone)
				view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
				p, srv, _ := newTestProxy(t, view, func(c *Config) {
					cl.set(c)
					c.NoStreamLoop = off
					c.UpstreamIdleTimeout = 200 * time.Millisecond
				})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
				defer resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				before, e := readCutStream(t, resp)
				if ctx.Err() != nil {
					t.Fatal("the stream was not ended by the idle timeout")
				}
				if len(before) != 2 || e["code"] != codeUpstreamTimeout {
					t.Errorf("client got %d events, then the error %v; want 2, then %s", len(before), e, codeUpstreamTimeout)
				}
				recv(t, gone, "the replica's request cancelled")
				waitFor(t, "the idle timeout counted", func() bool { return idleTimeouts(p) == 1 })
				view.waitDone(t)
				requireReleased(t, p, rep.URL)
				if loop := testutil.ToFloat64(p.m.loopStreams); cl.name == "own" && !off && runtime.GOOS == "linux" && loop != 1 {
					t.Errorf("loop streams %v, want 1 (the stream loop's idle check untested)", loop)
				}
			})
		}
	}
}

// TestUpstreamIdleTimeoutSparesSlowStream: a replica that sends its
// events slowly, each well within the timeout, is relayed to the end.
func TestUpstreamIdleTimeoutSparesSlowStream(t *testing.T) {
	for _, cl := range idleClients {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/no_loop=%v", cl.name, off), func(t *testing.T) {
				const events = 4
				rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					for i := range events {
						if i > 0 {
							time.Sleep(300 * time.Millisecond) // within the timeout; together beyond it
						}
						fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
						w.(http.Flusher).Flush()
					}
					fmt.Fprint(w, "data: [DONE]\n\n")
				})
				view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
				p, srv, _ := newTestProxy(t, view, func(c *Config) {
					cl.set(c)
					c.NoStreamLoop = off
					c.UpstreamIdleTimeout = time.Second
				})
				resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
				br := bufio.NewReader(resp.Body)
				n := 0
				for {
					line, err := br.ReadString('\n')
					if strings.HasPrefix(line, "data: ") {
						n++
					}
					if err != nil {
						if err != io.EOF {
							t.Fatalf("stream broke after %d events: %v", n, err)
						}
						break
					}
				}
				resp.Body.Close()
				if n != events+1 {
					t.Errorf("got %d events, want %d", n, events+1)
				}
				if got := idleTimeouts(p); got != 0 {
					t.Errorf("idle timeouts counted: %v, want 0", got)
				}
			})
		}
	}
}

// idleTimeouts is how many responses the upstream idle timeout ended,
// however their client's response ended.
func idleTimeouts(p *Proxy) float64 {
	return testutil.ToFloat64(p.m.midstream.WithLabelValues(midstreamIdle, endErrorEvent)) +
		testutil.ToFloat64(p.m.midstream.WithLabelValues(midstreamIdle, endAborted))
}
