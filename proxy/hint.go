package proxy

import (
	"net/http"

	"github.com/kvmesh/kvmesh/proxy/hop"
)

// hopOf reports whether r is a forwarded request whose hints this router
// follows, and whether a peer provably sent it (authenticated). With a
// hop key the MAC must verify (hop.Signer.Verify); a request over TLS with a
// client certificate verified against the peer CA is a peer's (when
// Config.TrustPeerCerts is set). With neither a key nor peer
// certificates the mesh is unauthenticated: hints are followed as sent
// (the router warns about it at start) but prove nothing, so the request
// still needs the client's API key. Untrusted hint headers are deleted,
// so the request is routed as any client's.
func (p *Proxy) hopOf(r *http.Request) (isHop, authenticated bool) {
	h := r.Header
	if h.Get(hop.HeaderHop) == "" && h.Get(hop.HeaderReplica) == "" && h.Get(hop.HeaderMatch) == "" {
		return false, false
	}
	ok := false
	switch {
	case p.cfg.TrustPeerCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
		ok, authenticated = h.Get(hop.HeaderHop) != "", true
	case len(p.cfg.HopKey) > 0:
		ok = p.signer.Verify(r)
		authenticated = ok
	case !p.cfg.TrustPeerCerts:
		ok = h.Get(hop.HeaderHop) != ""
	}
	if !ok {
		p.edge.rejected.WithLabelValues(rejectBadHop).Inc()
		p.junk.Printf("dropping unauthenticated hint headers from %s", r.RemoteAddr)
		for _, k := range []string{hop.HeaderHop, hop.HeaderReplica, hop.HeaderMatch, hop.HeaderHopTime, hop.HeaderHopMAC} {
			h.Del(k)
		}
	}
	return ok, ok && authenticated
}
