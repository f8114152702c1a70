package upstream

import (
	"slices"
	"strings"
)

// Hop-by-hop headers (RFC 9110 7.6.1) are never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func HopByHop(k string) bool {
	return slices.Contains(hopHeaders, k)
}

// ForwardsRequestHeader reports whether the client's request header k
// goes on to an upstream (both clients use it: copyRequestHeader for
// net/http, appendRequest for the own one). Not forwarded: hop-by-hop
// headers and those the client's Connection header (conn) names; kvmesh's
// own hints (only this router sets them); Accept-Encoding (the router reads
// the answer and streams identity); Content-Length, Host and Expect (the
// router frames the request and holds the whole body already).
func ForwardsRequestHeader(k string, conn []string) bool {
	return !HopByHop(k) && k != "Accept-Encoding" && k != "Content-Length" && k != "Host" && k != "Expect" &&
		!strings.HasPrefix(k, "X-Kvmesh-") && !headerHasToken(conn, k)
}
