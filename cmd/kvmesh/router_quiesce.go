package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// quiescer lets the API's keep-alive connections die quietly before a
// shutdown closes them.
//
// http.Server.Shutdown closes every idle keep-alive connection at once.
// A client that picks one of them from its pool at that instant has
// written a POST the router never reads: it sees EOF, cannot tell
// whether a generation started, and net/http will not replay a POST. So
// once the router is draining, every response says "Connection: close"
// (a client's next request on that connection is its last), and the
// shutdown waits until each connection still idle has rested a while:
// an HTTP client reuses its most recently used connection first, so one
// that has rested is one its client is not about to pick. The race
// stays only for a client that falls silent for the whole rest and then
// writes at the instant of the close (HAProxy's and Envoy's drains, by
// "Connection: close" for a while and then closing, leave the same).
type quiescer struct {
	draining func() bool

	mu   sync.Mutex
	idle map[net.Conn]time.Time // idle connections and since when
}

func newQuiescer(draining func() bool) *quiescer {
	return &quiescer{draining: draining, idle: map[net.Conn]time.Time{}}
}

// connState is the server's ConnState hook: it keeps the idle
// connections and when each became idle.
func (q *quiescer) connState(c net.Conn, s http.ConnState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s == http.StateIdle {
		q.idle[c] = time.Now()
		return
	}
	delete(q.idle, c) // active again, hijacked or closed
}

// handler makes every response of a draining router its connection's
// last.
func (q *quiescer) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q.draining() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// restedFor reports whether every idle connection has been idle for at
// least rest at now.
func (q *quiescer) restedFor(rest time.Duration, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, since := range q.idle {
		if now.Sub(since) < rest {
			return false
		}
	}
	return true
}

// wait returns once every idle connection has rested for rest, or when
// ctx ends. It polls: connections change state far more often than a
// drain ends, and a tenth of rest is as exact as the rule needs.
func (q *quiescer) wait(ctx context.Context, rest time.Duration) {
	tick := time.NewTicker(max(rest/10, time.Millisecond))
	defer tick.Stop()
	for !q.restedFor(rest, time.Now()) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
