package upstream

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// errUpstreamIdle ends a response whose upstream went silent.
var errUpstreamIdle = errors.New("upstream sent nothing for the upstream idle timeout")

// IdleWatch ends a response whose upstream sends no body byte for d. The
// relay stamps the time it starts waiting for the body (before each read
// on the normal path, each piece of body on the stream loop, whose reads
// never wait for the client: a monotonic clock read and an atomic store,
// no syscall), and marks itself busy after each read of the normal path,
// so time spent writing to a slow client is not counted as the upstream's
// silence. A timer, reset at most once per
// timeout, compares the stamp with the clock and, once the upstream was
// silent for d, marks the watch fired, closes its channel (the stream
// loop's waiting handler watches it) and makes the relay's blocked read
// fail (a past read deadline on the own client's connection, the
// request's cancellation under net/http). The connection
// then never goes back to the pool: a body that did not end is closed.
type IdleWatch struct {
	d     time.Duration
	first time.Duration // the bound until the first body byte (heard)
	start time.Time
	last  atomic.Int64 // time.Since(start) of the last stamp
	timer *time.Timer
	conn  net.Conn // the own client's connection: a past read deadline ends the read
	kill  func()   // else this ends it
	// c is closed when the watch fires; made only for the stream loop
	// (firedC), under mu.
	c chan struct{}
	// mu orders a firing against stop: once stop returned, kill is
	// neither running nor to run.
	mu      sync.Mutex
	stopped bool
	isFired atomic.Bool
	spoke   atomic.Bool // a body byte arrived: d bounds the silences from now
}

// WatchIdle starts the watch of a response whose headers just arrived,
// silent for at most d between body bytes (HeaderTimeout, if longer,
// until the first): the read of conn (the own client's connection) is
// ended by a past deadline, else kill ends it. Stop must be called when
// the relay ends.
func WatchIdle(conn net.Conn, kill func(), d time.Duration) *IdleWatch {
	w := &IdleWatch{d: d, first: max(d, HeaderTimeout), start: time.Now(), conn: conn, kill: kill}
	w.timer = time.AfterFunc(d, w.check)
	return w
}

// Timeout is the silence that ends the response once it spoke.
func (w *IdleWatch) Timeout() time.Duration { return w.d }

// Saw records that the upstream is waited for from now (or spoke now).
func (w *IdleWatch) Saw() {
	if w != nil {
		w.last.Store(int64(time.Since(w.start)))
	}
}

// Heard records the response's first body byte: from now on d bounds
// the upstream's silences, not first.
func (w *IdleWatch) Heard() {
	if w != nil {
		w.spoke.Store(true)
	}
}

// notWaiting marks a relay busy with anything but its upstream.
const notWaiting = -1

// Busy records that the relay does not wait for the upstream (it writes
// to its client) until the next saw: no silence is counted meanwhile.
func (w *IdleWatch) Busy() {
	if w != nil {
		w.last.Store(notWaiting)
	}
}

// check runs on the timer: it ends the response after d of silence, or
// waits for the rest of d since the last byte.
func (w *IdleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	last := w.last.Load()
	if last == notWaiting {
		w.timer.Reset(w.d)
		return
	}
	limit := w.d
	if !w.spoke.Load() {
		limit = w.first
	}
	idle := time.Since(w.start) - time.Duration(last)
	if idle < limit {
		w.timer.Reset(min(limit-idle, w.d))
		return
	}
	w.fireLocked()
}

// fireLocked ends the response; w.mu is held.
func (w *IdleWatch) fireLocked() {
	w.stopped = true
	w.isFired.Store(true)
	if w.c != nil {
		close(w.c)
	}
	if w.conn != nil {
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
	} else {
		w.kill()
	}
}

// Fire ends the response now, as a silence of d would (the router's
// stall detection judged its upstream stuck); false when the watch was
// stopped or fired already.
func (w *IdleWatch) Fire() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.fireLocked()
	return true
}

// Quiet reports since when the relay has waited for the upstream, which
// sent no byte since (ok is false while the relay does something else:
// the upstream is not being silent then).
func (w *IdleWatch) Quiet() (since time.Time, ok bool) {
	last := w.last.Load()
	if last == notWaiting {
		return time.Time{}, false
	}
	return w.start.Add(time.Duration(last)), true
}

// Spoke reports whether the response's first body byte came (Heard).
func (w *IdleWatch) Spoke() bool { return w != nil && w.spoke.Load() }

// Fired reports whether the watch ended the response.
func (w *IdleWatch) Fired() bool { return w != nil && w.isFired.Load() }

// FiredC is closed when the watch fires (nil, never closed, without one).
func (w *IdleWatch) FiredC() <-chan struct{} {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		w.c = make(chan struct{})
		if w.isFired.Load() {
			close(w.c)
		}
	}
	return w.c
}

// Stop ends the watch and reports whether it fired (the upstream's
// connection must then not be reused).
func (w *IdleWatch) Stop() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.timer.Stop()
	return w.isFired.Load()
}
