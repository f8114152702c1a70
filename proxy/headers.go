package proxy

import (
	"net/http"
	"net/textproto"
	"strings"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

func isEventStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

func removeConnectionHeaders(dst, src http.Header) {
	for _, v := range src["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				dst.Del(f)
			}
		}
	}
}

// copyRequestHeader copies the client's headers that go upstream
// (upstream.ForwardsRequestHeader) to an upstream request.
func copyRequestHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if upstream.ForwardsRequestHeader(k, conn) {
			dst[k] = vv
		}
	}
}
