package proxy

import (
	"net/http"
	"strings"

	"github.com/kvmesh/kvmesh/proxy/hop"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Whom a router believes about hints.
// The hint headers (hop.HeaderHop, hop.HeaderReplica, hop.HeaderMatch) choose the
// replica a request goes to and skip the client's API key and per-client
// cap, so only a peer router may send them. A router believes them when
// a peer provably sent them:
//
//   - with a hop key (Config.HopKey, from the gossip key), the request's
//     MAC verifies within hop.Skew;
//   - with peer mutual TLS (Config.TrustPeerCerts), the request came over
//     TLS with a client certificate verified against the peer CA;
//   - with neither, never, unless the operator opted out
//     (Config.InsecureHops, --insecure-mesh): the routers of such a mesh
//     forward to each other with nothing to prove it, so anyone who can
//     reach the API can steer requests too.
//
// Hints it does not believe are deleted and the request is routed as any
// client's; kvmesh_hop_headers_ignored_total counts them by reason.

// Reasons of kvmesh_hop_headers_ignored_total.
const (
	// ignoreNoMeshAuth: the router has neither a hop key nor peer
	// certificates to check hints with (and no --insecure-mesh).
	ignoreNoMeshAuth = "no_mesh_auth"
	// ignoreBadMAC: the hop MAC is missing, wrong or out of hop.Skew.
	ignoreBadMAC = "bad_mac"
	// ignoreNoPeerCert: peer mutual TLS only, and the request has no
	// verified peer certificate.
	ignoreNoPeerCert = "no_peer_cert"
	// ignoreIncomplete: a replica or match header without X-Kvmesh-Hop,
	// which a router never sends.
	ignoreIncomplete = "incomplete"
)

// trustMetrics counts the hints a router did not believe.
type trustMetrics struct {
	ignored *prometheus.CounterVec
}

func newTrustMetrics(reg prometheus.Registerer) *trustMetrics {
	m := &trustMetrics{ignored: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_hop_headers_ignored_total",
		Help: "Requests whose router-to-router hint headers (X-Kvmesh-Hop, X-Kvmesh-Replica, X-Kvmesh-Match) the router deleted and ignored, because no peer provably sent them, by reason.",
	}, []string{"reason"})}
	for _, r := range []string{ignoreNoMeshAuth, ignoreBadMAC, ignoreNoPeerCert, ignoreIncomplete} {
		m.ignored.WithLabelValues(r)
	}
	return m
}

// hasHints reports whether r carries any hint header.
func hasHints(h http.Header) bool {
	return h.Get(hop.HeaderHop) != "" || h.Get(hop.HeaderReplica) != "" || h.Get(hop.HeaderMatch) != ""
}

// trustHints judges a request that carries hint headers: whether to
// follow them (ok), whether a peer provably sent them (authenticated),
// and, when not ok, why.
func trustHints(cfg *Config, signer *hop.Signer, r *http.Request) (ok, authenticated bool, reason string) {
	h := r.Header
	switch {
	case cfg.TrustPeerCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
		if h.Get(hop.HeaderHop) == "" {
			return false, false, ignoreIncomplete
		}
		return true, true, ""
	case len(cfg.HopKey) > 0:
		if signer.Verify(r) {
			return true, true, ""
		}
		return false, false, ignoreBadMAC
	case cfg.TrustPeerCerts && !cfg.InsecureHops:
		return false, false, ignoreNoPeerCert
	case cfg.InsecureHops:
		// Believed as sent, proving nothing: the request still needs the
		// client's API key.
		if h.Get(hop.HeaderHop) == "" {
			return false, false, ignoreIncomplete
		}
		return true, false, ""
	}
	return false, false, ignoreNoMeshAuth
}

// hopOf reports whether r is a forwarded request whose hints this router
// follows, and whether a peer provably sent it (authenticated), by
// trustHints' rule. Hints it does not follow are deleted, so the request
// is routed as any client's, and counted and (rate-limited) logged.
func (p *Proxy) hopOf(r *http.Request) (isHop, authenticated bool) {
	h := r.Header
	if !hasHints(h) {
		return false, false
	}
	ok, authenticated, reason := trustHints(&p.cfg, p.signer, r)
	if ok {
		return true, authenticated
	}
	for _, k := range []string{hop.HeaderHop, hop.HeaderReplica, hop.HeaderMatch, hop.HeaderHopTime, hop.HeaderHopMAC} {
		h.Del(k)
	}
	p.trust.ignored.WithLabelValues(reason).Inc()
	switch reason {
	case ignoreNoMeshAuth:
		p.junk.Printf("ignoring router hint headers from %s: this router has no gossip key and no peer mutual TLS to authenticate them (if it is a peer router: give every router the same --gossip-key-file)", r.RemoteAddr)
	default:
		// kvmesh_rejected_requests_total{reason="bad_hop_mac"} counts them too.
		p.edge.rejected.WithLabelValues(rejectBadHop).Inc()
		p.junk.Printf("dropping unauthenticated hint headers from %s (%s)", r.RemoteAddr, reason)
	}
	return false, false
}

// authorize checks the client's bearer key when keys are configured; on
// failure it has answered 401 as OpenAI does.
func (p *Proxy) authorize(w http.ResponseWriter, r *http.Request) bool {
	if p.cfg.APIKeys == nil {
		return true
	}
	auth := r.Header.Get("Authorization")
	scheme, key, _ := strings.Cut(auth, " ")
	if strings.EqualFold(scheme, "Bearer") && p.cfg.APIKeys.Valid(strings.TrimSpace(key)) {
		return true
	}
	p.edge.rejected.WithLabelValues(rejectAuth).Inc()
	abandonBody(w, r)
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvmesh"`)
	msg := "Incorrect API key provided."
	if auth == "" {
		msg = "You didn't provide an API key. Provide it in an Authorization header: Bearer YOUR_KEY."
	}
	writeErrorCode(w, http.StatusUnauthorized, "invalid_request_error", codeInvalidAPIKey, msg)
	return false
}
