package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
)

// Outcomes of one upstream attempt.
type attemptResult int

const (
	// attemptDone: the request is finished (answered, relayed or
	// abandoned by its client).
	attemptDone attemptResult = iota
	// attemptNotReached: the request provably never reached a replica;
	// nothing reached the client and another candidate may be tried.
	attemptNotReached
	// attemptFailed: the request may have reached the replica and may be
	// running; nothing reached the client, and it must not be retried.
	attemptFailed
)

// attempt sends the request to candidate id, as decision d booked it
// (bk). When no other attempt may follow (more), an upstream's refusal is
// passed through to the client (its own Retry-After is more useful than a
// 502).
func (st *reqState) attempt(id string, d route.Decision, bk *booking) attemptResult {
	p, r := st.p, st.r
	defer bk.end()
	st.ownerHop = nil
	ownerAPI, local, ok := p.cfg.View.Locate(id)
	if !ok || (st.hop && !local) {
		p.log.Warn("candidate vanished before dispatch", "replica", id)
		return attemptNotReached
	}
	base := ownerAPI
	if local {
		base = id
	} else if p.cfg.RequirePeerTLS && !strings.HasPrefix(strings.ToLower(ownerAPI), "https://") {
		p.junk.Printf("not forwarding to %s: peer TLS is required and its API is %s", id, ownerAPI)
		return attemptNotReached
	}
	url := strings.TrimRight(base, "/") + st.path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	// An owned plain-HTTP replica is reached by the router's own client
	// (upstream.go); a peer's hop, TLS or a custom transport by net/http.
	plain := upstream.Plain(url)
	fast := local && p.up != nil && plain
	ctx := r.Context()
	var out *http.Request
	var cancel context.CancelFunc
	if !fast {
		// net/http's request ends with the attempt. The own client's
		// needs no context of its own: the body's Close (deferred below,
		// so before the attempt returns) ends it.
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		st.netHTTP = true
		var err error
		out, err = http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(st.body))
		if err != nil {
			p.log.Warn("bad upstream URL", "replica", id, "url", url, "error", err)
			return attemptNotReached
		}
		copyRequestHeader(out.Header, r.Header)
		body := st.body
		// net/http replays the body only when nothing was written (see retry.go).
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	// The request's accounting at the replica was booked with the
	// decision (bk, placeBook), and ends when this returns.
	firstByte := bk.firstByte
	if firstByte == nil {
		firstByte = func() {}
	}
	var watch *hop.Watch
	var live *hop.Live
	if local {
		if !st.announceDispatch(id) {
			return attemptDone
		}
	} else {
		p.signer.Sign(out, id, d.Match, st.concurrent, st.fork)
		mark := bk.mark
		// The hop's own cancellation, with a cause: the owner's loss
		// (hop.Owners) ends it, and its error says why.
		hctx, end := context.WithCancelCause(ctx)
		defer end(nil)
		if p.cfg.HopDispatchTimeout > 0 {
			out, watch = hop.StartWatch(hctx, out, p.cfg.HopDispatchTimeout, p.now(), func(to string) {
				// The owner decided again: count the request where it runs.
				if api, local, ok := p.cfg.View.Locate(to); ok && !local && api == ownerAPI {
					p.hops.Move(mark, to)
				}
			})
			defer watch.Stop()
		} else {
			out = out.WithContext(hctx)
		}
		live = p.owners.Add(ownerAPI, watch, end)
		defer p.owners.Remove(live)
		st.ownerHop = live
	}
	g := p.m.inflightOf(id)
	g.Inc()
	defer g.Dec()

	start := time.Now()
	var resp *http.Response
	var err error
	if fast {
		resp, err = p.up.Do(ctx, url, r.Header, st.body)
	} else {
		resp, err = p.client.Do(out)
	}
	if err == nil && live != nil {
		// The headers came; the body's bytes are the owner speaking
		// (hop.Owners).
		live.Spoke()
		live.Relaying()
		resp.Body = live.WrapBody(resp.Body)
	}
	if err != nil {
		if r.Context().Err() != nil {
			st.code = statusClientGone
			return attemptDone
		}
		if local {
			p.reportFailure(id)
		}
		if live.Gone() && !neverReached(err) && (watch == nil || !watch.Unsent()) {
			p.log.Warn("owner router gone from the mesh and silent after it was sent the request; not retrying", "replica", id, "owner", ownerAPI)
			st.ownerGone = true
			p.m.ownerGone.WithLabelValues(hop.GoneError).Inc()
			return attemptFailed
		}
		if watch != nil {
			if res, ok := st.hopFailed(watch, id, ownerAPI, err); ok {
				return res
			}
		}
		if neverReached(err) {
			p.log.Warn("upstream unreachable, trying another", "replica", id, "url", url, "error", err)
			return attemptNotReached
		}
		p.log.Warn("upstream failed after the request was sent; not retrying", "replica", id, "url", url, "error", err)
		return attemptFailed
	}
	defer resp.Body.Close()
	if refused(resp.StatusCode) && st.more() {
		st.drainRefused(resp, cancel)
		p.log.Warn("upstream refused the request, trying another", "replica", id, "status", resp.StatusCode)
		if local && resp.StatusCode >= 500 {
			p.reportFailure(id)
		}
		return attemptNotReached
	}
	st.code = resp.StatusCode
	var first time.Time
	st.relay(resp, &upstreamAnswer{id: id, d: d, local: local, start: start, cancel: cancel,
		firstByte: func() { first = p.now(); firstByte() }})
	if !st.cut {
		st.observeSlot(id, d, first)
	}
	return attemptDone
}

func (p *Proxy) reportFailure(id string) {
	if p.cfg.ReportFailure != nil {
		p.cfg.ReportFailure(id)
	}
}
