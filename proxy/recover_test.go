package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// panicView panics in the first-byte hook of its panicAt-th dispatch:
// code of the router's that runs on a stream's way (on the stream loop
// when the loop relays it), as the answer extractor does.
type panicView struct {
	*fakeView
	n       atomic.Int32
	panicAt int32
}

func (v *panicView) Begin(id string, prefill float64) (func(), func()) {
	first, done := v.fakeView.Begin(id, prefill)
	if v.n.Add(1) == v.panicAt {
		return func() { panic("test: a bug on the stream's way") }, done
	}
	return first, done
}

// requireReleased fails unless the proxy holds nothing of its requests to
// replica id any more: its in-flight gauge, its slot marks, heat keys.
func requireReleased(t *testing.T, p *Proxy, id string) {
	t.Helper()
	if g := testutil.ToFloat64(p.m.inflightOf(id)); g != 0 {
		t.Errorf("in-flight gauge of the replica is %v after the panic, want 0", g)
	}
	p.load.mu.Lock()
	defer p.load.mu.Unlock()
	if n := len(p.load.runs[id]); n != 0 {
		t.Errorf("%d dispatch marks left at the replica, want 0", n)
	}
	if n := len(p.load.heat); n != 0 {
		t.Errorf("%d heat keys left in flight, want 0", n)
	}
}

// TestHandlerPanicAnswers500: a panic in a handler before anything was
// written answers an OpenAI-shaped 500 (not a connection closed with
// nothing), is counted, and leaves nothing in flight.
func TestHandlerPanicAnswers500(t *testing.T) {
	dead := deadAddr(t)
	view := newFakeView([]string{"m"}, fakeReplica{id: dead})
	p, srv, _ := newTestProxy(t, view, func(c *Config) {
		c.ReportFailure = func(string) { panic("test: a bug in a handler") }
	})
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, longPrompt)))
	if err != nil {
		t.Fatalf("the client got no answer: %v", err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q, want 500 JSON: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "server_error" || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error: %s (%v)", body, err)
	}
	if n := testutil.ToFloat64(p.panics.Counter(panicHandler)); n != 1 {
		t.Errorf("panics counted: %v, want 1", n)
	}
	requireReleased(t, p, dead)
	// The router serves on.
	if resp, err := http.Get(srv.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz after the panic: %v", err)
	}
}

// TestHandlerPanicMidStreamAborts: a panic after the head was sent (on
// the normal relay path) breaks the client's stream rather than ending it
// as if complete, is counted, and leaves nothing in flight.
func TestHandlerPanicMidStreamAborts(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, deltas(20, 8), 3) })
	view := &panicView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), panicAt: 1}
	p, srv, _ := newTestProxy(t, view, func(c *Config) { c.NoStreamLoop = true })
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", true, longPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the stream ended cleanly after a panic: a truncated success")
	}
	resp.Body.Close()
	view.waitDone(t)
	if n := testutil.ToFloat64(p.panics.Counter(panicHandler)); n != 1 {
		t.Errorf("panics counted: %v, want 1", n)
	}
	requireReleased(t, p, rep.URL)
}

// TestAdminPanicAnswers500: a panic in the admin server's handler (here
// the debug view; the status page's view of the mesh is served the same
// way) answers an OpenAI-shaped 500, is counted as where="admin", and the
// admin server and the API serve on.
func TestAdminPanicAnswers500(t *testing.T) {
	view := newFakeView([]string{"m"})
	var calls atomic.Int32
	p, srv, _ := newTestProxy(t, view, func(c *Config) {
		c.Debug = func() any {
			if calls.Add(1) == 1 {
				panic("test: a bug in the debug view")
			}
			return map[string]int{"ok": 1}
		}
	})
	admin := httptest.NewServer(p.ContainAdmin(p.AdminHandler()))
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/debug/mesh")
	if err != nil {
		t.Fatalf("the client got no answer: %v", err)
	}
	body := readAll(t, resp)
	var e apiError
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != "server_error" {
		t.Fatalf("status %d, want an OpenAI-shaped 500: %s", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(p.panics.Counter(panicAdmin)); n != 1 {
		t.Errorf("panics counted: %v, want 1", n)
	}
	for _, u := range []string{admin.URL + "/debug/mesh", admin.URL + "/metrics", srv.URL + "/healthz"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("%s after the panic: %v", u, err)
		}
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Errorf("%s after the panic: %d %s", u, resp.StatusCode, b)
		}
	}
}
