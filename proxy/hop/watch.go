package hop

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// Headers of the dispatch protocol between routers.
const (
	// HeaderDispatched ("1") marks the 103 Early Hints an owner sends on
	// an authenticated hop right before it dispatches the request.
	HeaderDispatched = "X-Kvmesh-Dispatched"
	// HeaderDispatchBy is the entry's deadline for the dispatch (Unix
	// milliseconds): an owner past it refuses the hop with 503, since the
	// entry has given up or will before the 103 reaches it. Honoured
	// only on authenticated hops.
	HeaderDispatchBy = "X-Kvmesh-Dispatch-By"
)

// DefaultDispatchTimeout is how long an entry waits for the first byte
// (the dispatch 103) of a hop to an owner known to send it. An owner sends
// it within milliseconds of the request (long before its replica's first
// token), so seconds of silence mean a dead or unreachable owner.
const DefaultDispatchTimeout = 5 * time.Second

// dispatchMargin is how much earlier than the entry's own timeout the
// owner must have dispatched: the 103's way back and the routers' clock
// skew must fit in it.
func dispatchMargin(timeout time.Duration) time.Duration { return timeout / 4 }

// Watch follows one hop attempt: which connection carried it, whether
// the owner announced the dispatch or answered anything, and the dispatch
// timeout.
type Watch struct {
	mu         sync.Mutex
	conn       *upstream.PeerConn // nil: no connection yet, or not upstream.NewClient's
	gotConn    bool
	dispatched bool // the owner's dispatch 103 arrived
	answered   bool // a response byte arrived (the 103's first included)
	timedOut   bool
	started    time.Time // when the hop was sent
	cancel     context.CancelFunc
	timer      *time.Timer
}

// StartWatch prepares a hop request sent at now: it returns the request
// to send, with its context (traced, cancelled by the dispatch timeout
// when the owner is known to speak the protocol; timeout <= 0: none), and
// sets the dispatch deadline header. sentTo is told of the replica the
// owner's 103 names. Stop must be called when the attempt ends.
func StartWatch(ctx context.Context, out *http.Request, timeout time.Duration, now time.Time, sentTo func(replica string)) (*http.Request, *Watch) {
	ctx, cancel := context.WithCancel(ctx)
	h := &Watch{cancel: cancel, started: now}
	trace := &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			h.mu.Lock()
			h.conn, h.gotConn = upstream.PeerConnOf(i.Conn), true
			h.mu.Unlock()
		},
		GotFirstResponseByte: func() {
			h.mu.Lock()
			h.answered = true
			h.mu.Unlock()
		},
		Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints && hdr.Get(HeaderDispatched) == "1" {
				if to := hdr.Get(HeaderReplica); to != "" && sentTo != nil {
					sentTo(to)
				}
				h.mu.Lock()
				h.dispatched = true
				if h.conn != nil {
					h.conn.SetSpeaks()
				}
				h.mu.Unlock()
			}
			return nil
		},
	}
	if t := timeout; t > 0 {
		out.Header.Set(HeaderDispatchBy, strconv.FormatInt(now.Add(t-dispatchMargin(t)).UnixMilli(), 10))
		h.timer = time.AfterFunc(t, h.expire)
	}
	return out.WithContext(httptrace.WithClientTrace(ctx, trace)), h
}

// expire ends a hop that got no byte within the dispatch timeout, when its
// owner is known to announce dispatches (or no connection was made yet,
// so nothing was sent). An owner not known to speak the protocol may be
// an older router computing a non-streamed answer: it is waited for.
func (h *Watch) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatched || h.answered {
		return
	}
	if !h.gotConn || (h.conn != nil && h.conn.Speaks()) {
		h.timedOut = true
		h.cancel()
	}
}

// Stop ends the watch (the timer; the context stays usable until the
// attempt's own cancel).
func (h *Watch) Stop() {
	if h.timer != nil {
		h.timer.Stop()
	}
}

// Unsent reports whether a failed hop provably never reached a replica
// through its owner: no dispatch 103 and no response byte came, and
// either nothing was sent or the owner is known to announce dispatches.
func (h *Watch) Unsent() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatched || h.answered {
		return false
	}
	return !h.gotConn || (h.conn != nil && h.conn.Speaks())
}

// phase is how far the hop got (owners.go), by Unsent's rule.
func (h *Watch) phase() Phase {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.dispatched:
		return PhaseDispatched
	case h.answered:
		return PhaseMaybe
	case !h.gotConn || (h.conn != nil && h.conn.Speaks()):
		return PhaseUnsent
	}
	return PhaseMaybe
}

// Dispatched reports whether the owner announced the dispatch.
func (h *Watch) Dispatched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dispatched
}

// Expired reports whether the dispatch timeout ended the hop.
func (h *Watch) Expired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.timedOut
}

// Announce writes the owner's dispatch 103 naming replica, the one the
// request goes to: the entry counts the request there (Book.Move), not at
// its hint, when the owner decided again.
func Announce(w http.ResponseWriter, replica string) {
	h := w.Header()
	h.Set(HeaderDispatched, "1")
	h.Set(HeaderReplica, replica)
	w.WriteHeader(http.StatusEarlyHints)
	h.Del(HeaderDispatched) // the 103 keeps the header map (RFC 8297)
	h.Del(HeaderReplica)
}

// Started is when the hop was sent.
func (h *Watch) Started() time.Time { return h.started }

// DispatchDeadline reads an authenticated hop's HeaderDispatchBy (zero
// when absent or malformed: an older entry sends none).
func DispatchDeadline(r *http.Request) time.Time {
	ms, err := strconv.ParseInt(r.Header.Get(HeaderDispatchBy), 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
