package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// rawStream sends a streaming chat request over a fresh connection and
// returns the connection and the response (its head read).
func rawStream(t *testing.T, url string) (*net.TCPConn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(testWait)) // every read and write of the test's is bounded
	tc := c.(*net.TCPConn)
	body := chatBody("m", true, longPrompt)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tc, br, resp
}

// TestStreamLoopRelaysLikeTheNormalPath: a stream relayed by the loop
// reaches the client as through the normal path (head, chunked framing,
// every byte, the connection kept alive for the next request) and its
// answer is recorded alike.
func TestStreamLoopRelaysLikeTheNormalPath(t *testing.T) {
	words := deltas(200, 12)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, words, 3) })
	type result struct {
		head    http.Header
		body    string
		records [][]uint64
		loops   float64
	}
	run := func(off bool) result {
		view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: 4})
		p, srv, _ := newTestProxy(t, view, func(c *Config) { c.NoStreamLoop = off })
		c, br, resp := rawStream(t, srv.URL)
		if resp.StatusCode != 200 || !slices.Equal(resp.TransferEncoding, []string{"chunked"}) {
			t.Fatalf("status %d, transfer encoding %v", resp.StatusCode, resp.TransferEncoding)
		}
		b, err := io.ReadAll(resp.Body) // the chunked reader checks the framing
		if err != nil {
			t.Fatal(err)
		}
		view.waitDone(t)
		// The connection serves another request after the stream.
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		next, err := http.ReadResponse(br, nil)
		if err != nil || next.StatusCode != 200 {
			t.Fatalf("next request on the connection: %v", err)
		}
		next.Body.Close()
		h := resp.Header.Clone()
		h.Del("Date")
		return result{h, string(b), view.recorded(rep.URL), testutil.ToFloat64(p.m.loopStreams)}
	}
	loop, normal := run(false), run(true)
	if loop.loops != 1 || normal.loops != 0 {
		t.Fatalf("loop streams %v and %v, want 1 and 0", loop.loops, normal.loops)
	}
	if fmt.Sprint(loop.head) != fmt.Sprint(normal.head) {
		t.Errorf("heads differ:\n%v\n%v", loop.head, normal.head)
	}
	if loop.body != normal.body {
		t.Errorf("bodies differ: %d and %d bytes", len(loop.body), len(normal.body))
	}
	for _, w := range words {
		if !strings.Contains(loop.body, w) {
			t.Fatalf("token %q missing", w)
		}
	}
	if len(loop.records) != 2 || fmt.Sprint(loop.records) != fmt.Sprint(normal.records) {
		t.Errorf("records differ: %d and %d", len(loop.records), len(normal.records))
	}
	if len(loop.records) == 2 && len(loop.records[1]) <= len(loop.records[0]) {
		t.Error("the answer was not recorded")
	}
}

// TestStreamLoopClientGoesAway: a client that closes its connection
// mid-stream cancels the replica's request, and the request counts as
// 499.
func TestStreamLoopClientGoesAway(t *testing.T) {
	cancelled := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(cancelled)
				return
			case <-time.After(time.Millisecond):
			}
		}
		<-r.Context().Done()
		close(cancelled)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	c, br, resp := rawStream(t, srv.URL)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for range 5 {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the replica's request was not cancelled")
	}
	view.waitDone(t)
	if got := testutil.ToFloat64(p.m.loopStreams); got != 1 {
		t.Errorf("loop streams %v, want 1", got)
	}
	waitFor(t, "the request counted as 499", func() bool {
		return testutil.ToFloat64(p.m.requests.WithLabelValues(epChat, "499")) == 1
	})
}

// TestStreamLoopSlowClient: when the client's socket is full the stream
// leaves the loop and its goroutine waits for the client; nothing is
// lost or reordered.
func TestStreamLoopSlowClient(t *testing.T) {
	words := deltas(1200, 8<<10) // 9.6 MB, more than a socket buffers (4 MB at most by default)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, words, -1) })
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	_, _, resp := rawStream(t, srv.URL)
	// Not reading: the loop fills the client's socket and hands back.
	waitFor(t, "the loop to hand the stream back", func() bool { return testutil.ToFloat64(p.m.loopClientWaits) == 1 })
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for ev := range strings.SplitSeq(string(b), "\n\n") {
		d, ok := strings.CutPrefix(ev, "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		var m struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("event %.40q: %v", d, err)
		}
		got = append(got, m.Choices[0].Delta.Content)
	}
	if !slices.Equal(got, words) {
		t.Fatalf("%d tokens arrived, want %d in order", len(got), len(words))
	}
	view.waitDone(t)
}

// TestStreamLoopReplicaClosesEarly: a replica that closes its connection
// mid-event ends the client's response with the whole events before it,
// an error event and a clean end, and is reported.
func TestStreamLoopReplicaClosesEarly(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"
		fmt.Fprintf(bw, "%x\r\n%s\r\n", len(ev), ev)
		bw.Flush()
		time.Sleep(10 * time.Millisecond)
		fmt.Fprintf(bw, "%x\r\n%s", len(ev), ev[:10]) // cut mid-chunk
		bw.Flush()
	})
	var failures atomic.Int64
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, func(c *Config) { c.ReportFailure = func(string) { failures.Add(1) } })
	_, _, resp := rawStream(t, srv.URL)
	before, _ := readCutStream(t, resp)
	if len(before) != 1 || !strings.Contains(before[0], `"content":"a"`) {
		t.Errorf("events before the error %q, want the first (and not the cut one)", before)
	}
	view.waitDone(t)
	if failures.Load() != 1 {
		t.Errorf("%d failures reported, want 1", failures.Load())
	}
	if got := testutil.ToFloat64(p.m.loopStreams); got != 1 {
		t.Errorf("loop streams %v, want 1", got)
	}
}

// TestStreamLoopClose: streams in the loop when it stops finish on the
// normal path.
func TestStreamLoopClose(t *testing.T) {
	words := deltas(300, 10)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, d := range words {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", d)
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Microsecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	_, br, resp := rawStream(t, srv.URL)
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	p.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range words {
		if !strings.Contains(string(b), w) {
			t.Fatalf("token %q missing", w)
		}
	}
	view.waitDone(t)
	// A new stream after Close takes the normal path.
	_, _, resp = rawStream(t, srv.URL)
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	view.waitDone(t)
	if got := testutil.ToFloat64(p.m.loopStreams); got != 1 {
		t.Errorf("loop streams %v, want 1", got)
	}
}

// TestStreamLoopSkipsTLSAndHTTP2: TLS (and so HTTP/2) clients take the
// normal path.
func TestStreamLoopSkipsTLSAndHTTP2(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"a", "b"}, 3) })
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, err := New(Config{RouterName: "test", View: view, Policy: route.DefaultPolicy(), Contract: testContract})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	srv := httptest.NewUnstartedServer(p)
	srv.Config.ConnContext = ConnContext
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	for _, h2 := range []bool{false, true} {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.ForceAttemptHTTP2 = h2
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		ctx, cancel := context.WithTimeout(t.Context(), testWait) // the round trip and its body
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", true, longPrompt)))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != map[bool]int{false: 1, true: 2}[h2] || !bytes.Contains(b, []byte("[DONE]")) {
			t.Fatalf("h2=%v: %s, %q", h2, resp.Proto, b)
		}
		view.waitDone(t)
		tr.CloseIdleConnections()
	}
	if got := testutil.ToFloat64(p.m.loopStreams); got != 0 {
		t.Errorf("loop streams %v, want 0", got)
	}
}

// TestStreamLoopHandsBackHeldEvent: a partial event the loop holds back
// (upstream.Framing) goes with the stream when the loop hands it back (here
// on Close): the normal path writes it once its end arrives, so the
// client gets every event whole, once, in order.
func TestStreamLoopHandsBackHeldEvent(t *testing.T) {
	release := make(chan struct{})
	ev0, ev1 := event(0), event(1)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ev0+ev1[:20]) // one write: one read of the loop
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, ev1[20:]+"data: [DONE]\n\n")
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	_, _, resp := rawStream(t, srv.URL)
	first := make([]byte, len(ev0))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != ev0 {
		t.Fatalf("first event %q, %v", first, err)
	}
	p.Close() // the loop hands the stream back, with what it held
	close(release)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(rest) != ev1+"data: [DONE]\n\n" {
		t.Fatalf("after the hand-back the client got %q", rest)
	}
	view.waitDone(t)
	if got := testutil.ToFloat64(p.m.loopStreams); got != 1 {
		t.Errorf("loop streams %v, want 1", got)
	}
}

// TestClientGoneAfterDone: a client that stops reading at [DONE] and
// closes its connection before the replica ends the body (llama.cpp's
// server ends it a moment later; OpenAI's SDKs stop at [DONE]) has its
// whole answer: the request counts as 200 and the engine's usage and the
// answer are learnt, through the stream loop and the normal path alike.
func TestClientGoneAfterDone(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoStreamLoop=%v", off), func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				sseChat(w, deltas(20, 8), 40)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // the body ends only when the router lets go
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: 4})
			p, srv, _ := newTestProxy(t, view, func(c *Config) { c.NoStreamLoop = off })
			c, br, resp := rawStream(t, srv.URL)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended before [DONE]: %v", err)
				}
				if strings.Contains(line, "data: [DONE]") {
					break
				}
			}
			c.Close()
			view.waitDone(t)
			waitCounted(t, p, epChat, 1)
			if got := testutil.ToFloat64(p.m.requests.WithLabelValues(epChat, "200")); got != 1 {
				t.Errorf("%v requests counted 200, want 1 (499: %v)", got, testutil.ToFloat64(p.m.requests.WithLabelValues(epChat, "499")))
			}
			if got := testutil.ToFloat64(p.m.reportedCached); got != 40 {
				t.Errorf("reported cached tokens %v, want the engine's 40", got)
			}
			records := view.recorded(rep.URL)
			if len(records) != 2 || len(records[1]) <= len(records[0]) {
				t.Errorf("records %d, want the prompt then the prompt and answer", len(records))
			}
		})
	}
}
