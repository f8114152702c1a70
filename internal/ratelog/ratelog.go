// Package ratelog throttles the log lines a stranger can cause (junk
// packets, refused connections, bad TLS handshakes): a burst per window
// passes, the rest is counted and reported as one line when the next
// window opens.
package ratelog

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Limiter lets Burst events through per Window and counts the rest.
type Limiter struct {
	burst  int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	start   time.Time
	n       int
	dropped int
}

// New returns a Limiter passing burst events per window.
func New(burst int, window time.Duration) *Limiter {
	return &Limiter{burst: max(burst, 1), window: window, now: time.Now}
}

// Allow reports whether an event may be logged now and, when it may, how
// many were suppressed since the last one that was.
func (l *Limiter) Allow() (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.start) >= l.window {
		l.start, l.n = now, 0
	}
	if l.n >= l.burst {
		l.dropped++
		return false, 0
	}
	l.n++
	suppressed, l.dropped = l.dropped, 0
	return true, suppressed
}

// Writer passes whole log lines to W under a Limiter; a standard
// log.Logger (memberlist's, net/http's ErrorLog) writes through it.
type Writer struct {
	W io.Writer
	L *Limiter
	// Dropped, when set, tells the lines W drops anyway (below its
	// logger's level): they go to W without counting against the burst,
	// so debug lines never become a warning that they were suppressed.
	Dropped func(line []byte) bool
}

// Write implements io.Writer; a suppressed line still reports success.
func (w Writer) Write(p []byte) (int, error) {
	if w.Dropped != nil && w.Dropped(p) {
		return w.W.Write(p)
	}
	ok, suppressed := w.L.Allow()
	if !ok {
		return len(p), nil
	}
	if suppressed > 0 {
		_, _ = fmt.Fprintf(w.W, "[WARN] %d similar log lines suppressed\n", suppressed)
	}
	if _, err := w.W.Write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}
