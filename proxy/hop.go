package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
)

// A hop (a request the entry router forwards to the owner of the chosen
// replica) fails in two ways that look the same to the entry: the owner
// died or was cut off before it sent the request to its replica (retrying
// is safe) or after (a generation may be running: retrying could run it
// twice). The dispatch protocol tells them apart:
//
//   - The owner, on an authenticated hop, sends an informational
//     "103 Early Hints" with HeaderDispatched right before it writes the
//     request to its replica, and only then (if the entry is still
//     there) dispatches. It never sends it to a client, nor on a hop it
//     cannot authenticate. The 103 names the replica (HeaderReplica):
//     the entry counts the request in flight there (hopload.go), which
//     is not its hint when the owner decided again.
//   - The entry watches its hop with httptrace. A hop that failed with no
//     such 103 and no response byte never reached a replica through that
//     owner, provided the owner speaks the protocol (below): the entry
//     retries it elsewhere, within the retry budget. After the 103 it
//     never retries.
//   - A hop that gets no byte within Config.HopDispatchTimeout is a dead
//     or partitioned owner: the entry cancels it and retries. So that the
//     owner cannot dispatch after the entry gave up, the entry sends its
//     deadline (HeaderDispatchBy, earlier than its own timeout by
//     dispatchMargin, which covers the 103's way back and clock skew) and
//     the owner refuses a hop past it with 503.
//
// Whether the owner speaks the protocol is known per connection: an owner
// of an older version (during a rolling upgrade) never sends the 103, so
// its silence proves nothing. A connection that has carried a dispatch
// 103 ends at a process that sends it on every authenticated hop, and no
// connection outlives its process (a restart, even into an older version,
// is a new connection). Without that evidence (a fresh connection, an
// older owner, a client that is not upstream.NewClient's), the entry keeps the
// conservative rule of retry.go: only a hop that provably was not sent is
// retried, and a silent owner is waited for up to the client's
// response-header timeout.

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

// DefaultHopDispatchTimeout is how long an entry waits for the first byte
// (the dispatch 103) of a hop to an owner known to send it. An owner sends
// it within milliseconds of the request (long before its replica's first
// token), so seconds of silence mean a dead or unreachable owner.
const DefaultHopDispatchTimeout = 5 * time.Second

// dispatchMargin is how much earlier than the entry's own timeout the
// owner must have dispatched: the 103's way back and the routers' clock
// skew must fit in it.
func dispatchMargin(timeout time.Duration) time.Duration { return timeout / 4 }

// hopWatch follows one hop attempt: which connection carried it, whether
// the owner announced the dispatch or answered anything, and the dispatch
// timeout.
type hopWatch struct {
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

// watchHop prepares a hop request: it returns the context to send it with
// (traced, cancelled by the dispatch timeout when the owner is known to
// speak the protocol) and sets the dispatch deadline header. stop must be
// called when the attempt ends.
func (p *Proxy) watchHop(ctx context.Context, out *http.Request, sentTo func(replica string)) (*http.Request, *hopWatch) {
	ctx, cancel := context.WithCancel(ctx)
	h := &hopWatch{cancel: cancel, started: p.now()}
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
	if t := p.cfg.HopDispatchTimeout; t > 0 {
		out.Header.Set(HeaderDispatchBy, strconv.FormatInt(p.now().Add(t-dispatchMargin(t)).UnixMilli(), 10))
		h.timer = time.AfterFunc(t, h.expire)
	}
	return out.WithContext(httptrace.WithClientTrace(ctx, trace)), h
}

// expire ends a hop that got no byte within the dispatch timeout, when its
// owner is known to announce dispatches (or no connection was made yet,
// so nothing was sent). An owner not known to speak the protocol may be
// an older router computing a non-streamed answer: it is waited for.
func (h *hopWatch) expire() {
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

// stop ends the watch (the timer; the context stays usable until the
// attempt's own cancel).
func (h *hopWatch) stop() {
	if h.timer != nil {
		h.timer.Stop()
	}
}

// unsent reports whether a failed hop provably never reached a replica
// through its owner: no dispatch 103 and no response byte came, and
// either nothing was sent or the owner is known to announce dispatches.
func (h *hopWatch) unsent() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatched || h.answered {
		return false
	}
	return !h.gotConn || (h.conn != nil && h.conn.Speaks())
}

// phase is how far the hop got (ownergone.go), by unsent's rule.
func (h *hopWatch) phase() hopPhase {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.dispatched:
		return phaseDispatched
	case h.answered:
		return phaseMaybe
	case !h.gotConn || (h.conn != nil && h.conn.Speaks()):
		return phaseUnsent
	}
	return phaseMaybe
}

// wasDispatched reports whether the owner announced the dispatch.
func (h *hopWatch) wasDispatched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dispatched
}

// expired reports whether the dispatch timeout ended the hop.
func (h *hopWatch) expired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.timedOut
}

// dispatchDeadline reads an authenticated hop's HeaderDispatchBy (zero
// when absent or malformed: an older entry sends none).
func dispatchDeadline(r *http.Request) time.Time {
	ms, err := strconv.ParseInt(r.Header.Get(HeaderDispatchBy), 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// announceDispatch is the owner's side: on an authenticated hop, right
// before the first dispatch to a replica, it sends the dispatch 103, then
// checks that the entry is still there. It reports whether to dispatch;
// when not, it has set st.code (and answered, if the entry may still
// read it).
func (p *Proxy) announceDispatch(w http.ResponseWriter, r *http.Request, st *reqState, replica string) bool {
	if !st.announce || st.announced {
		return true
	}
	if !st.dispatchBy.IsZero() && !p.now().Before(st.dispatchBy) {
		p.junk.Printf("hop from %s arrived %v past its dispatch deadline (a stalled router, or clocks apart): refused", r.RemoteAddr, p.now().Sub(st.dispatchBy).Round(time.Millisecond))
		st.code = writeRetryLater(w, http.StatusServiceUnavailable, time.Second, "the forwarding router's dispatch deadline passed; not dispatched")
		return false
	}
	h := w.Header()
	h.Set(HeaderDispatched, "1")
	// The replica it goes to: the entry counts the request there, not at
	// its hint, when this router decided again (hopload.go).
	h.Set(HeaderReplica, replica)
	w.WriteHeader(http.StatusEarlyHints)
	h.Del(HeaderDispatched) // the 103 keeps the header map (RFC 8297)
	h.Del(HeaderReplica)
	st.announced = true
	if r.Context().Err() != nil {
		// The entry went away: it saw no 103 and may retry elsewhere.
		st.code = statusClientGone
		return false
	}
	return true
}

// avoidOwner drops from cands the replicas reached through ownerAPI (a
// hop to it just failed before dispatch: they are all behind the same
// dead or unreachable router) and, when this router owns any of the
// rest, keeps only those: nothing between this router and its own
// replicas failed. When it owns none, it keeps the replicas whose
// owner's state it has heard since the failed hop began (since; owners
// send it every tick), if any are left: an owner silent for as long as
// the failed one was may be cut off the same way (a partition), and a
// second hop to it would spend the retry budget the same way.
func (p *Proxy) avoidOwner(cands []route.Candidate, ownerAPI string, since time.Time) []route.Candidate {
	out, local := cands[:0], 0
	for _, c := range cands {
		api, isLocal, ok := p.cfg.View.Locate(c.ID())
		if !ok || (!isLocal && api == ownerAPI) {
			continue
		}
		if isLocal {
			local++
		}
		out = append(out, c)
	}
	if local == len(out) {
		return out
	}
	if local > 0 {
		own := out[:0]
		for _, c := range out {
			if _, isLocal, _ := p.cfg.View.Locate(c.ID()); isLocal {
				own = append(own, c)
			}
		}
		return own
	}
	clock := p.cfg.View
	heard := 0
	for i := range out {
		if t, ok := clock.LoadHeard(out[i].ID()); ok && t.After(since) {
			heard++
		}
	}
	if heard == 0 || heard == len(out) {
		return out
	}
	kept := out[:0]
	for _, c := range out {
		if t, ok := clock.LoadHeard(c.ID()); ok && t.After(since) {
			kept = append(kept, c)
		}
	}
	return kept
}

// hopFailed judges a hop whose request failed (err from the client) by
// what its watch saw; ok false leaves the verdict to retry.go's rule.
func (p *Proxy) hopFailed(h *hopWatch, st *reqState, id, ownerAPI string, err error) (attemptResult, bool) {
	switch {
	case h.unsent():
		why := "failed before it dispatched the request"
		if h.expired() {
			why = fmt.Sprintf("sent nothing within %v", p.cfg.HopDispatchTimeout)
		}
		p.log.Warn("owner router "+why+", trying another", "replica", id, "owner", ownerAPI, "error", err)
		st.downOwner, st.downSince = ownerAPI, h.started
		return attemptNotReached, true
	case h.wasDispatched():
		p.log.Warn("owner router failed after it had dispatched the request; not retrying", "replica", id, "owner", ownerAPI, "error", err)
		st.hopDispatched = true
		return attemptFailed, true
	}
	return 0, false
}
