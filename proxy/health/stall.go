package health

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// Ejection reasons (the reason label of kvmesh_replica_ejections_total).
const (
	// ReasonFailedChecks: FailThreshold consecutive failures, of checks
	// or on the request path.
	ReasonFailedChecks = "failed_checks"
	// ReasonStalled: requests in flight there got no byte for the
	// router's stall window past the prefill it expected of them, and
	// the engine's progress counters, when it publishes them, did not
	// move meanwhile (Stall).
	ReasonStalled = "stalled"
)

// Stall is told by the request path that replica id has requests in
// flight of which none got a response byte, nor ended, since quiet, for
// longer than the prefill the router expected of them and its stall
// window; streamed says whether one of them is a stream. It reports
// whether the replica counts as stalled, and ejects it if it was healthy
// (logged and counted with reason "stalled"); it is then re-admitted
// like any other ejected replica, after PassThreshold passes, once its
// engine shows progress (noteProgressLocked).
//
// The engine's progress counters (engine.Uptime.Progress: tokens
// generated, prompt tokens prefilled, forward passes), when it publishes
// them, have the last word: a replica whose counters moved since quiet is
// working (a long non-streamed answer sends no byte until it is whole),
// and one whose counters a scrape since quiet read standing still is
// not. A replica whose counters no scrape has read since quiet is given
// the benefit of the doubt for up to unreadProgressLimit of silence: an
// engine's metrics page is rendered by its API server, which a wedged
// engine leaves answering at once, while a busy one renders it slowly
// (vLLM's 55 KB page took 1–6 s under load against the scrape's 1 s
// timeout, and a preempting engine recomputes for seconds with no
// token out), so an unread counter is load more often than a stall.
// Without counters, only a stream's silence is evidence:
// an engine sends a stream's tokens as they come, so a stream with no
// byte while no other request there progressed is an engine that does
// not progress; a non-streamed request's silence alone is a long answer
// as much as a stall.
func (h *Checker) Stall(id string, quiet time.Time, streamed bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if s == nil {
		return false
	}
	if s.progressKnown {
		if s.progressMoved.After(quiet) {
			return false
		}
		if !s.progressAt.After(quiet) && time.Since(quiet) < unreadProgressLimit {
			return false // not read since the silence began: no evidence yet
		}
	} else if !streamed {
		return false
	}
	if s.healthy {
		s.healthy, s.ejected, s.stalled = false, true, true
		s.passes, s.stalledAt = 0, time.Now()
		h.ejections.WithLabelValues(ReasonStalled).Inc()
		h.log.Warn("replica ejected", "replica", id, "reason", ReasonStalled, "quiet", time.Since(quiet).Round(time.Millisecond))
		h.notify(id, s)
	}
	return true
}

// unreadProgressLimit is the longest silence a replica whose progress
// counters no scrape could read is not judged stalled for: the upstream
// idle timeout's default (the longest silence the router allows any
// replica once it has spoken), after which a replica that answers
// neither its requests nor its metrics page is taken for stuck.
const unreadProgressLimit = time.Minute

// noteProgressLocked follows the engine's progress counters, scraped at
// r.now. A change is dated at the scrape before it, the earliest the
// engine can have done that work: dated at the scrape that saw it, work
// done before a freeze and seen by the scrape after it would read as
// progress after the freeze, for good. h.mu is held.
func (h *Checker) noteProgressLocked(s *replicaHealth, r pollResult) {
	if !r.scraped {
		return
	}
	v, ok := r.uptime.Progress()
	if !ok {
		return
	}
	if s.progressKnown && v != s.progress {
		s.progressMoved = s.progressAt
	}
	s.progress, s.progressKnown, s.progressAt = v, true, r.now
}

// progressedLocked reports whether a replica ejected as stalled may count
// a passed check towards its re-admission: it progresses again, its
// engine's progress counters having moved since the ejection, or its
// engine having answered the checker's probe, a one-token completion
// (probe), since. Not its running nothing: the requests it was stuck on
// were ended, and an engine whose scheduler is wedged may let them go
// all the same; re-admitted, it would hold the next requests for a
// window more. h.mu is held.
func (h *Checker) progressedLocked(s *replicaHealth) bool {
	return !s.stalled || (s.progressKnown && s.progressMoved.After(s.stalledAt)) || s.answeredAt.After(s.stalledAt)
}

// probeTimeout bounds a stalled replica's probe: a one-token completion
// of a one-word prompt, which an engine that progresses at all answers
// within seconds even behind a queue of short requests. The poll of that
// replica waits for it; the replica is ejected meanwhile.
const probeTimeout = 10 * time.Second

// probe asks replica id (at base) for one token of model and reports
// whether it answered 200: while its requests were stuck the replica
// was ejected, and an idle engine moves no counter, so it is asked to.
func (h *Checker) probe(ctx context.Context, id, base, model string) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": "ping", "max_tokens": 1})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		h.log.Debug("stalled replica's probe", "replica", id, "error", err)
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxHealthBytes))
	return resp.StatusCode == http.StatusOK
}
