package proxy

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// Warm requests (Config.PDWarm; the forms are disagg.WarmBody's): once a
// split request's decode leg has answered in whole, the router sends the
// replica that prefilled it the prompt followed by the answer, so that
// the conversation's next turn, prefilled there by cache, finds the
// answer cached too, as a whole replica's next turn does. The work is
// the engine's either way (the next turn would compute the answer at
// its prefill); the warm does it during the user's think time, off the
// next turn's first token, and in vain for a conversation's last turn.
// It never delays a client's request: it goes only to a replica that can
// start it at once (route.Candidate.Idle), at most maxWarms at a time
// per router, and is never retried.

// maxWarms bounds the warm requests a router has in flight: each holds a
// goroutine, a body of the conversation's size and an upstream
// connection.
const maxWarms = 64

// maxWarmBytes bounds the bytes the warm requests in flight hold
// together (each its body and its prompt's text): at maxWarms of the
// largest body a client may send (DefaultMaxBodyBytes, plus an answer of
// up to 4 MB, each held twice) a router would hold over 2 GB for
// requests that only move later prefill off a next turn's first token.
// 64 MB still holds 64 warms of 500 KB conversations, or 3 of the
// largest.
const maxWarmBytes = 64 << 20

// warmTimeout bounds one warm request: a prefill replica that takes
// longer than this for one answer's tokens is too busy to be warmed.
const warmTimeout = time.Minute

// Outcomes of kvmesh_pd_warm_requests_total.
const (
	warmOK     = "ok"     // the replica computed it
	warmFailed = "failed" // it answered an error, or none in time
	warmBusy   = "busy"   // skipped: the replica could not start it at once
	warmFull   = "full"   // skipped: maxWarms in flight, or their bytes would pass maxWarmBytes
	warmNone   = "none"   // skipped: the body's next turn cannot be told (disagg.ErrNoWarm)
	warmGone   = "gone"   // skipped: the replica left or no longer prefills, or the router is stopping
)

// warmer sends a router's warm requests, each on a goroutine it owns;
// close cancels them and waits for them.
type warmer struct {
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{}
	sent   *prometheus.CounterVec // pdMetrics.warms
	// left is what remains of the byte budget (maxWarmBytes).
	left atomic.Int64
	// mu orders starts before close's Wait: a start after close
	// starts nothing.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func newWarmer(sent *prometheus.CounterVec, budget int64) *warmer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &warmer{ctx: ctx, cancel: cancel, slots: make(chan struct{}, maxWarms), sent: sent}
	w.left.Store(budget)
	return w
}

// take reserves a place and n bytes for a warm request; false when
// either is spent. give returns them.
func (w *warmer) take(n int64) bool {
	select {
	case w.slots <- struct{}{}:
	default:
		return false
	}
	if w.left.Add(-n) < 0 {
		w.give(n)
		return false
	}
	return true
}

func (w *warmer) give(n int64) {
	w.left.Add(n)
	<-w.slots
}

func (w *warmer) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}

// start runs f on a goroutine of w's, unless w is closed.
func (w *warmer) start(f func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.wg.Go(f)
	return true
}

// warm sends the warm request of sr, whose decode leg answered answer in
// whole, to the replica id that prefilled it ("": not known). It returns
// at once: what it needs of the client's request is copied before. Each
// call counts one outcome.
func (sr *splitRequest) warm(id string, answer string) {
	st, p := sr.st, sr.p
	w, proto := p.warms, p.cfg.PD.String()
	if id == "" {
		w.sent.WithLabelValues(proto, warmGone).Inc()
		return
	}
	body, err := disagg.WarmBody(p.cfg.PD, sr.orig, answer, rand.Uint64())
	if err != nil {
		w.sent.WithLabelValues(proto, warmNone).Inc()
		if !errors.Is(err, disagg.ErrNoWarm) {
			p.junk.Printf("no warm request for a split request: %v", err)
		}
		return
	}
	pr := st.prompt
	pr.Text, pr.Stream, pr.IncludeUsage = st.prompt.AppendAnswer(answer), false, false
	size := int64(len(body) + len(pr.Text))
	if !w.take(size) {
		w.sent.WithLabelValues(proto, warmFull).Inc()
		return
	}
	c := p.cfg.Contract
	hashes, _ := answerChain(c, st, answer) // the prompt's blocks are not hashed again
	req := route.Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: st.root, Model: st.req.Model,
		ClientKey: st.req.ClientKey, Whole: c.ShortKey(st.root, pr.Text)}
	r := st.r.Clone(context.WithValue(w.ctx, clientConnKey{}, nil))
	r.Body, r.ContentLength = http.NoBody, int64(len(body))
	if rid := r.Header.Get(HeaderRequestID); rid != "" {
		r.Header.Set(HeaderRequestID, rid+"-warm")
	}
	leg := &reqState{p: p, w: newLegWriter(nil), ep: st.ep, path: st.path, body: body, prompt: pr, root: st.root,
		hashes: hashes, req: req, hinted: 0, leg: hop.LegPinned}
	started := w.start(func() {
		defer w.give(size)
		ctx, cancel := context.WithTimeout(r.Context(), warmTimeout)
		defer cancel()
		leg.r = r.WithContext(ctx)
		w.sent.WithLabelValues(proto, sendWarm(p, leg, id)).Inc()
	})
	if !started { // the router is stopping
		w.give(size)
		w.sent.WithLabelValues(proto, warmGone).Inc()
	}
}

// sendWarm sends leg, a warm request, to the replica id when it can
// start it at once, and tells how it went.
func sendWarm(p *Proxy, leg *reqState, id string) string {
	var release func()
	found := false
	leg.snap = p.places.read(func() {
		if release != nil { // read again: a decision overlapped
			release()
		}
		found, leg.cands = false, nil
		var cands []route.Candidate
		cands, release = p.cfg.View.PooledCandidates(leg.prompt.Model)
		for i := range cands {
			if cands[i].ID() == id && fitsLeg(cands[i].Role, hop.LegPinned, strictLegs(p)) {
				leg.cands, found = cands[i:i+1], true
				break
			}
		}
		if found {
			p.load.fill(leg.cands)
			p.hops.Fill(leg.cands, p.cfg.View)
			p.places.fillWritten(leg.cands)
		}
	})
	defer release()
	if !found {
		return warmGone
	}
	c := &leg.cands[0]
	if c.Stale || !c.CanStart() {
		return warmBusy
	}
	if c.Summary != nil {
		leg.hintMatch = c.Summary.Match(leg.req.Probes)
	}
	lw := leg.w.(*legWriter)
	p.runLeg(leg)
	if lw.ok() && !leg.cut {
		return warmOK
	}
	if p.log.IsDebug() {
		p.log.Debug("warm request failed", "replica", id, "status", lw.status, "answer", string(bytes.TrimSpace(lw.body[:min(len(lw.body), 200)])))
	}
	return warmFailed
}

// keepsAnswer reports whether st, a decode leg, keeps its answer for a
// warm request.
func keepsAnswer(st *reqState) bool { return st.p.warms != nil && st.leg == hop.LegDecode }
