package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// statusClientGone labels requests whose client went away before the
// response was complete (nginx's convention).
const statusClientGone = 499

// reqState is one inference request on its way through the router.
type reqState struct {
	code   int // the status the client got, for the metric
	path   string
	body   []byte
	prompt summary.Prompt
	root   uint64
	hashes []uint64
	hop    bool
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// inference serves POST /v1/chat/completions and /v1/completions.
func (p *Proxy) inference(w http.ResponseWriter, r *http.Request, ep string, chat bool) {
	st := &reqState{path: r.URL.Path}
	// A deferred count still runs when a dead upstream aborts the handler.
	defer func() { p.m.requests.WithLabelValues(ep, strconv.Itoa(st.code)).Inc() }()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		st.code = writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	body, status, err := p.readBody(w, r)
	if err != nil {
		st.code = writeError(w, status, err.Error())
		return
	}
	st.body = body
	if chat {
		st.prompt, err = summary.RenderChat(body)
	} else {
		st.prompt, err = summary.RenderCompletion(body)
	}
	if err != nil {
		st.code = writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	c := p.cfg.Contract
	st.root = c.Root(st.prompt.Model, st.prompt.CacheSalt)
	st.hashes = c.AppendHashes(nil, st.root, st.prompt.Text)
	req := route.Request{Hashes: st.hashes, Probes: summary.MakeProbes(nil, st.hashes), Root: st.root}

	cands := p.cfg.View.Candidates(st.prompt.Model, nil)
	st.hop = r.Header.Get(HeaderHop) != ""
	hinted, hintMatch := -1, 0
	if st.hop && len(cands) > 0 {
		cands, hinted = p.ownCandidates(cands, r.Header.Get(HeaderReplica))
		if m, err := strconv.Atoi(r.Header.Get(HeaderMatch)); err == nil {
			hintMatch = min(max(m, 0), len(st.hashes))
		}
	}
	if len(cands) == 0 {
		if !st.hop && !p.modelKnown(st.prompt.Model) {
			st.code = writeError(w, http.StatusNotFound, fmt.Sprintf("The model '%s' does not exist.", st.prompt.Model))
			return
		}
		w.Header().Set("Retry-After", "1")
		st.code = writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("no healthy replica serves the model '%s'", st.prompt.Model))
		return
	}

	counted := false
	for attempt := 1; ; attempt++ {
		var d route.Decision
		if hinted >= 0 {
			// The deciding router counted this decision; the owner serves it.
			d = route.Decision{Index: hinted, Match: hintMatch}
			hinted = -1
		} else {
			d = p.cfg.Policy.Pick(req, cands)
			if !counted {
				reason := d.Reason
				if st.hop {
					reason = ReasonRehint
				}
				p.m.decisions.WithLabelValues(string(reason)).Inc()
				counted = true
			}
		}
		last := attempt >= p.cfg.MaxAttempts || len(cands) == 1
		if p.attempt(w, r, st, cands[d.Index].ID, d, last) {
			return
		}
		if last {
			st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("all %d upstream attempts for the model '%s' failed", attempt, st.prompt.Model))
			return
		}
		cands = slices.Delete(cands, d.Index, d.Index+1)
		p.m.retries.Inc()
	}
}

// readBody reads the request body once, under the size limit.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	limit := p.cfg.MaxBodyBytes
	tooLarge := fmt.Errorf("request body exceeds %d bytes", limit)
	if r.ContentLength > limit {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge, tooLarge
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading request body: %v", err)
	}
	return buf.Bytes(), 0, nil
}

// ownCandidates keeps the candidates this router owns (a forwarded request
// never travels further) and finds the hinted replica among them. The
// deciding router already applied route's load bounds with a view at most
// a gossip interval old, so the owner keeps the hint unless the replica is
// gone or full: over twice the in-flight bound the decider applied.
// Re-deciding on a soft bound here would undo the decider's prefix match
// for the noise between two load snapshots.
func (p *Proxy) ownCandidates(cands []route.Candidate, hint string) ([]route.Candidate, int) {
	full := 2 * p.cfg.Policy.InFlightBound(cands)
	own, hinted := cands[:0], -1
	for _, c := range cands {
		if _, local, ok := p.cfg.View.Locate(c.ID); !ok || !local {
			continue
		}
		if c.ID == hint && c.InFlight+1 <= full {
			hinted = len(own)
		}
		own = append(own, c)
	}
	return own, hinted
}

// attempt sends the request to one candidate. It reports whether the
// request is finished (answered, relayed or abandoned by its client);
// false means nothing reached the client and another candidate may be
// tried.
func (p *Proxy) attempt(w http.ResponseWriter, r *http.Request, st *reqState, id string, d route.Decision, last bool) bool {
	ownerAPI, local, ok := p.cfg.View.Locate(id)
	if !ok || (st.hop && !local) {
		p.log.Warn("candidate vanished before dispatch", "replica", id)
		return false
	}
	base := ownerAPI
	if local {
		base = id
	}
	url := strings.TrimRight(base, "/") + st.path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(st.body))
	if err != nil {
		p.log.Warn("bad upstream URL", "replica", id, "url", url, "error", err)
		return false
	}
	copyRequestHeader(out.Header, r.Header)
	body := st.body
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	firstByte, done := func() {}, func() {}
	if local {
		firstByte, done = p.cfg.View.Begin(id, float64(len(st.hashes)-d.Match))
		defer done()
	} else {
		out.Header.Set(HeaderReplica, id)
		out.Header.Set(HeaderHop, "1")
		out.Header.Set(HeaderMatch, strconv.Itoa(d.Match))
	}
	g := p.m.inflight.WithLabelValues(id)
	g.Inc()
	defer g.Dec()

	start := time.Now()
	resp, err := p.client.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			st.code = statusClientGone
			return true
		}
		p.log.Warn("upstream request failed", "replica", id, "url", url, "error", err)
		if local {
			p.reportFailure(id)
		}
		return false
	}
	defer resp.Body.Close()
	if (resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests) && !last {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		p.log.Warn("upstream refused the request, trying another", "replica", id, "status", resp.StatusCode)
		if local && resp.StatusCode >= 500 {
			p.reportFailure(id)
		}
		return false
	}
	st.code = resp.StatusCode
	p.relay(w, r, resp, st, id, d, local, start, firstByte)
	return true
}

// relay streams the upstream response to the client as it arrives. For
// an owned replica's successful response it learns the answer on the way
// and records prompt + answer once the response is complete.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, st *reqState, id string, d route.Decision, local bool, start time.Time, firstByte func()) {
	target := targetPeer
	if local {
		target = targetLocal
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
	if flush {
		_ = rc.Flush() // the client sees the headers before the first token
	}
	var sink *answerSink
	if local && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// The replica accepted the request: it holds (or is computing) the
		// prompt now. A refused or failed request records nothing.
		p.cfg.View.Record(id, st.hashes)
		if resp.StatusCode == http.StatusOK {
			sink = newAnswerSink(sse)
			defer sink.release()
		}
	}
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	got := false
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if !got {
				got = true
				firstByte()
				p.m.ttft.WithLabelValues(target).Observe(time.Since(start).Seconds())
			}
			if sink != nil {
				sink.feed(buf[:n])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				p.log.Debug("client went away mid-response", "replica", id, "error", werr)
				st.code = statusClientGone
				return
			}
			if flush {
				if err := rc.Flush(); err != nil {
					st.code = statusClientGone
					return
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if r.Context().Err() != nil {
				st.code = statusClientGone
				return
			}
			p.log.Warn("upstream failed mid-response, aborting the client connection", "replica", id, "error", rerr)
			if local {
				p.reportFailure(id)
			}
			p.m.duration.WithLabelValues(target).Observe(time.Since(start).Seconds())
			// The only honest signal once bytes are sent; net/http
			// recovers it and closes the connection.
			panic(http.ErrAbortHandler)
		}
	}
	if !got {
		firstByte()
		p.m.ttft.WithLabelValues(target).Observe(time.Since(start).Seconds())
	}
	p.m.duration.WithLabelValues(target).Observe(time.Since(start).Seconds())
	if sink != nil {
		sink.finish()
		p.learn(st, id, d, sink)
	}
}

// learn records what the replica holds after a complete response (prompt
// + answer) and checks the summary's prediction against the engine's
// report. The engine's cached tokens are the ground truth: the blocks the
// summary claimed beyond them are forgotten (the replica evicted them),
// and the prompt is recorded again after that, since the engine has just
// computed it.
func (p *Proxy) learn(st *reqState, id string, d route.Decision, sink *answerSink) {
	forgot := false
	if u := sink.usage; u.present {
		if u.promptTokens > 0 {
			p.m.promptTokens.Add(float64(u.promptTokens))
		}
		if u.hasCached {
			c := u.cachedTokens
			if c > 0 {
				p.m.reportedCached.Add(float64(c))
			}
			p.m.predictedCached.Add(float64(d.Match * p.cfg.Contract.BlockBytes / bytesPerToken))
			forgot = p.correct(st, id, d.Match, c, u.promptTokens)
		}
	}
	if len(sink.answer) == 0 && !forgot {
		return
	}
	text := st.prompt.AppendAnswer(string(sink.answer))
	// The text starts with the prompt, so the chain continues from the
	// prompt's last full block.
	n, bb := len(st.hashes), p.cfg.Contract.BlockBytes
	from := st.root
	if n > 0 {
		from = st.hashes[n-1]
	}
	all := p.cfg.Contract.AppendHashes(st.hashes[:n:n], from, text[n*bb:])
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

// copyRequestHeader copies the client's headers to an upstream request,
// minus hop-by-hop ones, kvmesh's own hints (only this router sets them)
// and Accept-Encoding (the router reads the answer and streams identity).
func copyRequestHeader(dst, src http.Header) {
	for k, vv := range src {
		if hopByHop(k) || k == "Accept-Encoding" || k == "Content-Length" || k == "Host" || strings.HasPrefix(k, "X-Kvmesh-") {
			continue
		}
		dst[k] = vv
	}
	removeConnectionHeaders(dst, src)
}
