package proxy

import (
	"context"
	"net"
	"net/http"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// ConnContext is an http.Server ConnContext that lets the proxy reach the
// client's connection, which the stream loop writes to. Set it only on a
// server whose Handler is the Proxy itself (no middleware buffering or
// rewriting the response in between); without it every stream takes the
// normal path.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, clientConnKey{}, c)
}

type clientConnKey struct{}

// clientTCPConn returns the plain TCP connection an HTTP/1.1 request came
// on, nil for TLS, HTTP/2 or a server without ConnContext.
func clientTCPConn(r *http.Request) *net.TCPConn {
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.TLS != nil {
		return nil
	}
	c, _ := r.Context().Value(clientConnKey{}).(net.Conn)
	for range 4 {
		switch t := c.(type) {
		case *net.TCPConn:
			return t
		case *limitedConn:
			c = t.Conn
		default:
			return nil
		}
	}
	return nil
}

// loopEligible reports whether relay may hand this response's body to the
// stream loop: an SSE 200 from the own upstream client to a plain HTTP/1.1
// client whose response net/http frames as chunked, written to net/http's
// own ResponseWriter (no wrapper that reads the bytes).
func (st *reqState) loopEligible(resp *http.Response, sse bool) (*upstream.Body, *net.TCPConn) {
	p, w, r := st.p, st.w, st.r
	if p.loops == nil || !sse || resp.StatusCode != http.StatusOK || r.Method != http.MethodPost {
		return nil, nil
	}
	b, ok := resp.Body.(*upstream.Body)
	if !ok || !b.Loopable() {
		return nil, nil
	}
	if len(w.Header()["Content-Length"]) > 0 {
		return nil, nil
	}
	if _, wrapped := unwrapTracked(w).(interface{ Unwrap() http.ResponseWriter }); wrapped {
		// A wrapper reads what is written (responseIDSniffer): the
		// bytes must go through it.
		return nil, nil
	}
	cc := clientTCPConn(r)
	if cc == nil {
		return nil, nil
	}
	return b, cc
}
