package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/proxy/reply"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// statusClientGone labels requests whose client went away before the
// response was complete (nginx's convention).
const statusClientGone = 499

// reqState is one inference request on its way through the router.
type reqState struct {
	code int // the status the client got, for the metric
	// concurrent and fork are the decision's route.Request.Concurrent
	// and ForkBlocks, passed on to an owner with a hop.
	concurrent, fork int
	path             string
	body             []byte
	prompt           prompt.Prompt
	root             uint64
	hashes           []uint64
	hop              bool
	byLoad           bool // placed by load; the response is not read
	// blockMs is the chosen candidate's prefill time per block, for the
	// slot time the attempt measures (load.go).
	blockMs float64
	// The dispatch protocol (hop.go). announce: an authenticated hop,
	// whose entry is told of the dispatch (announced: it was);
	// dispatchBy: the entry's deadline for it. downOwner: the owner API
	// of a hop that failed before dispatch (its replicas are avoided),
	// downSince: when that hop began; hopDispatched: a hop failed after
	// its owner had dispatched.
	announce, announced bool
	dispatchBy          time.Time
	downOwner           string
	downSince           time.Time
	hopDispatched       bool
	// ownerGone: a hop was ended because its owner left the mesh and did
	// not answer (ownergone.go); ownerHop is the hop in flight, if any.
	ownerGone bool
	ownerHop  *liveHop
	// netHTTP: an attempt went through net/http, whose Transport may
	// still read the body after it returned; the body is not reused.
	netHTTP bool
	// cut: the upstream failed mid-response (the client got an error
	// event or a broken connection); nothing of it is learnt.
	cut bool
}

// sizedPool lends byte buffers by size class: 8, 16, 32 and 64 KB (plus
// extra bytes each), so that what a request holds for its whole life, a
// long stream included, is near the size it asked for, and is not garbage
// after every request.
type sizedPool struct {
	extra   int
	classes [4]sync.Pool
}

// bodyBufs holds request body buffers: a body of known length up to
// preallocBody is read into one (readKnown), the request path's largest
// allocation (8 KB of an 8 KB chat request). The extra byte is readKnown's
// EOF check.
var bodyBufs = sizedPool{extra: 1}

// textBufs holds buffers for rendered prompts (endpoint.renderTo), sized
// by the body: the rendering is the request path's other body-sized
// allocation. A request holds its buffer until inference returns; nothing
// keeps the prompt's text after that (the summary keeps hashes).
var textBufs sizedPool

// bodyClass is the size class of n bytes (0 < n <= preallocBody).
func bodyClass(n int64) int {
	c := 0
	for int64(8<<10)<<c < n {
		c++
	}
	return c
}

// get lends an empty buffer of capacity at least n (plus extra), nil when
// n is unknown or over preallocBody (the caller then allocates).
func (p *sizedPool) get(n int64) *[]byte {
	if n <= 0 || n > preallocBody {
		return nil
	}
	c := bodyClass(n)
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, (8<<10)<<c+p.extra)
	return &b
}

// put returns a buffer get lent.
func (p *sizedPool) put(b *[]byte) {
	p.classes[bodyClass(int64(cap(*b)-p.extra))].Put(b)
}

// errNotFlushed: relay did not flush the head (the stream loop needs it
// on the wire before it writes the body's chunks).
var errNotFlushed = errors.New("head not flushed")

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// inference serves the inference endpoints (endpoints.go).
func (p *Proxy) inference(w http.ResponseWriter, r *http.Request, ep *endpoint) {
	st := &reqState{path: r.URL.Path, byLoad: ep.byLoad}
	// A deferred count still runs when a dead upstream aborts the handler.
	defer func() { p.m.countRequest(ep.label, st.code) }()
	if r.Method != http.MethodPost {
		abandonBody(w, r)
		w.Header().Set("Allow", http.MethodPost)
		st.code = writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	// A peer's hop is bounded by the peer's own edges; a client's request
	// must fit the client's cap. Only a hop a peer provably sent skips
	// the API key (the client's key was checked where it arrived).
	hop, authenticated := p.hopOf(r)
	st.hop = hop
	if st.announce = authenticated; authenticated {
		st.dispatchBy = dispatchDeadline(r)
	}
	if !authenticated && !p.authorize(w, r) {
		st.code = http.StatusUnauthorized
		return
	}
	if !st.hop {
		release, ok := p.admitClient(w, r)
		if !ok {
			st.code = http.StatusTooManyRequests
			return
		}
		defer release()
	}
	var dst []byte
	bp := bodyBufs.get(r.ContentLength)
	if bp != nil {
		dst = *bp
	}
	body, status, err := p.readBody(w, r, dst)
	defer func() {
		// The buffer goes back unless a net/http Transport had the body
		// in it (the Transport may read a request body after Do
		// returns).
		if bp == nil {
			return
		}
		if shares := cap(body) > 0 && &body[:1][0] == &(*bp)[:1][0]; !shares || !st.netHTTP {
			bodyBufs.put(bp)
		}
	}()
	if err != nil {
		st.code = writeError(w, status, err.Error())
		return
	}
	p.clearBodyDeadline(w, r)
	// Read to its end, the body is closed now: net/http otherwise looks
	// for more of it after the handler (io.CopyN through a LimitReader,
	// two allocations per request).
	_ = r.Body.Close()
	st.body = body
	var tp *[]byte
	if ep.renderTo != nil {
		tp = textBufs.get(int64(len(body)))
	}
	if tp != nil {
		defer textBufs.put(tp)
		st.prompt, err = ep.renderTo(*tp, body)
	} else {
		st.prompt, err = ep.render(body)
	}
	if err != nil {
		st.code = writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	c := p.cfg.Contract
	st.root = c.Root(st.prompt.Model, st.prompt.CacheSalt)
	st.hashes = c.AppendHashes(nil, st.root, st.prompt.Text)
	req := route.Request{Hashes: st.hashes, Probes: summary.MakeProbes(nil, st.hashes), Root: st.root,
		ClientKey: p.clientKey(r, &st.prompt)}
	defer p.countHeat(st, &req)()
	if st.hop {
		// The deciding router's counts, for a re-pick among this
		// router's own replicas.
		req.Concurrent, req.ForkBlocks = parseHop(r.Header.Get(HeaderHop))
		req.ForkBlocks = min(req.ForkBlocks, len(st.hashes))
	}
	st.concurrent, st.fork = req.Concurrent, req.ForkBlocks

	if id := st.prompt.PreviousResponseID; id != "" {
		p.replicaOfResponse(r.Context(), r, id, st.hop) // decide finds it
	}
	// The loads, and the placement sequence they reflect (placeBook).
	var cands []route.Candidate
	var release func()
	snap := p.places.read(func() {
		if pv, ok := p.cfg.View.(pooledView); ok {
			if release != nil {
				release()
			}
			cands, release = pv.PooledCandidates(st.prompt.Model)
		} else {
			cands = p.cfg.View.Candidates(st.prompt.Model, cands[:0])
		}
		p.load.fill(cands)
		p.hops.fill(cands, p.clock)
		if p.loadsRead != nil {
			p.loadsRead()
		}
	})
	if release != nil {
		defer release()
	}
	hinted, hintMatch := -1, 0
	if st.hop && len(cands) > 0 {
		cands, hinted = p.ownCandidates(cands, r.Header.Get(HeaderReplica))
		if m, err := strconv.Atoi(r.Header.Get(HeaderMatch)); err == nil {
			hintMatch = min(max(m, 0), len(st.hashes))
		}
	}
	if len(cands) == 0 {
		st.code = p.noCandidate(w, st)
		return
	}

	counted := false
	start := p.now()
	// more reports whether another attempt may follow this one: another
	// candidate, under the attempt cap and within the retry budget.
	attempt := 1
	more := func() bool {
		return attempt < p.cfg.MaxAttempts && len(cands) > 1 && p.now().Sub(start) < p.cfg.RetryBudget
	}
	for ; ; attempt++ {
		var d route.Decision
		decided := hinted < 0
		if !decided {
			// The deciding router counted this decision; the owner serves it.
			d = route.Decision{Index: hinted, Match: hintMatch}
			hinted = -1
		} else {
			d = p.decide(ep, st, req, cands)
		}
		// Book the request before the next decision of this router reads
		// the loads: the decisions computed alongside it are caught up
		// (placeBook); attempt ends the booking.
		var bk booking
		d, bk, snap = p.commit(ep, st, req, cands, d, snap, decided)
		if decided {
			if !counted {
				reason := d.Reason
				if st.hop {
					reason = ReasonRehint
				}
				p.m.countDecision(reason)
				counted = true
				if p.log.IsDebug() {
					c := &cands[d.Index]
					p.log.Debug("decision", "reason", reason, "replica", c.ID(), "match", d.Match, "blocks", len(st.hashes),
						"candidates", len(cands), "in_flight", c.InFlight, "running", c.Running, "waiting", c.Waiting, "slots", c.Slots,
						"pending", c.PendingPrefillBlocks, "stale", c.Stale, "client_key", req.ClientKey != 0)
				}
			}
		}
		st.blockMs = blockMsOf(p.cfg.Policy, &cands[d.Index])
		switch p.attempt(w, r, st, cands[d.Index].ID(), d, more, &bk) {
		case attemptDone:
			if !st.cut {
				p.served(w, st, cands[d.Index].ID())
			}
			return
		case attemptFailed:
			msg := fmt.Sprintf("the upstream for the model '%s' failed after the request was sent; not retried, since a generation may be running", st.prompt.Model)
			if st.hopDispatched {
				msg = fmt.Sprintf("the router owning the replica for the model '%s' failed after it had dispatched the request; not retried, since a generation may be running", st.prompt.Model)
			}
			if st.ownerGone {
				// ownergone.go: 502 with a code a client can act on.
				st.code = writeErrorCode(w, http.StatusBadGateway, "", codeOwnerGone, fmt.Sprintf(
					"the router owning the replica for the model '%s' left the mesh and does not answer; the request may have been dispatched, so it was not retried", st.prompt.Model))
				return
			}
			st.code = writeError(w, http.StatusBadGateway, msg)
			return
		}
		if !more() {
			st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("all %d upstream attempts for the model '%s' failed", attempt, st.prompt.Model))
			return
		}
		cands = slices.Delete(cands, d.Index, d.Index+1)
		if st.downOwner != "" {
			cands = p.avoidOwner(cands, st.downOwner, st.downSince)
			st.downOwner = ""
			if len(cands) == 0 {
				st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("all %d upstream attempts for the model '%s' failed", attempt, st.prompt.Model))
				return
			}
		}
		p.m.retries.Inc()
	}
}

// noCandidate answers a request no replica can take now: 404
// model_not_found only when the mesh's models are known and none is this
// one; otherwise 503 with Retry-After, which a client can act on.
func (p *Proxy) noCandidate(w http.ResponseWriter, st *reqState) int {
	model := st.prompt.Model
	switch {
	case st.hop:
		return writeRetryLater(w, http.StatusServiceUnavailable, time.Second, fmt.Sprintf("no healthy replica of this router serves the model '%s'", model))
	case p.modelKnown(model):
		return writeRetryLater(w, http.StatusServiceUnavailable, time.Second, fmt.Sprintf("no healthy replica serves the model '%s'", model))
	case !p.modelsKnown():
		return writeRetryLater(w, http.StatusServiceUnavailable, time.Second, "the router does not know the mesh's models yet")
	default:
		return writeModelNotFound(w, model)
	}
}

// readBody reads the request body once, under the size limit, as its
// bytes arrive: a Content-Length is only checked against the limit, never
// allocated, and the body deadline (setBodyDeadline) ends a trickle.
// A body of known small length is read into dst when it fits.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, dst []byte) ([]byte, int, error) {
	limit := p.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		abandonBody(w, r)
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds %d bytes", limit)
	}
	var b []byte
	var err error
	if r.ContentLength > 0 && r.ContentLength <= preallocBody {
		b, err = readKnown(dst, r.Body, r.ContentLength, limit)
	} else {
		b, err = readLimited(r.Body, limit)
	}
	switch {
	case err == nil:
		return b, 0, nil
	case errors.Is(err, errBodyTooLarge):
		abandonBody(w, r)
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds %d bytes", limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.edge.rejected.WithLabelValues(rejectBodyTimeout).Inc()
		p.junk.Printf("request body from %s not read within %v", r.RemoteAddr, p.cfg.BodyTimeout)
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestTimeout, fmt.Errorf("request body not received within %v", p.cfg.BodyTimeout)
	default:
		return nil, http.StatusBadRequest, fmt.Errorf("reading request body: %v", err)
	}
}

// preallocBody is the largest declared body read into one allocation of
// its size; a larger one grows as its bytes arrive, so that a declared
// length alone never makes the router allocate.
const preallocBody = 64 << 10

// readKnown reads a body whose Content-Length n (within the limit) is
// known and small: into dst when its capacity holds n+1 bytes, else one
// allocation of n bytes, where io.ReadAll would grow a slice from 512
// bytes through half a dozen copies. It reads on to the
// end of the body, since net/http watches for the client going away only
// once the body hit EOF; a body longer than declared (which net/http's
// server never delivers) is read on under the limit.
func readKnown(dst []byte, body io.Reader, n, limit int64) ([]byte, error) {
	var b []byte
	if int64(cap(dst)) > n {
		b = dst[:n]
	} else {
		b = make([]byte, n, n+1)
	}
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, err
	}
	for range 3 { // a Read may return (0, nil); a few are allowed
		m, err := body.Read(b[n : n+1])
		switch {
		case m == 0 && err == io.EOF:
			return b, nil
		case err != nil && err != io.EOF:
			return nil, err
		case m > 0:
			rest, err := readLimited(body, limit-n-1)
			if err != nil {
				return nil, err
			}
			return append(b[:n+1], rest...), nil
		}
	}
	rest, err := readLimited(body, limit-n)
	if err != nil {
		return nil, err
	}
	return append(b, rest...), nil
}

// ownCandidates keeps the candidates this router owns (a forwarded request
// never travels further) and finds the hinted replica among them. The
// deciding router saw this router's replicas as they were up to a gossip
// interval ago, and not the other routers' dispatches since; this router
// counts them exactly, so it keeps the hint only while route's rule says
// the replica can still start the request (route.Policy.KeepHint), and
// otherwise decides again among its own replicas.
func (p *Proxy) ownCandidates(cands []route.Candidate, hint string) ([]route.Candidate, int) {
	keep := false
	for i := range cands {
		if cands[i].ID() == hint {
			keep = p.cfg.Policy.KeepHint(cands, i)
			break
		}
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

// attempt sends the request to one candidate. more reports whether
// another attempt may follow; when not, an upstream's refusal is passed
// through to the client (its own Retry-After is more useful than a 502).
func (p *Proxy) attempt(w http.ResponseWriter, r *http.Request, st *reqState, id string, d route.Decision, more func() bool, bk *booking) attemptResult {
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
	_, _, plain := splitHTTPURL(url)
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
	var watch *hopWatch
	var hop *liveHop
	if local {
		if !p.announceDispatch(w, r, st, id) {
			return attemptDone
		}
	} else {
		p.signHop(out, id, d.Match, st.concurrent, st.fork)
		mark := bk.mark
		// The hop's own cancellation, with a cause: the owner's loss
		// (ownergone.go) ends it, and its error says why.
		hctx, end := context.WithCancelCause(ctx)
		defer end(nil)
		if p.cfg.HopDispatchTimeout > 0 {
			out, watch = p.watchHop(hctx, out, func(to string) {
				// The owner decided again: count the request where it runs.
				if api, local, ok := p.cfg.View.Locate(to); ok && !local && api == ownerAPI {
					p.hops.move(mark, to)
				}
			})
			defer watch.stop()
		} else {
			out = out.WithContext(hctx)
		}
		hop = p.owners.add(ownerAPI, watch, end)
		defer p.owners.remove(hop)
		st.ownerHop = hop
	}
	g := p.m.inflightOf(id)
	g.Inc()
	defer g.Dec()

	start := time.Now()
	var resp *http.Response
	var err error
	if fast {
		resp, err = p.up.do(ctx, url, r.Header, st.body)
	} else {
		resp, err = p.client.Do(out)
	}
	if err == nil && hop != nil {
		// The headers came; the body's bytes are the owner speaking
		// (ownergone.go).
		hop.spoke()
		hop.relaying.Store(true)
		resp.Body = &hopBody{ReadCloser: resp.Body, h: hop}
	}
	if err != nil {
		if r.Context().Err() != nil {
			st.code = statusClientGone
			return attemptDone
		}
		if local {
			p.reportFailure(id)
		}
		if hop.gone() && !neverReached(err) && (watch == nil || !watch.unsent()) {
			p.log.Warn("owner router gone from the mesh and silent after it was sent the request; not retrying", "replica", id, "owner", ownerAPI)
			st.ownerGone = true
			p.m.ownerGone.WithLabelValues(goneError).Inc()
			return attemptFailed
		}
		if watch != nil {
			if res, ok := p.hopFailed(watch, st, id, ownerAPI, err); ok {
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
	if refused(resp.StatusCode) && more() {
		p.drainRefused(resp, cancel)
		p.log.Warn("upstream refused the request, trying another", "replica", id, "status", resp.StatusCode)
		if local && resp.StatusCode >= 500 {
			p.reportFailure(id)
		}
		return attemptNotReached
	}
	st.code = resp.StatusCode
	var first time.Time
	p.relay(w, r, resp, st, id, d, local, start, cancel, func() { first = p.now(); firstByte() })
	if !st.cut {
		p.observeSlot(st, id, d, first)
	}
	return attemptDone
}

// relay streams the upstream response to the client as it arrives. For
// an owned replica's successful response it learns the answer on the way
// and records prompt + answer once the response is complete.
// cancel, when not nil, cancels a net/http request (resp's).
//
// An upstream silent mid-body is cut off (idle.go): a blocked read of the
// own client's connection fails on a past deadline, net/http's on the
// request's cancellation.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, st *reqState, id string, d route.Decision, local bool, start time.Time, cancel, firstByte func()) {
	obs := p.m.target(local)
	var idle *idleWatch
	if b, ok := resp.Body.(*upBody); ok {
		idle = p.watchIdle(b.c.nc, nil, !local)
	} else if cancel != nil {
		idle = p.watchIdle(nil, cancel, !local)
	}
	if idle != nil {
		defer func() {
			if idle.stop() {
				if b, ok := resp.Body.(*upBody); ok {
					b.reuse = false // its read deadline is past
				}
			}
		}()
	}
	h := w.Header()
	for k, vv := range resp.Header {
		if !hopByHop(k) {
			h[k] = vv
		}
	}
	removeConnectionHeaders(h, resp.Header)
	w.WriteHeader(resp.StatusCode)
	sse := isEventStream(resp.Header.Get("Content-Type"))
	flush := sse || resp.ContentLength < 0
	rc := http.NewResponseController(w)
	wd := p.writeDeadline(rc)
	var flushed error = errNotFlushed
	if flush {
		wd.extend()
		flushed = rc.Flush() // the client sees the headers before the first token
	}
	var sink *reply.Sink
	if local && resp.StatusCode >= 200 && resp.StatusCode < 300 && !st.byLoad {
		// The replica accepted the request: it holds (or is computing) the
		// prompt now. A refused or failed request records nothing, and
		// embeddings leave no cache.
		p.cfg.View.Record(id, st.hashes)
		if resp.StatusCode == http.StatusOK {
			sink = reply.NewSink(sse, p.answers)
			defer sink.Release()
		}
	}
	tap := streamTap{sink: sink, firstByte: firstByte, ttft: obs.ttft, start: start, idle: idle}
	fr := framing(w, sse)
	// failed handles a failed read of the replica mid-response.
	failed := func(rerr error) {
		if r.Context().Err() != nil {
			st.code = statusClientGone
			return
		}
		cause := midstreamError
		if st.ownerHop.gone() {
			cause = midstreamOwnerGone
			p.log.Warn("owner router gone from the mesh and silent mid-response: ended", "replica", id, "owner", st.ownerHop.owner)
		} else if idle.fired() {
			cause = midstreamIdle
			p.junk.Printf("upstream %s sent nothing of its response for %v: ended", id, idle.d)
		} else {
			p.log.Warn("upstream failed mid-response", "replica", id, "error", rerr)
		}
		if local {
			p.reportFailure(id)
		}
		obs.duration.Observe(time.Since(start).Seconds())
		st.cut = true
		if fr.canEnd() && endStream(w, rc, &wd, st, cause, idle) {
			p.m.midstream.WithLabelValues(cause, endErrorEvent).Inc()
			return
		}
		p.m.midstream.WithLabelValues(cause, endAborted).Inc()
		// The only honest signal once bytes are sent; net/http
		// recovers it and closes the connection.
		panic(http.ErrAbortHandler)
	}
	ended := false
	var held []byte // a partial event the stream loop held back (eventFraming)
	if body, cc := p.loopEligible(w, r, resp, sse); body != nil && flushed == nil {
		// The loop calls the tap on its goroutine: a copy on the heap,
		// so that the normal path's stays on the stack.
		lt := new(streamTap)
		*lt = tap
		res, pending, rest, err := p.loops.relay(r, body, cc, lt.loopData, idle.firedC(), &fr)
		tap = *lt
		switch res {
		case loopEOF:
			ended = true
		case loopClientGone:
			p.log.Debug("client went away mid-response", "replica", id, "error", err)
			st.code = statusClientGone
			return
		case loopFailed:
			failed(err)
			return
		case loopPanicked:
			// Part of the stream may be lost with the panic: only a
			// broken connection tells the client the response is not
			// whole. Not the replica's failure.
			st.code = http.StatusInternalServerError
			panic(http.ErrAbortHandler)
		case loopHandback:
			idle.busy() // until the normal path reads again
			held = rest
			if len(pending) > 0 {
				// The rest of a chunk, behind which the client's socket
				// was full: written as the handler's goroutine writes.
				wd.extend()
				if _, werr := cc.Write(pending); werr != nil {
					p.clientGone(st, id, werr)
					return
				}
			}
		}
	}
	if !ended {
		bufp := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(bufp)
		buf := *bufp
		// buf[:n] holds what was read and not yet written: a partial
		// SSE event, held back until its end comes (eventFraming).
		n := copy(buf, held)
		for {
			// The silence counted is the time spent waiting in Read: a
			// write to a slow client in between is not the upstream's.
			idle.saw()
			m, rerr := resp.Body.Read(buf[n:])
			idle.busy()
			if m > 0 {
				tap.data(buf[n : n+m])
			}
			k := n + m
			if rerr != io.EOF {
				k = fr.cut(buf[:n+m], n, n+m == len(buf))
			}
			if k > 0 {
				wd.extend()
				if _, werr := w.Write(buf[:k]); werr != nil {
					p.clientGone(st, id, werr)
					return
				}
				if flush {
					if err := rc.Flush(); err != nil {
						p.clientGone(st, id, err)
						return
					}
				}
			}
			n = copy(buf, buf[k:n+m])
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				failed(rerr)
				return
			}
		}
	}
	if !tap.got {
		firstByte()
		obs.ttft.Observe(time.Since(start).Seconds())
	}
	obs.duration.Observe(time.Since(start).Seconds())
	if sink != nil {
		sink.Finish()
		p.learn(st, id, d, sink)
	}
}

// endStream ends a failed SSE stream for its client (midstream.go): the
// endpoint's error event, flushed; relay then returns and net/http ends
// the body. It reports whether the event was written (a client that is
// gone leaves st.code 499 and nothing to end).
func endStream(w http.ResponseWriter, rc *http.ResponseController, wd *writeDeadline, st *reqState, cause string, idle *idleWatch) bool {
	code, msg := codeUpstreamError, "the upstream failed in the middle of the response; it is incomplete"
	switch cause {
	case midstreamIdle:
		code, msg = codeUpstreamTimeout, fmt.Sprintf("the upstream sent nothing for %v in the middle of the response; it is incomplete", idle.d)
	case midstreamOwnerGone:
		code, msg = codeOwnerGone, "the router owning the replica left the mesh and does not answer, in the middle of the response; it is incomplete"
	}
	wd.extend()
	if _, err := w.Write(streamErrorEvent(st.path, code, msg)); err != nil {
		st.code = statusClientGone
		return false
	}
	if err := rc.Flush(); err != nil {
		st.code = statusClientGone
		return false
	}
	return true
}

// streamTap sees a response's bytes on their way to the client: the
// first byte's time and the answer.
type streamTap struct {
	got       bool
	sink      *reply.Sink
	firstByte func()
	ttft      prometheus.Observer
	start     time.Time
	idle      *idleWatch // nil: no upstream idle timeout
}

// loopData is data on the stream loop, whose reads of the replica never
// wait for the client: each piece of body is when the replica last spoke.
func (t *streamTap) loopData(b []byte) {
	t.idle.saw()
	t.data(b)
}

func (t *streamTap) data(b []byte) {
	if !t.got {
		t.got = true
		t.idle.heard()
		t.firstByte()
		t.ttft.Observe(time.Since(t.start).Seconds())
	}
	if t.sink != nil {
		t.sink.Feed(b)
	}
}

// learn records what the replica holds after a complete response (prompt
// + answer) and checks the summary's prediction against the engine's
// report. The engine's cached tokens are the ground truth: the blocks the
// summary claimed beyond them are forgotten (the replica evicted them),
// and the prompt is recorded again after that, since the engine has just
// computed it.
func (p *Proxy) learn(st *reqState, id string, d route.Decision, sink *reply.Sink) {
	forgot := false
	if u := sink.Usage(); u.Present {
		if u.PromptTokens > 0 {
			p.m.promptTokens.Add(float64(u.PromptTokens))
		}
		if u.HasCached {
			c := u.CachedTokens
			if c > 0 {
				p.m.reportedCached.Add(float64(c))
			}
			p.m.predictedCached.Add(float64(d.Match * p.cfg.Contract.BlockBytes / bytesPerToken))
			forgot = p.correct(st, id, d.Match, c, u.PromptTokens)
		}
	}
	if len(sink.Answer()) == 0 && !forgot {
		return
	}
	// The text (prompt + answer) starts with the prompt, so the chain
	// continues from the prompt's last full block: only the prompt's
	// partial last block and the answer are rendered again.
	n, bb := len(st.hashes), p.cfg.Contract.BlockBytes
	from := st.root
	if n > 0 {
		from = st.hashes[n-1]
	}
	tail := st.prompt
	tail.Text = st.prompt.Text[n*bb:]
	all := p.cfg.Contract.AppendHashes(st.hashes[:n:n], from, tail.AppendAnswer(string(sink.Answer())))
	if len(all) > n || forgot {
		p.cfg.View.Record(id, all)
	}
}

// forgetSlackBlocks is how many blocks past the reported cached tokens
// (when any are reported) are still taken as held: the engine counts
// chat-template tokens the canonical text does not have and rounds down to
// its own block size, so a correct prediction may exceed the report by a
// fraction of a block.
const forgetSlackBlocks = 1

// correct compares the predicted match (blocks) with the engine's
// reported cached tokens, observes the error, and forgets the blocks the
// summary claimed beyond the report. It reports whether it forgot any.
func (p *Proxy) correct(st *reqState, id string, match int, cached, promptTokens int64) bool {
	bb := float64(p.cfg.Contract.BlockBytes)
	// Convert tokens to canonical-text bytes with this request's own
	// ratio (its prompt's bytes over its reported tokens) when it is
	// sane, else the English average.
	bpt := float64(bytesPerToken)
	if promptTokens > 0 && len(st.prompt.Text) > 0 {
		bpt = min(max(float64(len(st.prompt.Text))/float64(promptTokens), 1), 8)
	}
	reported := float64(max(cached, 0)) * bpt / bb
	p.m.predictionError.Observe(float64(match) - reported)
	keep := 0 // nothing reported: nothing of the prefix is held
	if cached > 0 {
		keep = int(reported) + forgetSlackBlocks
	}
	match = min(match, len(st.hashes))
	if keep >= match {
		return false
	}
	p.cfg.View.Forget(id, st.hashes[keep:match])
	p.m.forgotten.Add(float64(match - keep))
	return true
}

func (p *Proxy) reportFailure(id string) {
	if p.cfg.ReportFailure != nil {
		p.cfg.ReportFailure(id)
	}
}

func isEventStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// Hop-by-hop headers (RFC 9110 7.6.1) are never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func hopByHop(k string) bool {
	return slices.Contains(hopHeaders, k)
}

func removeConnectionHeaders(dst, src http.Header) {
	for _, v := range src["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				dst.Del(f)
			}
		}
	}
}

// forwardsRequestHeader reports whether the client's request header k
// goes on to an upstream (both clients use it: copyRequestHeader for
// net/http, appendRequest for the own one). Not forwarded: hop-by-hop
// headers and those the client's Connection header (conn) names; kvmesh's
// own hints (only this router sets them); Accept-Encoding (the router reads
// the answer and streams identity); Content-Length, Host and Expect (the
// router frames the request and holds the whole body already).
func forwardsRequestHeader(k string, conn []string) bool {
	return !hopByHop(k) && k != "Accept-Encoding" && k != "Content-Length" && k != "Host" && k != "Expect" &&
		!strings.HasPrefix(k, "X-Kvmesh-") && !headerHasToken(conn, k)
}

// copyRequestHeader copies the client's headers that go upstream
// (forwardsRequestHeader) to an upstream request.
func copyRequestHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if forwardsRequestHeader(k, conn) {
			dst[k] = vv
		}
	}
}
