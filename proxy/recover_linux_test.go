package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStreamLoopContainsPanic: a panic in a stream's code on the stream
// loop (here the first-byte hook, where the answer extractor also runs)
// ends that stream with a broken connection, is counted, and does not end
// the process: the loop finishes the stream it was relaying before and
// takes new ones after.
func TestStreamLoopContainsPanic(t *testing.T) {
	words := deltas(50, 8)
	var hits atomic.Int32
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) != 1 {
			sseChat(w, words, 3)
			return
		}
		// The first stream is mid-way while the second one panics.
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first \"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-release
		sseChat(w, words, 3)
	})
	view := &panicView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), panicAt: 2}
	p, srv, _ := newTestProxy(t, view, nil)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // a test failed before it ends: before the servers close, which wait for the handlers

	_, _, first := rawStream(t, srv.URL)
	if first.StatusCode != 200 {
		t.Fatalf("first stream: status %d", first.StatusCode)
	}
	got := make([]byte, 8)
	if _, err := io.ReadAtLeast(first.Body, got, 1); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", true, longPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the stream whose code panicked ended cleanly: a truncated success")
	}
	resp.Body.Close()
	view.waitDone(t)

	free()
	rest, err := io.ReadAll(first.Body)
	if err != nil {
		t.Fatalf("the loop's other stream broke: %v", err)
	}
	for _, w := range words {
		if !strings.Contains(string(rest), w) {
			t.Fatalf("token %q of the other stream missing", w)
		}
	}
	view.waitDone(t)

	// A new stream still goes through the loop.
	resp, err = http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", true, longPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, resp); !strings.Contains(b, words[len(words)-1]) {
		t.Fatalf("stream after the panic incomplete: %q", b)
	}
	view.waitDone(t)
	waitCounted(t, p, epChat, 3) // the handlers have released what they held
	if n := testutil.ToFloat64(p.m.loopStreams); n != 3 {
		t.Errorf("loop streams %v, want 3", n)
	}
	if n := testutil.ToFloat64(p.panics.Counter(panicStreamLoop)); n != 1 {
		t.Errorf("loop panics counted: %v, want 1", n)
	}
	requireReleased(t, p, rep.URL)
}
