package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Client is the router's own HTTP/1.1 client for its plain-HTTP
// replicas (hops to peer routers, TLS and any custom transport keep
// net/http). It exists because net/http's Transport hands every request to
// a writer goroutine and every response back from a reader goroutine (two
// goroutine wake-ups per request besides the handler's, through channels),
// and its reader polls each idle connection with a read that finds
// nothing. Here the handler's goroutine writes the request (head and body
// in one write) and reads the response itself; a chunked body's Read
// returns every chunk one socket read delivered. Against the router on
// net/http this took 27 % off its CPU per proxied 8 KB request and 0.8
// futex calls per request (docs/history/benchmarks.md, "The router's own upstream client";
// BenchmarkUpstreamClient).
//
// It speaks only what replicas answer: a response with Content-Length, a
// chunked body (trailers read and dropped) or a body that ends with the
// connection; 1xx responses before the final one are skipped. A
// connection goes back to the pool only after its response was read to
// the end and neither side asked to close it.
type Client struct {
	dial          dialFunc
	headerTimeout time.Duration // 0: none
	idleTimeout   time.Duration // 0: none
	maxIdle       int           // idle connections kept per host

	mu   sync.Mutex
	idle map[string][]*upConn // by host:port, most recently used last
	// closers are the hosts seen closing a connection right after a
	// chunked response that promised keep-alive (closesAfterStream).
	closers map[string]bool
}

// New returns the fast client for c, or nil when c is not a
// plain net/http Transport whose behaviour it can reproduce: a custom
// RoundTripper (a test's canned replica, an instrumented transport), a
// proxy setting or an overall client timeout keep every request on c.
func New(c *http.Client) *Client {
	t, ok := c.Transport.(*http.Transport)
	if !ok || t.Proxy != nil || c.Timeout != 0 || t.DisableKeepAlives {
		return nil
	}
	dial := dialFunc(t.DialContext)
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	maxIdle := t.MaxIdleConnsPerHost
	if maxIdle <= 0 {
		maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	return &Client{dial: dial, headerTimeout: t.ResponseHeaderTimeout, idleTimeout: t.IdleConnTimeout,
		maxIdle: maxIdle, idle: map[string][]*upConn{}, closers: map[string]bool{}}
}

// maxResponseHeader bounds a response's status line and headers (and a
// chunked body's trailers).
const maxResponseHeader = 1 << 20

// upstreamReadBuffer is a connection's read buffer: headers and the chunk
// framing pass through it; a fixed-length body's bytes are read straight
// into the caller's buffer when nothing is buffered.
const upstreamReadBuffer = 16 << 10

// maxInterim bounds the 1xx responses before the final one (net/http
// allows 5; a replica sends at most a 100 and a 103).
const maxInterim = 5

// errUpstreamProtocol marks a response the client cannot read.
var errUpstreamProtocol = errors.New("malformed upstream response")

// Do sends a POST of body to url (plain http) with the client's headers
// and returns the final response. Its Body must be closed; the connection
// is reused only if the body was read to the end.
func (u *Client) Do(ctx context.Context, url string, hdr http.Header, body []byte) (*http.Response, error) {
	host, path, ok := splitHTTPURL(url)
	if !ok {
		return nil, fmt.Errorf("upstream URL %q is not plain http", url)
	}
	req := appendRequest(getReqBuf(), host, path, hdr, len(body))
	defer putReqBuf(req)
	head := len(*req)
	for try := 0; ; try++ {
		c, reused, err := u.conn(ctx, host)
		if err != nil {
			return nil, err
		}
		pooled := time.Since(c.idleAt)
		// A cancelled request ends a blocked write or read; the
		// connection is then not reused.
		stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
		n, err := c.writeRequest(req, head, body)
		if err != nil {
			stop()
			c.close()
			if reused && n == 0 && try == 0 && ctx.Err() == nil {
				continue // a pooled connection the server had closed; nothing was sent
			}
			return nil, err
		}
		resp, err := c.readResponse(ctx, u, stop)
		if err != nil {
			stop()
			c.close()
			if reused && c.afterStream && pooled < closeSoon && c.w == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
				// Closed, with not a byte of an answer, just after a
				// stream: the next stream's connection is not pooled.
				u.markCloser(host)
			}
			return nil, err
		}
		return resp, nil
	}
}

// Plain reports whether url is a plain http:// URL the Client can reach.
func Plain(url string) bool {
	_, _, ok := splitHTTPURL(url)
	return ok
}

// splitHTTPURL splits an http:// URL into host:port and the request target.
func splitHTTPURL(url string) (host, path string, ok bool) {
	if len(url) < 7 || !strings.EqualFold(url[:7], "http://") {
		return "", "", false
	}
	rest := url[7:]
	i := strings.IndexAny(rest, "/?#")
	if i < 0 {
		host, path = rest, "/"
	} else {
		host, path = rest[:i], rest[i:]
	}
	if host == "" || strings.ContainsAny(host, "@ \t\r\n") || strings.Contains(path, "#") || strings.ContainsAny(path, " \t\r\n") {
		return "", "", false
	}
	if path[0] == '?' {
		path = "/" + path
	}
	return host, path, true
}

// dialAddr adds the default port to a host without one.
func dialAddr(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		return host + ":80"
	}
	return net.JoinHostPort(host, "80")
}

// conn takes an idle connection to host or dials one.
func (u *Client) conn(ctx context.Context, host string) (*upConn, bool, error) {
	now := time.Now()
	for {
		u.mu.Lock()
		l := u.idle[host]
		if len(l) == 0 {
			u.mu.Unlock()
			break
		}
		c := l[len(l)-1]
		l[len(l)-1] = nil
		u.idle[host] = l[:len(l)-1]
		u.mu.Unlock()
		idle := now.Sub(c.idleAt)
		// Every pooled connection is peeked at (one non-blocking recv)
		// before reuse: nothing else here reads an idle connection, and a
		// replica that exited or closed it for idleness has left a FIN
		// that only a read shows. Sent on such a connection, a request
		// would look written and fail unretried (net/http's reader
		// goroutine notices the FIN at once; this costs one syscall).
		if u.idleTimeout > 0 && idle > u.idleTimeout {
			c.close()
			continue
		}
		if !c.alive() {
			c.close()
			if c.afterStream && idle < closeSoon {
				u.markCloser(host)
			}
			continue
		}
		return c, true, nil
	}
	nc, err := u.dial(ctx, "tcp", dialAddr(host))
	if err != nil {
		return nil, false, err
	}
	return newUpConn(nc, host), false, nil
}

// put returns a connection whose response was read to the end.
func (u *Client) put(c *upConn) {
	c.idleAt = time.Now()
	if len(c.buf) > upstreamReadBuffer {
		// A rare large head grew it; an idle connection keeps the usual size.
		c.buf, c.r, c.w = make([]byte, upstreamReadBuffer), 0, 0
	}
	u.mu.Lock()
	l := u.idle[c.host]
	if len(l) >= u.maxIdle || (c.afterStream && u.closers[c.host]) {
		u.mu.Unlock()
		c.close()
		return
	}
	u.idle[c.host] = append(l, c)
	u.mu.Unlock()
}

// closeSoon is how soon after its response a server's close of a
// keep-alive connection is its way of ending that response rather than
// an idle timeout (servers' are seconds: uvicorn's and cpp-httplib's 5 s,
// nginx's 75 s).
const closeSoon = time.Second

// closesAfterStream: llama.cpp's server (b11312, cpp-httplib) ends every
// streamed response by closing its connection, after the last chunk and
// without a Connection: close. The connection comes back to the pool
// read to its end and looks idle until the FIN arrives; a request sent on
// it in that window (the very next one to the replica: a late-bound
// request is woken by that response's end, proxy/latebind.go) is written
// and then answered by EOF, which may not be retried (retry.go). So once
// a host was seen closing a connection soon after a chunked response
// (found closed at the next reuse, or failing it), connections after its
// chunked responses are closed, not pooled: those requests dial instead.
// markCloser records host as such a server.
func (u *Client) markCloser(host string) {
	u.mu.Lock()
	u.closers[host] = true
	u.mu.Unlock()
}

// CloseIdle closes every idle connection.
func (u *Client) CloseIdle() {
	u.mu.Lock()
	idle := u.idle
	u.idle = map[string][]*upConn{}
	u.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.close()
		}
	}
}

// maxPooledReq is the largest request head buffer kept for reuse.
const maxPooledReq = 64 << 10

var reqBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

func getReqBuf() *[]byte { return reqBufs.Get().(*[]byte) }

func putReqBuf(b *[]byte) {
	if cap(*b) <= maxPooledReq {
		*b = (*b)[:0]
		reqBufs.Put(b)
	}
}

// appendRequest writes the request head into *b: the client's headers
// that go upstream (ForwardsRequestHeader).
// A header value with a CR or LF (net/http's server never delivers one)
// is dropped rather than written.
func appendRequest(b *[]byte, host, path string, hdr http.Header, n int) *[]byte {
	s := append((*b)[:0], "POST "...)
	s = append(s, path...)
	s = append(s, " HTTP/1.1\r\nHost: "...)
	s = append(s, host...)
	s = append(s, "\r\n"...)
	conn := hdr["Connection"]
	for k, vv := range hdr {
		if !ForwardsRequestHeader(k, conn) || !validFieldName(k) {
			continue
		}
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n") {
				continue
			}
			s = append(s, k...)
			s = append(s, ": "...)
			s = append(s, v...)
			s = append(s, "\r\n"...)
		}
	}
	s = append(s, "Content-Length: "...)
	s = strconv.AppendInt(s, int64(n), 10)
	s = append(s, "\r\n\r\n"...)
	*b = s
	return b
}

// validFieldName reports whether k is an HTTP token (RFC 9110 5.6.2).
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isTokenByte(k[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
