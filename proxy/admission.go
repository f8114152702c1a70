package proxy

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/zeebo/xxh3"
)

// queue is the request's admission (package admit), between reading
// its candidates and deciding: it goes on at once while its model has
// room and nothing queues; otherwise it waits in the router's queue,
// without its candidates and heat (a wait holds neither pooled storage
// nor a place in the burst counts), and reads both again when its turn
// comes. It reports whether to go on; when not, it has answered (or the
// client is gone). A hop was admitted by the router it entered.
func (st *reqState) queue() bool {
	p := st.p
	if p.admit == nil || st.hop {
		return true
	}
	req := p.admitRequest(st.r, &st.prompt)
	room := admit.RoomOf(st.cands, p.admit.MaxWaiting())
	release, v := p.admit.Admit(st.r.Context(), req, room, st.letGo)
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

// letGo gives back the candidates' storage and the heat count before a
// wait in the queue.
func (st *reqState) letGo() {
	if st.releaseCands != nil {
		st.releaseCands()
		st.releaseCands, st.cands = nil, nil
	}
	if st.endHeat != nil {
		st.endHeat()
		st.endHeat = nil
	}
}

// roomOf reads a model's headroom for the admission's dispatcher: its
// candidates with this router's hops counted in, as a decision reads
// them.
func (p *Proxy) roomOf(model string) admit.Room {
	cands, release := p.cfg.View.PooledCandidates(model)
	defer release()
	p.hops.Fill(cands, p.cfg.View)
	return admit.RoomOf(cands, p.admit.MaxWaiting())
}

// Seeds of the tenant hashes, one per source of the identity, so one
// value from two sources does not name one tenant.
const (
	tenantByKey    = 0x74656e616e740001
	tenantByHeader = 0x74656e616e740002
	tenantByAddr   = 0x74656e616e740003
)

// admitRequest is what admission reads of a request: its model, its
// class from the priority header (high, normal, low, or vLLM's integer),
// else from the body's priority (vLLM's integer, which the engine reads
// too), normal otherwise; its tenant, its cost in estimated prompt tokens
// (bytes / 4), and the queue deadline it asks for.
//
// The tenant is the API key when the router checks keys (a client cannot
// name itself another tenant); otherwise the tenant header, then the
// bearer key, then the client's address.
func (p *Proxy) admitRequest(r *http.Request, pr *prompt.Prompt) admit.Request {
	req := admit.Request{Model: pr.Model, Tenant: p.tenantOf(r), Cost: float64(len(pr.Text)/4 + 1)}
	if c, ok := admit.ParseClass(r.Header.Get(admit.HeaderPriority)); ok {
		req.Class = c
	} else if n, err := strconv.Atoi(pr.Priority); err == nil {
		req.Class = admit.ClassOfPriority(n)
	}
	if d, ok := admit.ParseTimeout(r.Header.Get(admit.HeaderQueueTimeout)); ok {
		// A zero asks for no wait at all: the shortest wait there is.
		req.Timeout = max(d, 1)
	}
	return req
}

// tenantOf identifies r's tenant (admitRequest).
func (p *Proxy) tenantOf(r *http.Request) uint64 {
	key := bearerKey(r)
	switch {
	case p.cfg.APIKeys != nil && key != "":
		return xxh3.HashStringSeed(key, tenantByKey)
	case r.Header.Get(admit.HeaderTenant) != "":
		return xxh3.HashStringSeed(r.Header.Get(admit.HeaderTenant), tenantByHeader)
	case key != "":
		return xxh3.HashStringSeed(key, tenantByKey)
	}
	return xxh3.HashStringSeed(clientAddr(r), tenantByAddr)
}

// bearerKey is r's bearer key, "" when none.
func bearerKey(r *http.Request) string {
	scheme, key, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(key)
}
