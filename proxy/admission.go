package proxy

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/zeebo/xxh3"
)

// admission is the proxy's side of package admit: what it reads of a
// request and of the view, and the request path's wait.
type admission struct {
	p *Proxy
	a *admit.Admitter
}

func newAdmission(p *Proxy, cfg admit.Config) *admission {
	ad := &admission{p: p}
	cfg.Room, cfg.Registerer = ad.roomOf, p.cfg.Registerer
	ad.a = admit.New(cfg)
	return ad
}

// queue is st's admission, between reading its candidates and deciding:
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
	req := ad.request(st.r, &st.prompt)
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

// roomOf reads a model's headroom for the admission's dispatcher: its
// candidates with this router's hops counted in, as a decision reads
// them.
func (ad *admission) roomOf(model string) admit.Room {
	v := ad.p.cfg.View
	cands, release := v.PooledCandidates(model)
	defer release()
	ad.p.hops.Fill(cands, v)
	return admit.RoomOf(cands, ad.a.Limits())
}

// close sheds what still queues (503): no request is dropped silently.
func (ad *admission) close() {
	if ad != nil {
		ad.a.Close()
	}
}

// depth is what queues by class (none when admission is off).
func (ad *admission) depth() [admit.NumClasses]int {
	if ad == nil {
		return [admit.NumClasses]int{}
	}
	return ad.a.Depth()
}

// Seeds of the tenant hashes, one per source of the identity, so one
// value from two sources does not name one tenant.
const (
	tenantByKey    = 0x74656e616e740001
	tenantByHeader = 0x74656e616e740002
	tenantByAddr   = 0x74656e616e740003
)

// request is what admission reads of a request: its model, its
// class from the priority header (high, normal, low, or vLLM's integer),
// else from the body's priority (vLLM's integer, which the engine reads
// too), normal otherwise; its tenant, its cost in estimated prompt tokens
// (bytes / 4), and the queue deadline it asks for.
//
// The tenant is the API key when the router checks keys (a client cannot
// name itself another tenant); otherwise the tenant header, then the
// bearer key, then the client's address.
func (ad *admission) request(r *http.Request, pr *prompt.Prompt) admit.Request {
	req := admit.Request{Model: pr.Model, Tenant: ad.tenantOf(r), Cost: float64(len(pr.Text)/4 + 1)}
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

// tenantOf identifies r's tenant (request).
func (ad *admission) tenantOf(r *http.Request) uint64 {
	key := bearerKey(r)
	switch {
	case ad.p.cfg.APIKeys != nil && key != "":
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
