package proxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultUpstreamIdleTimeout bounds how long an upstream may send no byte
// of a response body once its headers arrived (nginx's proxy_read_timeout
// has the same meaning and default). An LLM engine sends a non-streamed
// answer whole right after its headers (it computes before it answers, a
// wait the response header timeout bounds), and a stream a token every
// few milliseconds to seconds, so a minute of silence mid-body means a
// dead or unreachable upstream (a blackholed connection), which TCP
// keepalive would notice only after minutes. Until the first body byte
// the bound is the longer upstreamHeaderTimeout: an engine sends a
// stream's headers at once, and its first token only after the request
// waited in its queue and was prefilled, which under load takes minutes.
const DefaultUpstreamIdleTimeout = 60 * time.Second

// errUpstreamIdle ends a response whose upstream went silent.
var errUpstreamIdle = errors.New("upstream sent nothing for the upstream idle timeout")

// idleWatch ends a response whose upstream sends no body byte for d. The
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
type idleWatch struct {
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

// hopIdleSlack is added to the idle timeout of a hop (a peer router
// relaying its replica's response). Routers share the timeout, and a
// replica's silence is a silence of its owner's relay too: on equal
// timeouts the entry's watch and the owner's would fire within
// microseconds of each other, and whichever won would end the stream.
// The owner's cut is the one worth having: it reports its replica's
// failure to its health checker, counts it where the replica is, and
// ends the stream with its error event, which the entry relays. So the
// entry waits a second longer, time for the owner's event to cross the
// network; a dead or cut-off owner is still cut off, a second later.
const hopIdleSlack = time.Second

// watchIdle starts the watch of a response whose headers just arrived;
// nil when there is no timeout. hop adds hopIdleSlack. stop must be
// called when the relay ends.
func (p *Proxy) watchIdle(conn net.Conn, kill func(), hop bool) *idleWatch {
	d := p.cfg.UpstreamIdleTimeout
	if d <= 0 {
		return nil
	}
	if hop {
		d += hopIdleSlack
	}
	w := &idleWatch{d: d, first: max(d, upstreamHeaderTimeout), start: time.Now(), conn: conn, kill: kill}
	w.timer = time.AfterFunc(d, w.check)
	return w
}

// saw records that the upstream is waited for from now (or spoke now).
func (w *idleWatch) saw() {
	if w != nil {
		w.last.Store(int64(time.Since(w.start)))
	}
}

// heard records the response's first body byte: from now on d bounds
// the upstream's silences, not first.
func (w *idleWatch) heard() {
	if w != nil {
		w.spoke.Store(true)
	}
}

// notWaiting marks a relay busy with anything but its upstream.
const notWaiting = -1

// busy records that the relay does not wait for the upstream (it writes
// to its client) until the next saw: no silence is counted meanwhile.
func (w *idleWatch) busy() {
	if w != nil {
		w.last.Store(notWaiting)
	}
}

// check runs on the timer: it ends the response after d of silence, or
// waits for the rest of d since the last byte.
func (w *idleWatch) check() {
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

// fired reports whether the watch ended the response.
func (w *idleWatch) fired() bool { return w != nil && w.isFired.Load() }

// firedC is closed when the watch fires (nil, never closed, without one).
func (w *idleWatch) firedC() <-chan struct{} {
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

// stop ends the watch and reports whether it fired (the upstream's
// connection must then not be reused).
func (w *idleWatch) stop() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.timer.Stop()
	return w.isFired.Load()
}
