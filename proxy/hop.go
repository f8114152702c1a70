package proxy

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
)

// announceDispatch is the owner's side: on an authenticated hop, right
// before the first dispatch to a replica, it sends the dispatch 103, then
// checks that the entry is still there. It reports whether to dispatch;
// when not, it has set st.code (and answered, if the entry may still
// read it).
func (st *reqState) announceDispatch(replica string) bool {
	p, w, r := st.p, st.w, st.r
	if !st.announce || st.announced {
		return true
	}
	if !st.dispatchBy.IsZero() && !p.now().Before(st.dispatchBy) {
		p.junk.Printf("hop from %s arrived %v past its dispatch deadline (a stalled router, or clocks apart): refused", r.RemoteAddr, p.now().Sub(st.dispatchBy).Round(time.Millisecond))
		st.code = writeRetryLater(w, http.StatusServiceUnavailable, time.Second, "the forwarding router's dispatch deadline passed; not dispatched")
		return false
	}
	hop.Announce(w, replica)
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
func (st *reqState) hopFailed(h *hop.Watch, id, ownerAPI string, err error) (attemptResult, bool) {
	p := st.p
	switch {
	case h.Unsent():
		why := "failed before it dispatched the request"
		if h.Expired() {
			why = fmt.Sprintf("sent nothing within %v", p.cfg.HopDispatchTimeout)
		}
		p.log.Warn("owner router "+why+", trying another", "replica", id, "owner", ownerAPI, "error", err)
		st.downOwner, st.downSince = ownerAPI, h.Started()
		return attemptNotReached, true
	case h.Dispatched():
		p.log.Warn("owner router failed after it had dispatched the request; not retrying", "replica", id, "owner", ownerAPI, "error", err)
		st.hopDispatched = true
		return attemptFailed, true
	}
	return 0, false
}
