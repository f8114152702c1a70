package proxy

import (
	"context"
	"fmt"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

// The request path of an inference request, top to bottom:
//
//	inference   admit, read and render, read the loads (this file)
//	queue       wait while the model is saturated (admission.go)
//	attemptAll  attempt until one settles it (this file)
//	  decideAndBook  decide and book the attempt's replica (place.go)
//	  attempt        send to the replica or its owner (this file)
//	relay       stream the answer to the client (relay.go)
//	learn       record what the replica now holds (relay.go)

// statusClientGone labels requests whose client went away before the
// response was complete (nginx's convention).
const statusClientGone = 499

// reqState is one inference request on its way through the router: the
// handler's request and writer, what was read of it, its decision's
// inputs, and what it holds until it ends.
type reqState struct {
	p                *Proxy
	w                http.ResponseWriter
	r                *http.Request
	ep               *endpoint
	code             int // the status the client got, for the metric
	concurrent, fork int // the decision's route.Request.Concurrent and ForkBlocks, passed on with a hop
	path             string
	body             []byte
	prompt           prompt.Prompt
	root             uint64
	hashes           []uint64
	hop              bool
	byLoad           bool // placed by load; the response is not read
	// split: this router splits the request into a prefill and a decode
	// leg (pd.go); leg: the request is one of them (hop.Leg), from this
	// router (a leg it answers itself, or its decode leg) or another.
	split bool
	leg   hop.Leg
	// gate, when set, lets the response of an attempt through to the
	// client (an SGLang decode leg waits for its prefill leg, pdleg.go);
	// abandoned: it did not, and nothing of the attempt was sent.
	gate      func() bool
	abandoned bool
	lastID    string // the replica of the latest attempt

	// The decision's inputs: the routing request, the candidates with
	// their loads, the placement sequence those reflect (placeBook), and
	// a forwarded request's hinted candidate (-1: none) and match.
	req       route.Request
	cands     []route.Candidate
	snap      uint64
	hinted    int
	hintMatch int
	// attempts made so far, and when the first began (the retry budget);
	// arrived: when this router began to serve it (the request TTFT).
	attempts       int
	began, arrived time.Time

	blockMs     float64 // the chosen candidate's prefill time per block (load.go's slot time)
	flightMatch int     // the prompt's leading blocks that requests computed before it, still in flight, hold at the attempt's owned replica (inflight.go)
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
	// not answer (hop.Owners); ownerHop is the hop in flight, if any.
	ownerGone bool
	ownerHop  *hop.Live
	// netHTTP: an attempt went through net/http, whose Transport may
	// still read the body after it returned; the body is not reused.
	netHTTP bool
	// cut: the upstream failed mid-response (the client got an error
	// event or a broken connection); nothing of it is learnt.
	cut bool
	// stall: the attempt in flight at an owned replica, as the stall
	// detection follows it (stall.go; nil: none).
	stall *stallMark
	// quota: the tenant's token charge, settled by finish to what the
	// engine reported (spent; tenants.go).
	quota  quota.Ticket
	spent  spent
	answer string // a decode leg's whole answer, for its warm request (pdwarm.go)

	// What the request holds until it ends (finish releases it).
	releaseClient, releaseCands, endHeat, releaseAdmit func()
	bodyBuf, textBuf                                   *[]byte
}

// inference serves the inference endpoints (endpoints.go).
func (p *Proxy) inference(w http.ResponseWriter, r *http.Request, ep *endpoint) {
	st := &reqState{p: p, w: w, r: r, ep: ep, path: r.URL.Path, byLoad: ep.byLoad, arrived: p.now()}
	// Deferred, so that the count and the releases still run when a dead
	// upstream aborts the handler.
	defer st.finish()
	if !st.admit() || !st.read() {
		return
	}
	st.split = splits(st)
	st.route()
	st.readLoads()
	if len(st.cands) == 0 {
		st.code = st.noCandidate()
		return
	}
	if !reserveTokens(st) || !p.admit.queue(st) {
		return
	}
	if st.split {
		serveSplit(st)
		return
	}
	st.attemptAll()
}

// queue is st's admission, between reading its candidates and deciding
// (a step of the request path, so here; admission.go has the rest):
// it goes on at once while its model has room and nothing queues;
// otherwise it waits in the router's queue, without its candidates and
// heat (a wait holds neither pooled storage nor a place in the burst
// counts), and reads both again when its turn comes. It reports whether
// to go on; when not, it has answered (or the client is gone). A hop was
// admitted by the router it entered.
func (ad *admission) queue(st *reqState) bool {
	if ad == nil || st.hop {
		return true
	}
	req := ad.request(st.r.Header, clientAddr(st.r), &st.prompt)
	room := admit.RoomOf(st.cands, ad.a.Limits())
	release, v := ad.a.Admit(st.r.Context(), req, room, func() { letGo(st) })
	if !v.Admitted() {
		if v.Status == statusClientGone {
			st.code = statusClientGone
			return false
		}
		st.code = writeRetryLater(st.w, v.Status, v.RetryAfter, v.Message(st.prompt.Model))
		return false
	}
	st.releaseAdmit = release
	if !v.Queued {
		return true
	}
	st.route()
	st.readLoads()
	if len(st.cands) == 0 {
		st.code = st.noCandidate()
		return false
	}
	return true
}

// letGo gives back st's candidates' storage and heat count before a wait
// in the queue.
func letGo(st *reqState) {
	if st.releaseCands != nil {
		st.releaseCands()
		st.releaseCands, st.cands = nil, nil
	}
	if st.endHeat != nil {
		st.endHeat()
		st.endHeat = nil
	}
}

// finish releases what the request held, newest first, and counts it.
func (st *reqState) finish() {
	if st.quota.Held() {
		settleTokens(st.p.cfg.Quota, st.quota, st.code, st.spent, st.p.ratios.Overall())
	}
	if st.releaseAdmit != nil {
		st.releaseAdmit()
	}
	if st.releaseCands != nil {
		st.releaseCands()
	}
	if st.endHeat != nil {
		st.endHeat()
	}
	if st.textBuf != nil {
		textBufs.put(st.textBuf)
	}
	if bp := st.bodyBuf; bp != nil {
		// The buffer goes back unless a net/http Transport had the body
		// in it (the Transport may read a request body after Do
		// returns).
		if shares := cap(st.body) > 0 && &st.body[:1][0] == &(*bp)[:1][0]; !shares || !st.netHTTP {
			bodyBufs.put(bp)
		}
	}
	if st.releaseClient != nil {
		st.releaseClient()
	}
	st.p.m.countRequest(st.ep.label, st.code, st.hop)
}

// admit checks the method, the hop's hints or the client's key, and the
// client's cap on requests in flight. It reports whether to go on; when
// not, it has answered.
func (st *reqState) admit() bool {
	p, w, r := st.p, st.w, st.r
	if r.Method != http.MethodPost {
		abandonBody(w, r)
		w.Header().Set("Allow", http.MethodPost)
		st.code = writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return false
	}
	// A peer's hop is bounded by the peer's own edges; a client's request
	// must fit the client's cap. Only a hop a peer provably sent skips
	// the API key (the client's key was checked where it arrived).
	isHop, authenticated := p.hopOf(r)
	st.hop = isHop
	if st.announce = authenticated; authenticated {
		st.dispatchBy = hop.DispatchDeadline(r)
	}
	if !authenticated && !p.authorize(w, r) {
		st.code = http.StatusUnauthorized
		return false
	}
	if !st.hop {
		release, ok := p.admitClient(w, r)
		if !ok {
			st.code = http.StatusTooManyRequests
			return false
		}
		st.releaseClient = release
	}
	return true
}

// read reads the body (into a pooled buffer when its length is known and
// small) and renders its prompt. It reports whether to go on; when not,
// it has answered.
func (st *reqState) read() bool {
	p, w, r, ep := st.p, st.w, st.r, st.ep
	var dst []byte
	st.bodyBuf = bodyBufs.get(r.ContentLength)
	if st.bodyBuf != nil {
		dst = *st.bodyBuf
	}
	body, status, err := st.readBody(dst)
	if err != nil {
		st.code = writeError(w, status, err.Error())
		return false
	}
	p.clearBodyDeadline(w, r)
	// Read to its end, the body is closed now: net/http otherwise looks
	// for more of it after the handler (io.CopyN through a LimitReader,
	// two allocations per request).
	_ = r.Body.Close()
	st.body = body
	if ep.renderTo != nil {
		st.textBuf = textBufs.get(int64(len(body)))
	}
	if st.textBuf != nil {
		st.prompt, err = ep.renderTo(*st.textBuf, body)
	} else {
		st.prompt, err = ep.render(body)
	}
	if err != nil {
		st.code = writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// route hashes the prompt into its blocks and makes the routing request:
// probes, client key, and the counts of requests under its heat key (the
// deciding router's, on a hop).
func (st *reqState) route() {
	p, r := st.p, st.r
	c := p.cfg.Contract
	st.root = c.Root(st.prompt.Model, st.prompt.CacheSalt)
	st.hashes = c.AppendHashes(nil, st.root, st.prompt.Text)
	st.req = route.Request{Hashes: st.hashes, Probes: summary.MakeProbes(nil, st.hashes), Root: st.root,
		Model: route.ModelKey(st.prompt.Model), ClientKey: p.clientKey(r, &st.prompt), Whole: c.ShortKey(st.root, st.prompt.Text)}
	st.endHeat = st.countHeat()
	if st.hop {
		// The deciding router's counts, for a re-pick among this
		// router's own replicas.
		st.req.Concurrent, st.req.ForkBlocks = hop.Parse(r.Header.Get(hop.HeaderHop))
		st.req.ForkBlocks = min(st.req.ForkBlocks, len(st.hashes))
		st.leg = hop.ParseLeg(r.Header.Get(hop.HeaderHop))
		st.byLoad = st.byLoad || st.leg == hop.LegDecode // placed by load, not learnt (pd.go)
	}
	st.concurrent, st.fork = st.req.Concurrent, st.req.ForkBlocks
	if id := st.prompt.PreviousResponseID; id != "" {
		p.lookups.replicaOf(r.Context(), r, id, st.hop) // decide finds it
	}
}

// clientKey hashes the routing key a client sent, in order of precedence:
// the body's prompt_cache_key, then the session header, then SGLang's
// bootstrap_room. 0 means none. The kind is hashed in, so one value sent
// as two kinds of key does not collide.
func (p *Proxy) clientKey(r *http.Request, pr *prompt.Prompt) uint64 {
	var kind uint64
	var v string
	switch {
	case pr.CacheKey != "":
		kind, v = 1, pr.CacheKey
	case p.sessionHeader != "" && r.Header.Get(p.sessionHeader) != "":
		kind, v = 2, r.Header.Get(p.sessionHeader)
	case pr.BootstrapRoom != "":
		kind, v = 3, pr.BootstrapRoom
	default:
		return 0
	}
	h := xxh3.HashStringSeed(v, 0x6b65790000000000|kind)
	if h == 0 {
		h = 1
	}
	return h
}

// readLoads reads the candidates with their loads, and the placement
// sequence they reflect (placeBook); a forwarded request keeps this
// router's own candidates and finds its hint among them.
func (st *reqState) readLoads() {
	p, r := st.p, st.r
	st.snap = p.places.read(func() {
		if st.releaseCands != nil {
			st.releaseCands()
		}
		st.cands, st.releaseCands = p.cfg.View.PooledCandidates(st.prompt.Model)
		st.cands = fitRole(st.cands, st.leg, st.split, strictLegs(p))
		p.load.fill(st.cands)
		p.hops.Fill(st.cands, p.cfg.View)
		p.places.fillWritten(st.cands)
		if p.loadsRead != nil {
			p.loadsRead()
		}
	})
	st.hinted = -1
	if st.hop && len(st.cands) > 0 {
		st.cands, st.hinted = ownCandidates(p.cfg.Policy, st.cands, r.Header.Get(hop.HeaderReplica), st.leg == hop.LegPinned)
		if m, err := strconv.Atoi(r.Header.Get(hop.HeaderMatch)); err == nil {
			st.hintMatch = min(max(m, 0), len(st.hashes))
		}
		// The hint is the entry router's copy of the summary, which lags
		// the owner's by a gossip round or more (a conversation's next
		// turn may arrive before its last answer reached the copy): the
		// owner's own summary says what the replica holds, which the
		// request's prefill, prediction and correction count.
		if st.hinted >= 0 {
			if sum := st.cands[st.hinted].Summary; sum != nil {
				st.hintMatch = sum.Match(st.req.Probes)
			}
		}
	}
}

// attemptAll decides, books and attempts until an attempt settles the
// request, or no other attempt may follow.
func (st *reqState) attemptAll() {
	p := st.p
	counted := false
	st.began = p.now()
	for st.attempts = 1; ; st.attempts++ {
		d, bk := st.decideAndBook(&counted)
		var ok bool
		if d, bk, ok = bindLate(st, d, bk); !ok {
			return
		}
		st.blockMs = blockMsOf(p.cfg.Policy, &st.cands[d.Index])
		st.lastID = st.cands[d.Index].ID()
		switch st.attempt(st.lastID, d, &bk) {
		case attemptDone:
			if !st.cut {
				st.served(st.lastID)
			}
			return
		case attemptFailed:
			st.answerFailed()
			return
		case attemptAbandoned:
			st.abandoned = true
			return
		}
		if !st.more() {
			st.code = answerUnreached(st)
			return
		}
		st.cands = slices.Delete(st.cands, d.Index, d.Index+1)
		if st.downOwner != "" {
			st.cands = p.avoidOwner(st.cands, st.downOwner, st.downSince)
			st.downOwner = ""
			if len(st.cands) == 0 {
				st.code = answerUnreached(st)
				return
			}
		}
		p.m.retries.Inc()
	}
}

// more reports whether another attempt may follow this one: another
// candidate, under the attempt cap and within the retry budget. An
// attempt cut because its replica stalled is retried past the budget:
// its replica got nothing out for it (stall.go), and its client, who
// waited the stall window and the prefill expected of it, would
// otherwise get an error for that wait.
func (st *reqState) more() bool {
	p := st.p
	return st.attempts < p.cfg.MaxAttempts && len(st.cands) > 1 && (p.now().Sub(st.began) < p.cfg.RetryBudget || st.stall.wasStalled())
}

// answerFailed answers a request whose attempt may have reached a
// replica and failed before anything reached the client: 502, not
// retried.
func (st *reqState) answerFailed() {
	w := st.w
	if st.ownerGone {
		// hop.Owners: 502 with a code a client can act on.
		st.code = writeErrorCode(w, http.StatusBadGateway, "", hop.CodeOwnerGone, fmt.Sprintf(
			"the router owning the replica for the model '%s' left the mesh and does not answer; the request may have been dispatched, so it was not retried", st.prompt.Model))
		return
	}
	msg := fmt.Sprintf("the upstream for the model '%s' failed after the request was sent; not retried, since a generation may be running", st.prompt.Model)
	if st.hopDispatched {
		msg = fmt.Sprintf("the router owning the replica for the model '%s' failed after it had dispatched the request; not retried, since a generation may be running", st.prompt.Model)
	}
	st.code = writeError(w, http.StatusBadGateway, msg)
}

// noCandidate answers a request no replica can take now: 404
// model_not_found only when the mesh's models are known and none is this
// one; otherwise 503 with Retry-After, which a client can act on.
func (st *reqState) noCandidate() int {
	p, w := st.p, st.w
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
	// attemptAbandoned: the request's gate kept its response from the
	// client (st.gate); nothing reached the client.
	attemptAbandoned
)

// attempt sends the request to candidate id, as decision d booked it
// (bk), and relays the answer. When no other attempt may follow (more),
// an upstream's refusal is passed through to the client (its own
// Retry-After is more useful than a 502).
func (st *reqState) attempt(id string, d route.Decision, bk *booking) attemptResult {
	p, r := st.p, st.r
	sentHere := false
	defer func() { bk.end(); p.late.freed(sentHere) }()
	st.ownerHop = nil
	t, ok := st.targetOf(id)
	if !ok {
		return attemptNotReached
	}
	sentHere = t.local
	ctx := r.Context()
	var out *http.Request
	var cancel context.CancelFunc
	if !t.fast {
		// net/http's request ends with the attempt. The own client's
		// needs no context of its own: the body's Close (deferred below,
		// so before the attempt returns) ends it.
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		st.netHTTP = true
		var err error
		if out, err = newUpstreamRequest(ctx, t.url, r.Header, st.body); err != nil {
			p.log.Warn("bad upstream URL", "replica", id, "url", t.url, "error", err)
			return attemptNotReached
		}
	} else if p.stalls != nil {
		// The stall detection ends the own client's wait for the
		// headers through this.
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	// The request's accounting at the replica was booked with the
	// decision (bk, placeBook), and ends when this returns.
	firstByte := bk.firstByte
	if firstByte == nil {
		firstByte = func() {}
	}
	var watch *hop.Watch
	var live *hop.Live
	if t.local {
		if !st.announceDispatch(id) {
			return attemptDone
		}
	} else {
		p.signer.SignLeg(out, id, d.Match, st.concurrent, st.fork, st.leg)
		var end context.CancelCauseFunc
		out, watch, live, end = startHop(p, ctx, out, t.ownerAPI, bk.mark)
		defer end(nil)
		if watch != nil {
			defer watch.Stop()
		}
		defer p.owners.Remove(live)
		st.ownerHop = live
	}
	g := p.m.inflightOf(id)
	g.Inc()
	defer g.Dec()
	st.stall = nil
	if t.local {
		st.stall = p.stalls.add(id, st.prompt.Stream, float64(len(st.hashes)-d.Match), cancel)
		defer p.stalls.remove(st.stall)
	}

	start := time.Now()
	var resp *http.Response
	var err error
	if t.fast {
		resp, err = p.up.Do(ctx, t.url, r.Header, st.body)
	} else {
		resp, err = p.client.Do(out)
	}
	if err != nil {
		return st.sendFailed(&t, watch, live, err)
	}
	st.stall.headers(nil) // the relay hands over its watch
	if live != nil {
		// The headers came; the body's bytes are the owner speaking
		// (hop.Owners).
		live.Spoke()
		live.Relaying()
		resp.Body = live.WrapBody(resp.Body)
	}
	defer resp.Body.Close()
	if refused(resp.StatusCode) && st.more() {
		drainRefused(resp, cancel, p.cfg.UpstreamIdleTimeout)
		p.log.Warn("upstream refused the request, trying another", "replica", id, "status", resp.StatusCode)
		if t.local && resp.StatusCode >= 500 {
			p.reportFailure(id)
		}
		return attemptNotReached
	}
	if st.gate != nil && !st.gate() {
		return attemptAbandoned // its pair's prefill leg failed first (pdleg.go)
	}
	st.code = resp.StatusCode
	var first time.Time
	st.relay(resp, upstreamAnswer{id: id, d: d, local: t.local, start: start, cancel: cancel,
		firstByte: func() { first = firstByteAt(st, t.local); firstByte(); p.stalls.answer(st.stall) }})
	if !st.cut {
		st.observeSlot(id, d, first)
	}
	return attemptDone
}

// target is where an attempt goes: the replica, the router that owns it
// (its API, when not this one), the URL, and whether the router's own
// client reaches it (an owned plain-HTTP replica; a peer's hop, TLS or a
// custom transport go by net/http).
type target struct {
	id, ownerAPI, url string
	local, fast       bool
}

// targetOf locates candidate id; ok is false when it cannot be attempted
// (gone, or a peer not reachable over TLS when that is required).
func (st *reqState) targetOf(id string) (t target, ok bool) {
	p, r := st.p, st.r
	ownerAPI, local, ok := p.cfg.View.Locate(id)
	if !ok || (st.hop && !local) {
		p.log.Warn("candidate vanished before dispatch", "replica", id)
		return target{}, false
	}
	base := ownerAPI
	if local {
		base = id
	} else if p.cfg.RequirePeerTLS && !strings.HasPrefix(strings.ToLower(ownerAPI), "https://") {
		p.junk.Printf("not forwarding to %s: peer TLS is required and its API is %s", id, ownerAPI)
		return target{}, false
	}
	url := strings.TrimRight(base, "/") + st.path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	return target{id: id, ownerAPI: ownerAPI, url: url, local: local, fast: local && p.up != nil && upstream.Plain(url)}, true
}

// startHop prepares a hop to ownerAPI: its own cancellation, with a cause
// (the owner's loss, hop.Owners, ends it and its error says why), the
// dispatch watch when the entry's side of the protocol is on (a
// re-decision the owner announces moves mark where the request runs), and
// its place among the hops in flight. The caller ends all three.
func startHop(p *Proxy, ctx context.Context, out *http.Request, ownerAPI string, mark *hop.Mark) (*http.Request, *hop.Watch, *hop.Live, context.CancelCauseFunc) {
	hctx, end := context.WithCancelCause(ctx)
	var watch *hop.Watch
	if p.cfg.HopDispatchTimeout > 0 {
		out, watch = hop.StartWatch(hctx, out, p.cfg.HopDispatchTimeout, p.now(), func(to string) {
			// The owner decided again: count the request where it runs.
			if api, local, ok := p.cfg.View.Locate(to); ok && !local && api == ownerAPI {
				p.hops.Move(mark, to)
			}
		})
	} else {
		out = out.WithContext(hctx)
	}
	return out, watch, p.owners.Add(ownerAPI, watch, end), end
}

// sendFailed judges an attempt whose request failed (err, from either
// client): the client gone, an owner lost after it may have dispatched,
// a hop's verdict by its watch, then retry.go's rule.
func (st *reqState) sendFailed(t *target, watch *hop.Watch, live *hop.Live, err error) attemptResult {
	p, id := st.p, t.id
	if st.r.Context().Err() != nil {
		st.code = statusClientGone
		return attemptDone
	}
	if st.stall.wasStalled() {
		// Judged stalled, the replica was ejected and the request ended
		// before a byte of its answer: its engine generated nothing for
		// it (health.Checker.Stall), so another replica may take it.
		p.log.Warn("replica stalled before answering, trying another", "replica", id)
		return attemptNotReached
	}
	if t.local {
		p.reportFailure(id)
	}
	if live.Gone() && !neverReached(err) && (watch == nil || !watch.Unsent()) {
		p.log.Warn("owner router gone from the mesh and silent after it was sent the request; not retrying", "replica", id, "owner", t.ownerAPI)
		st.ownerGone = true
		p.m.ownerGone.WithLabelValues(hop.GoneError).Inc()
		return attemptFailed
	}
	if watch != nil {
		if res, ok := st.hopFailed(watch, id, t.ownerAPI, err); ok {
			return res
		}
	}
	if neverReached(err) {
		p.log.Warn("upstream unreachable, trying another", "replica", id, "url", t.url, "error", err)
		return attemptNotReached
	}
	p.log.Warn("upstream failed after the request was sent; not retrying", "replica", id, "url", t.url, "error", err)
	return attemptFailed
}

func (p *Proxy) reportFailure(id string) {
	if p.cfg.ReportFailure != nil {
		p.cfg.ReportFailure(id)
	}
}
