package proxy

import (
	"bytes"
	"context"
	"io"
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

// newUpstreamRequest is the net/http request of an attempt: the client's
// headers that go upstream, and a body net/http can replay (it does only
// when nothing was written, see retry.go).
func newUpstreamRequest(ctx context.Context, url string, hdr http.Header, body []byte) (*http.Request, error) {
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyRequestHeader(out.Header, hdr)
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return out, nil
}
