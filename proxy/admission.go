package proxy

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/prompt"
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

// request is what admission reads of a request: its model, its
// class from the priority header (high, normal, low, or vLLM's integer),
// else from the body's priority (vLLM's integer, which the engine reads
// too), normal otherwise; its tenant, its cost in estimated prompt tokens
// (bytes / 4), and the queue deadline it asks for.
//
// The tenant is the API key when the router checks keys (a client cannot
// name itself another tenant); otherwise the tenant header, then the
// bearer key, then the client's address.
func (ad *admission) request(h http.Header, addr string, pr *prompt.Prompt) admit.Request {
	req := admit.Request{Model: pr.Model, Tenant: tenantOf(h, addr, ad.p.cfg.APIKeys != nil), Cost: float64(len(pr.Text)/4 + 1)}
	if c, ok := admit.ParseClass(h.Get(admit.HeaderPriority)); ok {
		req.Class = c
	} else if n, err := strconv.Atoi(pr.Priority); err == nil {
		req.Class = admit.ClassOfPriority(n)
	}
	if d, ok := admit.ParseTimeout(h.Get(admit.HeaderQueueTimeout)); ok {
		// A zero asks for no wait at all: the shortest wait there is.
		req.Timeout = max(d, 1)
	}
	return req
}

// bearerKey is the bearer key in h, "" when none.
func bearerKey(h http.Header) string {
	scheme, key, _ := strings.Cut(h.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(key)
}
