package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/reply"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// errNotFlushed: relay did not flush the head (the stream loop needs it
// on the wire before it writes the body's chunks).
var errNotFlushed = errors.New("head not flushed")

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// upstreamAnswer is the attempt whose response a relay streams: the
// replica, the decision, whether this router owns the replica, when the
// attempt began, the cancellation of a net/http request (nil for the own
// client's) and what the first byte ends (the pending prefill).
type upstreamAnswer struct {
	id        string
	d         route.Decision
	local     bool
	start     time.Time
	cancel    func()
	firstByte func()
	obs       upstreamObservers
	idle      *upstream.IdleWatch // nil: no upstream idle timeout
	fr        upstream.Framing
	tap       streamTap
}

// clientOut is how a relay writes to its client: the response controller,
// the write deadline, whether each write is flushed (a stream, or a body
// of unknown length), and the head's flush (nil once it is on the wire).
// It is a value of relay's frame apart from upstreamAnswer, whose fields
// reach the heap (escape analysis takes a struct whole): the controller
// here stays on the stack.
type clientOut struct {
	rc      *http.ResponseController
	wd      writeDeadline
	flush   bool
	headErr error
}

// relay streams the upstream response to the client as it arrives. For
// an owned replica's successful response it records the prompt at the
// first byte of the body, learns the answer on the way and records
// prompt + answer once the response is complete, or once its client left
// (the answer as far as the replica sent it).
//
// An upstream silent mid-body is cut off (upstream.IdleWatch): a blocked read of the
// own client's connection fails on a past deadline, net/http's on the
// request's cancellation.
func (st *reqState) relay(resp *http.Response, a upstreamAnswer) {
	p := st.p
	a.obs = p.m.target(a.local)
	if b, ok := resp.Body.(*upstream.Body); ok {
		a.idle = p.watchIdle(b.Conn(), nil, !a.local)
	} else if a.cancel != nil {
		a.idle = p.watchIdle(nil, a.cancel, !a.local)
	}
	st.stall.headers(a.idle)
	if a.idle != nil {
		defer func() {
			if a.idle.Stop() {
				if b, ok := resp.Body.(*upstream.Body); ok {
					b.NoReuse() // its read deadline is past
				}
			}
		}()
	}
	if a.local && resp.StatusCode >= 200 && resp.StatusCode < 300 && !st.byLoad {
		// The replica accepted the request and holds the prompt once it
		// has computed it: at the first byte of the body (its first
		// token), not at the headers, which vLLM sends before the
		// prefill. A prompt recorded at the headers drew the requests
		// sharing its first blocks to a replica still queueing its
		// prefill (first turns stacked on one vLLM server). A refused or
		// failed request records nothing, and embeddings leave no cache.
		var endFlight func() // set at the first byte; nil if none came
		defer func() {
			if endFlight != nil {
				endFlight()
			}
		}()
		id, hashes, first, start, headed := a.id, st.hashes, a.firstByte, a.start, time.Now()
		a.firstByte = func() {
			// In flight for the prediction from its first byte on
			// (inflight.go).
			endFlight = beginFlight(st, id, sharesInFlight(p.cfg.SharesQueuedPrefill, id, start, headed, time.Now()))
			p.cfg.View.Record(id, hashes)
			first()
		}
	}
	sse := writeHead(st.w, resp)
	out := clientOut{rc: http.NewResponseController(st.w), flush: sse || resp.ContentLength < 0, headErr: errNotFlushed}
	out.wd = p.writeDeadline(out.rc)
	if out.flush {
		out.wd.extend()
		out.headErr = out.rc.Flush() // the client sees the headers before the first token
	}
	var sink *reply.Sink
	// An owned replica's answer is learnt; a hop's, and a decode leg's
	// (pd.go: placed by load, its cache steers nothing), are read for
	// the tenant's token usage only (tenants.go).
	learnt := a.local && !st.byLoad
	if resp.StatusCode == http.StatusOK && (learnt || keepsAnswer(st) || st.quota.Held() && (!st.byLoad || st.leg == hop.LegDecode)) {
		sink = reply.NewSink(sse, p.answers)
		defer sink.Release()
		defer func() { st.spent = spentOf(sink) }() // before the release
	}
	a.tap = streamTap{sink: sink, firstByte: a.firstByte, ttft: a.obs.ttft, start: a.start, idle: a.idle}
	a.fr = upstream.NewFraming(sse && len(st.w.Header()["Content-Length"]) == 0)
	ended, held, ok := st.relayByLoop(resp, &a, &out, sse)
	if ok && !ended {
		ok = st.relayByCopy(resp, &a, &out, held)
	}
	if !ok && !st.answeredBeforeGone(resp, &a.tap) {
		if st.code == statusClientGone && sink != nil {
			// The client left mid-answer: what the sink saw is what the
			// replica computed (it holds that prompt and that much of
			// the answer), so it is learnt though the request is a 499.
			sink.Finish()
			if learnt {
				st.learn(a.id, a.d, sink, a.start)
			}
		}
		return
	}
	if !a.tap.got {
		a.firstByte()
		a.obs.ttft.Observe(time.Since(a.start).Seconds())
	}
	a.obs.duration.Observe(time.Since(a.start).Seconds())
	if sink != nil {
		sink.Finish()
		if learnt {
			st.learn(a.id, a.d, sink, a.start)
		}
		if keepsAnswer(st) && (!sse || sink.Done()) {
			st.answer = string(sink.Answer())
		}
	}
}

// answeredBeforeGone reports whether a response whose client went away
// had passed its SSE stream's [DONE] first, and then counts it as
// answered. OpenAI's SDKs and most clients stop reading at [DONE] and
// close the connection, while an engine (llama.cpp's server) may end
// the HTTP body a moment later: the client has its whole answer and the
// engine holds the prompt and the answer, so the request is not a 499
// and what the engine reported is learnt. A hop's entry router sees the
// same through the owner's relay (the tap's tail).
func (st *reqState) answeredBeforeGone(resp *http.Response, tap *streamTap) bool {
	if st.code != statusClientGone || !tap.sawDone() {
		return false
	}
	st.code = resp.StatusCode
	return true
}

// writeHead writes the response's head to the client w (hop-by-hop
// headers dropped). It reports whether the response is an SSE stream.
func writeHead(w http.ResponseWriter, resp *http.Response) bool {
	h := w.Header()
	for k, vv := range resp.Header {
		if !upstream.HopByHop(k) {
			h[k] = vv
		}
	}
	removeConnectionHeaders(h, resp.Header)
	w.WriteHeader(resp.StatusCode)
	return isEventStream(resp.Header.Get("Content-Type"))
}

// relayByLoop hands the body to the stream loop when it can take it. It
// reports whether the body was relayed to its end, the partial event the
// loop held back for the normal path, and whether the relay goes on (not
// when the response ended otherwise: the client gone, the upstream
// failed).
func (st *reqState) relayByLoop(resp *http.Response, a *upstreamAnswer, out *clientOut, sse bool) (ended bool, held []byte, ok bool) {
	p, r := st.p, st.r
	body, cc := st.loopEligible(resp, sse)
	if body == nil || out.headErr != nil {
		return false, nil, true
	}
	// The loop calls the tap on its goroutine: a copy on the heap, so
	// that the normal path's stays on the stack.
	lt := new(streamTap)
	*lt = a.tap
	res, pending, rest, err := p.loops.Relay(r, body, cc, lt.loopData, a.idle.FiredC(), &a.fr)
	a.tap = *lt
	switch res {
	case upstream.LoopEOF:
		return true, nil, true
	case upstream.LoopClientGone:
		p.log.Debug("client went away mid-response", "replica", a.id, "error", err)
		st.code = statusClientGone
		return false, nil, false
	case upstream.LoopFailed:
		st.relayFailed(a, out, err)
		return false, nil, false
	case upstream.LoopPanicked:
		// Part of the stream may be lost with the panic: only a broken
		// connection tells the client the response is not whole. Not the
		// replica's failure.
		st.code = http.StatusInternalServerError
		panic(http.ErrAbortHandler)
	case upstream.LoopHandback:
		a.idle.Busy() // until the normal path reads again
		if len(pending) > 0 {
			// The rest of a chunk, behind which the client's socket was
			// full: written as the handler's goroutine writes.
			out.wd.extend()
			if _, werr := cc.Write(pending); werr != nil {
				st.clientGone(a.id, werr)
				return false, nil, false
			}
		}
		return false, rest, true
	}
	return false, nil, true
}

// relayByCopy relays the body by the handler's goroutine: read, cut at
// the last event end, write, flush. held is a partial event the loop held
// back. It reports whether the body ended (not when the client went away
// or the upstream failed).
func (st *reqState) relayByCopy(resp *http.Response, a *upstreamAnswer, out *clientOut, held []byte) bool {
	w := st.w
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	// buf[:n] holds what was read and not yet written: a partial SSE
	// event, held back until its end comes (upstream.Framing).
	n := copy(buf, held)
	for {
		// The silence counted is the time spent waiting in Read: a write
		// to a slow client in between is not the upstream's.
		a.idle.Saw()
		m, rerr := resp.Body.Read(buf[n:])
		a.idle.Busy()
		if m > 0 {
			a.tap.data(buf[n : n+m])
		}
		k := n + m
		if rerr != io.EOF {
			k = a.fr.Cut(buf[:n+m], n, n+m == len(buf))
		}
		if k > 0 {
			out.wd.extend()
			if _, werr := w.Write(buf[:k]); werr != nil {
				st.clientGone(a.id, werr)
				return false
			}
			if out.flush {
				if err := out.rc.Flush(); err != nil {
					st.clientGone(a.id, err)
					return false
				}
			}
		}
		n = copy(buf, buf[k:n+m])
		if rerr == io.EOF {
			return true
		}
		if rerr != nil {
			st.relayFailed(a, out, rerr)
			return false
		}
	}
}

// relayFailed handles a failed read of the upstream mid-response: the
// client gets the endpoint's error event when the stream is at an event
// end, else a broken connection.
func (st *reqState) relayFailed(a *upstreamAnswer, out *clientOut, rerr error) {
	p := st.p
	if st.r.Context().Err() != nil {
		st.code = statusClientGone
		return
	}
	cause := midstreamError
	if st.ownerHop.Gone() {
		cause = midstreamOwnerGone
		p.log.Warn("owner router gone from the mesh and silent mid-response: ended", "replica", a.id, "owner", st.ownerHop.Owner())
	} else if st.stall.wasStalled() {
		cause = midstreamStalled
	} else if a.idle.Fired() {
		cause = midstreamIdle
		p.junk.Printf("upstream %s sent nothing of its response for %v: ended", a.id, a.idle.Timeout())
	} else {
		p.log.Warn("upstream failed mid-response", "replica", a.id, "error", rerr)
	}
	if a.local {
		p.reportFailure(a.id)
	}
	a.obs.duration.Observe(time.Since(a.start).Seconds())
	st.cut = true
	if a.fr.CanEnd() && endStream(st.w, out.rc, &out.wd, st, cause, a.idle) {
		p.m.midstream.WithLabelValues(cause, endErrorEvent).Inc()
		return
	}
	p.m.midstream.WithLabelValues(cause, endAborted).Inc()
	// The only honest signal once bytes are sent; net/http recovers it
	// and closes the connection.
	panic(http.ErrAbortHandler)
}

// endStream ends a failed SSE stream for its client (midstream.go): the
// endpoint's error event, flushed; relay then returns and net/http ends
// the body. It reports whether the event was written (a client that is
// gone leaves st.code 499 and nothing to end).
func endStream(w http.ResponseWriter, rc *http.ResponseController, wd *writeDeadline, st *reqState, cause string, idle *upstream.IdleWatch) bool {
	code, msg := codeUpstreamError, "the upstream failed in the middle of the response; it is incomplete"
	switch cause {
	case midstreamIdle:
		code, msg = codeUpstreamTimeout, fmt.Sprintf("the upstream sent nothing for %v in the middle of the response; it is incomplete", idle.Timeout())
	case midstreamStalled:
		code, msg = codeUpstreamTimeout, "the replica stopped progressing in the middle of the response and was ejected; it is incomplete"
	case midstreamOwnerGone:
		code, msg = hop.CodeOwnerGone, "the router owning the replica left the mesh and does not answer, in the middle of the response; it is incomplete"
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
	idle      *upstream.IdleWatch // nil: no upstream idle timeout
	// tail is the stream's last bytes when no sink reads it (a hop to
	// another router's replica), so that a stream's [DONE] is seen there
	// too (sawDone).
	tail  [24]byte
	tailN int
}

// loopData is data on the stream loop, whose reads of the replica never
// wait for the client: each piece of body is when the replica last spoke.
func (t *streamTap) loopData(b []byte) {
	t.idle.Saw()
	t.data(b)
}

func (t *streamTap) data(b []byte) {
	if !t.got {
		t.got = true
		t.idle.Heard()
		t.firstByte()
		t.ttft.Observe(time.Since(t.start).Seconds())
	}
	if t.sink != nil {
		t.sink.Feed(b)
	} else {
		t.keepTail(b)
	}
}

// keepTail keeps the last len(t.tail) bytes of the stream.
func (t *streamTap) keepTail(b []byte) {
	if len(b) >= len(t.tail) {
		t.tailN = copy(t.tail[:], b[len(b)-len(t.tail):])
		return
	}
	keep := min(t.tailN, len(t.tail)-len(b))
	copy(t.tail[:keep], t.tail[t.tailN-keep:t.tailN])
	t.tailN = keep + copy(t.tail[keep:], b)
}

// sawDone reports whether the stream's last event was data: [DONE], as
// Sink.Done does for a stream a sink reads.
func (t *streamTap) sawDone() bool {
	if t.sink != nil {
		return t.sink.Done()
	}
	return bytes.HasSuffix(bytes.TrimRight(t.tail[:t.tailN], "\r\n"), []byte("data: [DONE]"))
}

// learn records what the replica holds after a complete response (prompt
// + answer) and checks the summary's prediction against the engine's
// report. The engine's cached tokens are the ground truth: the blocks the
// summary claimed beyond them are forgotten (the replica evicted them),
// and the prompt is recorded again after that, since the engine has just
// computed it.
func (st *reqState) learn(id string, d route.Decision, sink *reply.Sink, sent time.Time) {
	p := st.p
	forgot := false
	if u := sink.Usage(); u.Present {
		// Tokens and blocks meet at this prompt's own bytes per token
		// when the engine reported its tokens, else at the replica's
		// learned ratio (tokens.go).
		bpt := p.ratios.Of(id)
		if u.PromptTokens > 0 {
			p.m.promptTokens.Add(float64(u.PromptTokens))
			if n := len(st.prompt.Text); n > 0 {
				p.ratios.Observe(id, n, u.PromptTokens)
				bpt = clampBytesPerToken(float64(n) / float64(u.PromptTokens))
			}
		}
		if u.HasCached {
			c := u.CachedTokens
			if c > 0 {
				p.m.reportedCached.Add(float64(c))
			}
			bb, n := p.cfg.Contract.BlockBytes, len(st.prompt.Text)
			// The engine computed the blocks of the requests sent
			// before this one too (inflight.go).
			match := max(d.Match, st.flightMatch)
			predicted := p.ratios.Predict(id, match, n, bb, bpt)
			p.ratios.ObserveCached(id, match, n, bb, bpt, c)
			p.m.predictedCached.Add(predicted)
			// The error in blocks of canonical text, at this prompt's
			// ratio.
			miss := (predicted - float64(max(c, 0))) * bpt / float64(bb)
			p.m.predictionError.Observe(miss)
			p.m.predictionMiss.Observe(math.Abs(miss))
			forgot = st.correct(id, d.Match, c, bpt)
			if p.log.IsDebug() {
				p.log.Debug("cached tokens", "replica", id, "match", d.Match, "flight_match", st.flightMatch, "blocks", len(st.hashes),
					"prompt_bytes", len(st.prompt.Text), "prompt_tokens", u.PromptTokens, "cached", c,
					"predicted", math.Round(predicted), "error_blocks", math.Round(miss*1000)/1000,
					"bytes_per_token", math.Round(bpt*1000)/1000, "hop", st.hop, "forgot", forgot)
			}
		}
	}
	if st.leg == hop.LegPrefill || st.leg == hop.LegPinned {
		// A prefill leg's replica holds the prompt, not the answer,
		// which its decode leg generates elsewhere (pd.go).
		if forgot {
			p.cfg.View.Record(id, st.hashes)
		}
		answered(&p.cfg, id, st, sink, st.hashes, len(st.prompt.Text), sent)
		return
	}
	if len(sink.Answer()) == 0 && !forgot {
		answered(&p.cfg, id, st, sink, st.hashes, len(st.prompt.Text), sent)
		return
	}
	all, tail := answerChain(p.cfg.Contract, st, string(sink.Answer()))
	n := len(st.hashes)
	if len(all) > n || forgot {
		p.cfg.View.Record(id, all)
	}
	answered(&p.cfg, id, st, sink, all, n*p.cfg.Contract.BlockBytes+len(tail), sent)
}

// answerChain is the block chain of st's prompt followed by answer, as
// the next turn renders it, in a new slice, and the text past the
// prompt's full blocks. The text starts with the prompt, so the chain
// continues from the prompt's last full block: only the prompt's
// partial last block and the answer are rendered and hashed again.
func answerChain(c summary.Contract, st *reqState, answer string) (hashes []uint64, tail []byte) {
	n := len(st.hashes)
	from := st.root
	if n > 0 {
		from = st.hashes[n-1]
	}
	rest := st.prompt
	rest.Text = st.prompt.Text[n*c.BlockBytes:]
	tail = rest.AppendAnswer(answer)
	return c.AppendHashes(st.hashes[:n:n], from, tail), tail
}

// answered tells cfg.Answers of an answer of st that reported usage.
func answered(cfg *Config, id string, st *reqState, sink *reply.Sink, hashes []uint64, textBytes int, sent time.Time) {
	if u := sink.Usage(); cfg.Answers != nil && u.PromptTokens > 0 {
		cfg.Answers(id, Answered{Hashes: hashes, PromptBytes: len(st.prompt.Text), TextBytes: textBytes,
			BlockBytes: cfg.Contract.BlockBytes, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
			CachedTokens: u.CachedTokens, Sent: sent})
	}
}

// Answered is what an owned replica's complete answer taught: the text
// blocks it holds now (prompt, then answer as the next turn renders it),
// their bytes, the engine's usage and when the request was sent. The
// router's KV-event trackers relate it to the engine's blocks.
type Answered struct {
	Hashes                                       []uint64
	PromptBytes, TextBytes, BlockBytes           int
	PromptTokens, CompletionTokens, CachedTokens int64
	Sent                                         time.Time
}

// observeSlot folds a finished attempt's slot time at replica id into
// its mean: only complete successful generations count (a refused,
// failed or abandoned request says nothing of how long one runs).
//
// A request this router decided also becomes the record of its heat key
// (route.Stem): the next request under the key forks from its stem or
// extends it. Forwarded requests are not recorded, as they are not
// counted in countHeat (the simulator records on the deciding router as
// the request ends, too).
func (st *reqState) observeSlot(id string, d route.Decision, first time.Time) {
	p := st.p
	if st.byLoad || st.code < 200 || st.code >= 300 {
		return
	}
	p.load.observe(id, slotMs(first, p.now(), len(st.hashes)-d.Match, st.blockMs))
	if !st.hop {
		req := route.Request{Hashes: st.hashes, Root: st.root, Whole: st.req.Whole}
		key := p.cfg.Policy.HeatKey(req)
		p.load.setStem(key, route.StemOf(req, d.BestMatch))
	}
}

// forgetSlackBlocks is how many blocks past the reported cached tokens
// (when at least a block is reported) are still taken as held: the engine counts
// chat-template tokens the canonical text does not have and rounds down to
// its own block size, so a correct prediction may exceed the report by a
// fraction of a block.
const forgetSlackBlocks = 1

// correct compares the predicted match (blocks) with the engine's
// reported cached tokens, read as bytes of canonical text at bpt bytes
// per token, and forgets the blocks the summary claimed beyond the
// report. It reports whether it forgot any.
func (st *reqState) correct(id string, match int, cached int64, bpt float64) bool {
	p := st.p
	bb := float64(p.cfg.Contract.BlockBytes)
	reported := float64(max(cached, 0)) * bpt / bb
	// Less than a block reported is a full miss: an engine that holds
	// nothing of the prompt may still count a token or two cached (the
	// start token llama.cpp keeps), which no block of the prefix is.
	keep := 0
	if reported >= 1 {
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
