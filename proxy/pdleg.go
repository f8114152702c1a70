package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
)

// legWriter is the ResponseWriter of a leg the router answers itself (a
// prefill leg): it keeps the status, the head and the first
// disagg.MaxPrefillAnswer bytes of the body, discards the rest (a
// prefill's answer is one token), and tells head, when set, of the
// status as soon as it is written.
type legWriter struct {
	h      http.Header
	status int
	body   []byte
	over   bool
	head   func(status int)
}

func newLegWriter(head func(int)) *legWriter { return &legWriter{h: http.Header{}, head: head} }

// Header implements http.ResponseWriter.
func (w *legWriter) Header() http.Header { return w.h }

// WriteHeader implements http.ResponseWriter; informational heads (a
// hop's dispatch 103) are not the status.
func (w *legWriter) WriteHeader(code int) {
	if w.status != 0 || code < 200 {
		return
	}
	w.status = code
	if w.head != nil {
		w.head(code)
	}
}

// Write implements http.ResponseWriter.
func (w *legWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if room := disagg.MaxPrefillAnswer - len(w.body); room > 0 {
		w.body = append(w.body, b[:min(len(b), room)]...)
	}
	w.over = w.over || len(w.body) == disagg.MaxPrefillAnswer
	return len(b), nil
}

// Flush implements http.Flusher (nothing is buffered).
func (w *legWriter) Flush() {}

// ok reports whether the leg answered 2xx in whole.
func (w *legWriter) ok() bool { return w.status >= 200 && w.status < 300 && !w.over }

// answer tells the client (w) that the prefill leg failed: a client
// error of the replica's (a prompt over the context, a bad parameter)
// as the replica said it, since the decode replica would say the same;
// anything else as 502.
func (lw *legWriter) answer(w http.ResponseWriter, model string) int {
	if s := lw.status; s >= 400 && s < 500 && s != http.StatusRequestTimeout && s != http.StatusTooManyRequests && len(lw.body) > 0 && !lw.over {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(lw.body)))
		w.WriteHeader(s)
		_, _ = w.Write(lw.body)
		return s
	}
	what := "failed"
	if lw.status != 0 {
		what = fmt.Sprintf("answered %d", lw.status)
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := string(bytes.TrimSpace(lw.body[:min(len(lw.body), 200)]))
		if json.Unmarshal(lw.body, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message // an OpenAI error's, ours or the replica's
		}
		if msg != "" {
			what += ": " + msg
		}
	}
	return writeError(w, http.StatusBadGateway, fmt.Sprintf("the prefill leg for the model '%s' %s; nothing was generated", model, what))
}

// errPrefillFailed cancels a decode leg whose prefill leg failed before
// the decode's answer reached the client.
var errPrefillFailed = errors.New("the prefill leg failed")

// pair couples the two legs of one SGLang round, which run at once: the
// decode leg's answer reaches the client only once the prefill leg has
// answered 2xx (gate); a prefill leg that fails before then abandons the
// decode leg (cancelled, or stopped at its gate) and the round.
type pair struct {
	mu       sync.Mutex
	decided  chan struct{} // closed when the prefill leg answered or failed
	ok       bool          // it answered 2xx
	state    pairState
	cancel   context.CancelCauseFunc // the decode leg's
	wait     time.Duration           // the gate's bound (0: none)
	closeOne sync.Once
}

type pairState int

const (
	pairPending   pairState = iota
	pairRelaying            // the decode leg's answer goes to the client
	pairAbandoned           // the prefill leg failed first
)

// prefillHead is the prefill leg's legWriter head: its status.
func (pr *pair) prefillHead(status int) {
	if status >= 200 && status < 300 {
		pr.mu.Lock()
		pr.ok = true
		pr.mu.Unlock()
		pr.closeOne.Do(func() { close(pr.decided) })
		return
	}
	pr.prefillFailed()
}

// prefillFailed: the prefill leg ended without a 2xx head. A decode leg
// not yet relaying is abandoned.
func (pr *pair) prefillFailed() {
	pr.mu.Lock()
	if !pr.ok && pr.state == pairPending {
		pr.state = pairAbandoned
		pr.cancel(errPrefillFailed)
	}
	pr.mu.Unlock()
	pr.closeOne.Do(func() { close(pr.decided) })
}

// gate is the decode leg's: it waits for the prefill leg's head (at most
// wait: the decode's answer held that long is an upstream gone silent)
// and reports whether the decode's answer may go to the client.
func (pr *pair) gate(ctx context.Context) bool {
	var timeout <-chan time.Time
	if pr.wait > 0 {
		t := time.NewTimer(pr.wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-pr.decided:
	case <-ctx.Done():
	case <-timeout:
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.state == pairPending && pr.ok && ctx.Err() == nil {
		pr.state = pairRelaying
	} else if pr.state == pairPending {
		pr.state = pairAbandoned
	}
	return pr.state == pairRelaying
}

// abandoned reports whether the round was abandoned for its prefill leg.
func (pr *pair) abandoned() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.state == pairAbandoned
}

// sglang serves sr by SGLang's protocol: per round, a prefill replica by
// cache and a random bootstrap room, both legs at once; a prefill leg
// that fails before the decode leg's answer reached the client abandons
// the round, and the next pairs another prefill replica with a new room.
func (sr *splitRequest) sglang() string {
	st, p := sr.st, sr.p
	if _, err := disagg.SGLangBody(sr.orig, disagg.Bootstrap{}); errors.Is(err, disagg.ErrBatch) {
		return sr.whole()
	} else if err != nil {
		st.code = writeError(st.w, http.StatusBadRequest, err.Error())
		return pdRefused
	}
	pre, dec := legCands(st.cands, hop.LegPrefill, true), fitRole(st.cands, hop.LegDecode, false, true)
	if !sr.legsOrRefuse(pre, dec) {
		return pdRefused
	}
	client := st.r
	began := p.now()
	for round := 1; ; round++ {
		d := p.guardedPick(p.cfg.Policy.Pick, st.req, pre)
		p.m.countDecision(d.Reason)
		chosen := pre[d.Index]
		host, err := disagg.HostOf(chosen.ID())
		if err != nil {
			st.code = writeError(st.w, http.StatusBadGateway, err.Error())
			return pdRefused
		}
		var port uint16
		if chosen.Detail != nil {
			port = chosen.Detail.Bootstrap
		}
		body, _ := disagg.SGLangBody(sr.orig, disagg.Bootstrap{Host: host, Port: port, Room: rand.Uint64()})
		outcome, retry := sr.sglangRound(client, body, chosen, d, slices.Clone(dec))
		st.r = client
		if !retry {
			return outcome
		}
		pre = slices.DeleteFunc(pre, func(c route.Candidate) bool { return c.ID() == chosen.ID() })
		if round >= p.cfg.MaxAttempts || len(pre) == 0 || p.now().Sub(began) >= p.cfg.RetryBudget {
			p.pdm.legs.WithLabelValues("prefill", "failed").Inc()
			st.code = writeError(st.w, http.StatusBadGateway, fmt.Sprintf("the prefill leg for the model '%s' failed on %d replicas; nothing was generated", st.prompt.Model, round))
			return pdPrefillFailed
		}
		p.pdm.legs.WithLabelValues("prefill", "retried").Inc()
		p.m.retries.Inc()
		st.abandoned, st.code, st.cut = false, 0, false
	}
}

// sglangRound runs one round's legs: the prefill leg on its goroutine,
// pinned to chosen (decision d), the decode leg on the handler's. It
// reports the request's outcome, or that the round was abandoned for
// its prefill leg with nothing sent to the client (retry).
func (sr *splitRequest) sglangRound(client *http.Request, body []byte, chosen route.Candidate, d route.Decision, dec []route.Candidate) (outcome string, retry bool) {
	st, p := sr.st, sr.p
	dctx, cancelDecode := context.WithCancelCause(client.Context())
	defer cancelDecode(nil)
	pctx, cancelPrefill := context.WithCancel(client.Context())
	pr := &pair{decided: make(chan struct{}), cancel: cancelDecode, wait: p.cfg.UpstreamIdleTimeout}
	lw := newLegWriter(pr.prefillHead)
	leg := newLeg(st, pctx, hop.LegPinned, body, []route.Candidate{chosen}, lw)
	leg.hinted, leg.hintMatch = 0, d.Match
	var wg sync.WaitGroup
	wg.Go(func() {
		p.runLeg(leg)
		if lw.ok() && !leg.cut {
			pr.closeOne.Do(func() { close(pr.decided) })
		} else {
			pr.prefillFailed()
		}
	})
	// The prefill leg ends with its answer, which comes before the
	// decode's first token; once the decode leg is over, whatever is
	// left of it is cut.
	defer func() {
		cancelPrefill()
		wg.Wait()
		if lw.ok() && !leg.cut {
			p.pdm.legs.WithLabelValues("prefill", "ok").Inc()
			sr.prefilled = chosen.ID()
		}
	}()
	st.r = client.WithContext(dctx)
	outcome = sr.decode(body, dec, func() bool { return pr.gate(dctx) })
	// A client that closed its connection after its whole answer (at
	// the stream's [DONE]) was answered: only an unfinished answer is
	// the client's leaving.
	if outcome != pdOK && client.Context().Err() != nil {
		st.code = statusClientGone
		return pdClientGone, false
	}
	if pr.abandoned() && !headWritten(st.w) {
		return pdPrefillFailed, true
	}
	return outcome, false
}

// runLeg runs a leg the router answers itself to its end. A panic there
// must not reach the client's handler (which would abort the client's
// response for a leg it never sees) nor, on a leg's own goroutine, end
// the process: it is contained, counted unless it is the abort a relay
// raises for an upstream failed mid-body, and the leg counts as failed
// (cut).
func (p *Proxy) runLeg(leg *reqState) {
	defer func() {
		if v := recover(); v != nil {
			leg.cut = true
			if v != http.ErrAbortHandler {
				p.recovered(panicHandler, v)
			}
		}
	}()
	leg.attemptAll()
}

// headWritten reports whether the client's response has its head (so no
// other answer can follow); a writer the proxy does not track counts as
// written.
func headWritten(w http.ResponseWriter) bool {
	t, ok := w.(*trackedWriter)
	return !ok || t.wrote
}
