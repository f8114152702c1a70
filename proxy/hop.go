package proxy

import (
	"fmt"
	"net/http"
	"slices"
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

// ownCandidates keeps the candidates this router owns (a forwarded request
// never travels further) and finds the hinted replica among them. The
// deciding router saw this router's replicas as they were up to a gossip
// interval ago, and not the other routers' dispatches since; this router
// counts them exactly, so it keeps the hint only while route's rule says
// the replica can still start the request (route.Policy.KeepHint), and
// otherwise decides again among its own replicas. A pinned request (an
// SGLang prefill leg, whose decode leg names its replica) keeps the
// hinted replica alone, or none.
func ownCandidates(pol route.Policy, cands []route.Candidate, hint string, pinned bool) ([]route.Candidate, int) {
	keep := false
	for i := range cands {
		if cands[i].ID() == hint {
			keep = pinned || pol.KeepHint(cands, i)
			break
		}
	}
	if pinned {
		cands = slices.DeleteFunc(cands, func(c route.Candidate) bool { return c.ID() != hint })
	}
	own, hinted := cands[:0], -1
	for _, c := range cands {
		if c.Detail == nil || !c.Detail.Local { // the view's word, as commit books by it: no Locate per candidate
			continue
		}
		if c.ID() == hint && keep {
			hinted = len(own)
		}
		own = append(own, c)
	}
	return own, hinted
}
