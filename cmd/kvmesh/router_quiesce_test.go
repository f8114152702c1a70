package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestQuiescerRest: the wait ends only when every idle connection has
// rested; an active, hijacked or closed connection is not waited for.
func TestQuiescerRest(t *testing.T) {
	q := newQuiescer(func() bool { return true })
	a, b := &net.TCPConn{}, &net.UnixConn{}
	rest := time.Second
	q.connState(a, http.StateIdle)
	t0 := q.idle[a]
	if !q.restedFor(rest, t0.Add(rest)) {
		t.Error("a connection idle for rest has not rested")
	}
	if q.restedFor(rest, t0.Add(rest/2)) {
		t.Error("a connection idle for half of rest has rested")
	}
	q.connState(a, http.StateActive) // its client picked it: it will close after its answer
	q.connState(b, http.StateIdle)
	q.connState(b, http.StateClosed)
	if !q.restedFor(rest, t0) || len(q.idle) != 0 {
		t.Errorf("active and closed connections still waited for: %d", len(q.idle))
	}
	q.connState(a, http.StateIdle)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.wait(ctx, time.Hour) // bounded by ctx, whatever the connections do
}

// TestQuiescerClosesAfterAnswer: while the router drains, each answer is
// its connection's last, so the client's pool drops it instead of
// keeping a connection the shutdown will close under it.
func TestQuiescerClosesAfterAnswer(t *testing.T) {
	var draining atomic.Bool
	q := newQuiescer(draining.Load)
	srv := httptest.NewUnstartedServer(q.handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	srv.Config.ConnState = q.connState
	srv.Start()
	defer srv.Close()
	client := srv.Client()
	get := func() *http.Response {
		t.Helper()
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get(); resp.Close {
		t.Error("a serving router closes its keep-alive connections")
	}
	draining.Store(true)
	if resp := get(); !resp.Close {
		t.Error("a draining router's answer keeps its connection")
	}
}
