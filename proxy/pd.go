package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Prefill/decode disaggregation (Config.PD): a chat or completions
// request that a router decides is split into a prefill leg and a decode
// leg (package disagg has both protocols' bodies). The prefill replica
// is chosen by cache, as a whole request's replica is (route.Policy over
// the replicas that prefill: only their summaries say where a prompt's
// KV is); the decode replica by load and locality (decodePick). Each leg
// is a request of its own through the normal path: decided, booked,
// attempted (through its replica's owner, the hop value naming the leg,
// hop.Leg), retried while it provably reached no replica, relayed. The
// prefill leg's answer goes to a legWriter, not to the client; the
// decode leg's is the client's.
//
//	vLLM:   prefill leg, then (its kv_transfer_params) the decode leg
//	SGLang: both legs at once, paired by a bootstrap room (pdpair.go)
//
// The client's request is counted once; each leg's decision is counted
// (a decode leg's as pd-decode), and kvmesh_pd_requests_total tells how
// the split requests ended. A leg on a replica this router owns is
// learnt as its replica holds it: a prefill leg's prompt (the replica
// never sees the answer), nothing of a decode leg (decode replicas are
// placed by load; their caches do not steer prefills).

// ReasonDecode is the decision label of a decode leg (decodePick).
const ReasonDecode route.Reason = "pd-decode"

// Outcomes of kvmesh_pd_requests_total.
const (
	pdOK            = "ok"             // the decode leg answered
	pdPrefillFailed = "prefill_failed" // no prefill leg answered
	pdDecodeFailed  = "decode_failed"  // the decode leg failed (before or during its answer)
	pdClientGone    = "client_gone"
	pdWhole         = "whole" // not split (a batch), served by a whole replica
	pdRefused       = "refused"
)

// pdMetrics count the split requests and their legs.
type pdMetrics struct {
	requests *prometheus.CounterVec
	legs     *prometheus.CounterVec
	warms    *prometheus.CounterVec // pdwarm.go
}

func newPDMetrics(reg prometheus.Registerer, proto disagg.Protocol) *pdMetrics {
	f := promauto.With(reg)
	m := &pdMetrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_pd_requests_total",
			Help: "Requests this router split into a prefill and a decode leg (--pd-protocol), by protocol and outcome: ok, prefill_failed, decode_failed, client_gone, refused (no replica of a role), whole (a batch, served by a whole replica).",
		}, []string{"protocol", "outcome"}),
		legs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_pd_leg_rounds_total",
			Help: "Rounds of the legs of split requests this router decided, by leg (prefill, decode) and result: ok, failed, retried (a prefill leg that failed before any output, tried again on another prefill replica).",
		}, []string{"leg", "result"}),
		warms: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_pd_warm_requests_total",
			Help: "Prefill-only requests of a split request's prompt and answer that this router sent (or skipped) to the replica that prefilled it, so that the next turn's prefill finds the answer cached (--pd-warm), by protocol and outcome: ok, failed, busy (skipped: the replica could not start it at once), full (skipped: too many in flight), none (skipped: no next turn can be told from the body), gone (skipped: the replica no longer prefills, or the router is stopping).",
		}, []string{"protocol", "outcome"}),
	}
	// Zeros, not gaps (protocol "off" where nothing is split).
	for _, o := range []string{pdOK, pdPrefillFailed, pdDecodeFailed, pdClientGone, pdWhole, pdRefused} {
		m.requests.WithLabelValues(proto.String(), o)
	}
	for _, o := range []string{warmOK, warmFailed, warmBusy, warmFull, warmNone, warmGone} {
		m.warms.WithLabelValues(proto.String(), o)
	}
	for _, l := range []string{"prefill", "decode"} {
		for _, r := range []string{"ok", "failed", "retried"} {
			m.legs.WithLabelValues(l, r)
		}
	}
	return m
}

// splits reports whether st is split into legs: a request this router
// decides, of an endpoint both protocols serve, in a deployment that
// disaggregates.
func splits(st *reqState) bool {
	return st.p.cfg.PD != disagg.None && !st.hop && (st.ep == &chatAPI || st.ep == &completionAPI)
}

// fitsLeg reports whether a replica of role r serves leg (hop.LegNone: a
// whole request; hop.LegPinned: a leg only the hinted replica serves,
// SGLang's prefill leg or a warm request). A whole replica takes either leg of vLLM's protocol (a
// vLLM replica with a KV connector of role kv_both does), but none of
// SGLang's (strict): an SGLang server runs in one disaggregation mode,
// and the two legs' bodies are the same, so only its mode tells it which
// leg it serves.
func fitsLeg(r route.Role, leg hop.Leg, strict bool) bool {
	switch leg {
	case hop.LegPinned:
		return r == route.RolePrefill || (!strict && r == route.RoleBoth)
	case hop.LegPrefill:
		return r == route.RolePrefill || (!strict && r == route.RoleBoth)
	case hop.LegDecode:
		return r == route.RoleDecode || (!strict && r == route.RoleBoth)
	}
	return r == route.RoleBoth
}

// strictLegs reports whether only replicas of a leg's own role serve it
// (fitsLeg): SGLang's protocol.
func strictLegs(p *Proxy) bool { return p.cfg.PD == disagg.SGLang }

// fitRole keeps the candidates that serve leg, in place; a split request
// (split) keeps all of them for its legs to choose from.
func fitRole(cands []route.Candidate, leg hop.Leg, split, strict bool) []route.Candidate {
	misfit := func(c route.Candidate) bool { return !fitsLeg(c.Role, leg, strict) }
	if split || !slices.ContainsFunc(cands, misfit) {
		return cands
	}
	return slices.DeleteFunc(cands, misfit)
}

// legCands copies the candidates that serve leg, each with a Detail of
// its own: a leg that runs beside another (SGLang's prefill leg) books
// and catches up on its own candidates.
func legCands(cands []route.Candidate, leg hop.Leg, strict bool) []route.Candidate {
	var out []route.Candidate
	for _, c := range cands {
		if !fitsLeg(c.Role, leg, strict) {
			continue
		}
		if c.Detail != nil {
			d := *c.Detail
			c.Detail = &d
		}
		out = append(out, c)
	}
	return out
}

// decodePick places a decode leg by load and locality (byLoadOrder),
// with rendezvous hashing on key among equals. A decode replica's cache
// steers nothing: its prompt arrives as KV.
func decodePick(cands []route.Candidate, key uint64) route.Decision {
	return route.Decision{Index: pickByLoad(cands, key), Reason: ReasonDecode}
}

// HeaderRequestID names a request to the engines (vLLM and SGLang log and
// echo it); both legs of a split request carry the same one, as vLLM's
// own disaggregation proxy sends them.
const HeaderRequestID = "X-Request-Id"

// splitRequest is one request split into legs.
type splitRequest struct {
	st    *reqState
	p     *Proxy
	proto string
	// orig is the client's body (st.body is the decode leg's).
	orig []byte
	// prefilled is the replica whose prefill leg answered.
	prefilled string
}

// serveSplit serves st, a request this router split (splits), by its
// deployment's protocol.
func serveSplit(st *reqState) {
	p := st.p
	sr := &splitRequest{st: st, p: p, proto: p.cfg.PD.String(), orig: st.body}
	if st.r.Header.Get(HeaderRequestID) == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		st.r.Header.Set(HeaderRequestID, "kvmesh-"+hex.EncodeToString(b[:]))
	}
	outcome := pdOK
	switch p.cfg.PD {
	case disagg.VLLM:
		outcome = sr.vllm()
	case disagg.SGLang:
		outcome = sr.sglang()
	}
	p.pdm.requests.WithLabelValues(sr.proto, outcome).Inc()
	if outcome == pdOK && p.warms != nil {
		sr.warm(sr.prefilled, st.answer)
	}
}

// whole serves a request neither protocol splits (a batch) as an
// unsplit one, among the whole replicas; ErrBatch's 400 when none.
func (sr *splitRequest) whole() string {
	st := sr.st
	st.split = false
	st.cands = fitRole(st.cands, hop.LegNone, false, false)
	if len(st.cands) == 0 {
		st.code = writeError(st.w, http.StatusBadRequest, disagg.ErrBatch.Error()+"; this deployment has no whole replica for it")
		return pdWhole
	}
	st.attemptAll()
	return pdWhole
}

// legsOrRefuse partitions the candidates by the legs they serve; when a
// leg has none it answers 503 (the replicas of a role may come back)
// and returns false.
func (sr *splitRequest) legsOrRefuse(pre, dec []route.Candidate) bool {
	st := sr.st
	role := ""
	switch {
	case len(pre) == 0:
		role = "prefill"
	case len(dec) == 0:
		role = "decode"
	default:
		return true
	}
	st.code = writeRetryLater(st.w, http.StatusServiceUnavailable, time.Second,
		fmt.Sprintf("no healthy %s replica serves the model '%s'", role, st.prompt.Model))
	return false
}

// newLeg is a leg of st that the router answers to w (a legWriter):
// its own context (ctx, under the client's, without the client's
// connection, so that the stream loop never writes a leg to the client),
// body and candidates; the rest is st's.
func newLeg(st *reqState, ctx context.Context, leg hop.Leg, body []byte, cands []route.Candidate, w http.ResponseWriter) *reqState {
	l := &reqState{p: st.p, w: w, r: st.r.WithContext(context.WithValue(ctx, clientConnKey{}, nil)), ep: st.ep, path: st.path,
		body: body, prompt: st.prompt, root: st.root, hashes: st.hashes, req: st.req, cands: cands, snap: st.snap,
		hinted: -1, concurrent: st.concurrent, fork: st.fork, leg: leg, split: false}
	l.prompt.Stream = false // a prefill leg's answer is one token
	return l
}

// vllm serves sr by vLLM's protocol: the prefill leg (retried on another
// prefill replica while it fails before answering), then the decode leg
// with its kv_transfer_params.
func (sr *splitRequest) vllm() string {
	st, p := sr.st, sr.p
	pbody, err := disagg.VLLMPrefill(sr.orig)
	if errors.Is(err, disagg.ErrBatch) {
		return sr.whole()
	}
	if err != nil {
		st.code = writeError(st.w, http.StatusBadRequest, err.Error())
		return pdRefused
	}
	pre, dec := legCands(st.cands, hop.LegPrefill, false), fitRole(st.cands, hop.LegDecode, false, false)
	if !sr.legsOrRefuse(pre, dec) {
		return pdRefused
	}
	var params []byte
	began := p.now()
	for round := 1; ; round++ {
		lw := newLegWriter(nil)
		leg := newLeg(st, st.r.Context(), hop.LegPrefill, pbody, pre, lw)
		p.runLeg(leg)
		if st.r.Context().Err() != nil {
			st.code = statusClientGone
			return pdClientGone
		}
		if lw.ok() && !leg.cut {
			params, err = disagg.VLLMParams(lw.body)
			if err == nil {
				p.pdm.legs.WithLabelValues("prefill", "ok").Inc()
				sr.prefilled = leg.lastID
				break
			}
			p.junk.Printf("prefill leg at %s answered no usable kv_transfer_params: %v", leg.lastID, err)
		}
		// Failed before any output reached anyone: another prefill
		// replica may take it (no generation is duplicated: the decode
		// leg has not started).
		pre = slices.DeleteFunc(pre, func(c route.Candidate) bool { return c.ID() == leg.lastID })
		if round >= p.cfg.MaxAttempts || len(pre) == 0 || p.now().Sub(began) >= p.cfg.RetryBudget || leg.lastID == "" {
			p.pdm.legs.WithLabelValues("prefill", "failed").Inc()
			st.code = lw.answer(st.w, st.prompt.Model)
			return pdPrefillFailed
		}
		p.pdm.legs.WithLabelValues("prefill", "retried").Inc()
		p.m.retries.Inc()
	}
	dbody, err := disagg.VLLMDecode(sr.orig, params)
	if err != nil { // sr.orig parsed for the prefill leg already
		st.code = writeError(st.w, http.StatusBadRequest, err.Error())
		return pdRefused
	}
	return sr.decode(dbody, dec, nil)
}

// decode runs the decode leg on st itself (its answer is the client's),
// with gate between its head and the relay (nil: none).
func (sr *splitRequest) decode(body []byte, dec []route.Candidate, gate func() bool) string {
	st, p := sr.st, sr.p
	st.body, st.cands, st.leg, st.byLoad, st.gate = body, dec, hop.LegDecode, true, gate
	st.hinted = -1
	st.attemptAll()
	switch {
	case st.abandoned:
		return pdPrefillFailed
	case st.code == statusClientGone:
		return pdClientGone
	case st.code < 200 || st.code >= 300 || st.cut:
		p.pdm.legs.WithLabelValues("decode", "failed").Inc()
		return pdDecodeFailed
	}
	p.pdm.legs.WithLabelValues("decode", "ok").Inc()
	return pdOK
}
