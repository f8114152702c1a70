package proxy

import "net/http"

// hopOf reports whether r is a forwarded request whose hints this router
// follows, and whether a peer provably sent it (authenticated), by
// trustHints' rule (trust.go). Hints it does not follow are deleted, so
// the request is routed as any client's.
func (p *Proxy) hopOf(r *http.Request) (isHop, authenticated bool) {
	if !hasHints(r.Header) {
		return false, false
	}
	ok, authenticated, reason := p.trustHints(r)
	if !ok {
		p.ignoreHints(r, reason)
	}
	return ok, ok && authenticated
}
