package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
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
		maxIdle: maxIdle, idle: map[string][]*upConn{}}
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
		if (u.idleTimeout > 0 && idle > u.idleTimeout) || !c.alive() {
			c.close()
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
	if len(l) >= u.maxIdle {
		u.mu.Unlock()
		c.close()
		return
	}
	u.idle[c.host] = append(l, c)
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

// upConn is one connection to a replica with its read buffer.
type upConn struct {
	nc     net.Conn
	io     *SockIO         // raw reads and writes (sockio.go); nil: nc's
	raw    syscall.RawConn // nil: not a socket; idle checks are skipped
	host   string
	buf    []byte
	r, w   int // unread bytes are buf[r:w]
	idleAt time.Time
	// The stream loop's (streamloop_linux.go): while inLoop, reads are
	// raw non-blocking reads of loopFD, at most loopReads of them (the
	// loop allows one per readiness), errAgain beyond.
	inLoop    bool
	loopFD    int
	loopReads int
}

func newUpConn(nc net.Conn, host string) *upConn {
	c := &upConn{nc: nc, host: host, buf: make([]byte, upstreamReadBuffer)}
	inner := nc
	if pc, ok := inner.(*PeerConn); ok {
		inner = pc.Conn
	}
	c.io = NewSockIO(inner)
	if sc, ok := inner.(syscall.Conn); ok && idleChecks {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw = raw
		}
	}
	return c
}

func (c *upConn) close() { _ = c.nc.Close() }

// alive peeks at an idle connection without blocking: a server that
// closed it (or sent something unasked) makes it unusable.
func (c *upConn) alive() bool {
	if c.io != nil {
		return c.io.idle()
	}
	if c.raw == nil {
		return true
	}
	ok := false
	err := c.raw.Read(func(fd uintptr) bool {
		ok = idleOpen(fd)
		return true
	})
	return err == nil && ok
}

// read reads from the socket into b (len(b) > 0). Go's poller resets a
// socket's readiness before every read, so a read cannot wait for the
// poller first: each response still ends with one read that finds
// nothing (as under net/http).
func (c *upConn) read(b []byte) (int, error) {
	if c.inLoop {
		return c.loopRead(b)
	}
	if c.io != nil {
		return c.io.Read(b)
	}
	return c.nc.Read(b)
}

// fill reads more bytes into the buffer, moving the unread ones to its
// start (and growing it up to limit) when it is full.
func (c *upConn) fill(limit int) error {
	if c.r > 0 && (c.w == len(c.buf) || c.r == c.w) {
		c.w = copy(c.buf, c.buf[c.r:c.w])
		c.r = 0
	}
	if c.w == len(c.buf) {
		if len(c.buf) >= limit {
			return fmt.Errorf("%w: more than %d bytes of headers", errUpstreamProtocol, limit)
		}
		nb := make([]byte, min(2*len(c.buf), limit))
		c.w = copy(nb, c.buf[c.r:c.w])
		c.r, c.buf = 0, nb
	}
	n, err := c.read(c.buf[c.w:])
	c.w += n
	return err
}

// writeRequest writes the head (the first head bytes of *buf) and the
// body: in one raw writev on Linux (sockio.go); elsewhere a body of up to
// upstreamWriteBuffer bytes is appended to the head for one write, a
// larger one goes with net.Buffers' writev.
func (c *upConn) writeRequest(buf *[]byte, head int, body []byte) (int, error) {
	if c.io != nil {
		// One writev of both, without copying the body.
		return c.io.writev((*buf)[:head], body)
	}
	if len(body) <= upstreamWriteBuffer {
		// Head and body leave in one write (one segment, one wake-up of
		// the replica); the pooled buffer keeps its grown size.
		*buf = append((*buf)[:head], body...)
		return c.nc.Write(*buf)
	}
	bufs := net.Buffers{(*buf)[:head], body}
	n, err := bufs.WriteTo(c.nc)
	return int(n), err
}

// readResponse reads the final response's head (1xx ones are skipped)
// and returns it with a body reader over the connection.
// stop unhooks the request's cancellation (the body's Close calls it).
func (c *upConn) readResponse(ctx context.Context, u *Client, stop func() bool) (*http.Response, error) {
	if u.headerTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(u.headerTimeout))
		// A cancellation that already set its past deadline was just
		// overwritten: it is seen here instead (ctx is done before its
		// AfterFunc runs).
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	var resp *http.Response
	for interim := 0; ; interim++ {
		if interim > maxInterim {
			return nil, fmt.Errorf("%w: more than %d informational responses", errUpstreamProtocol, maxInterim)
		}
		end, err := c.headEnd()
		if err != nil {
			return nil, err
		}
		resp, err = parseResponseHead(c.buf[c.r:end])
		c.r = end
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	if u.headerTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Time{})
		if err := ctx.Err(); err != nil { // cancelled while the deadline was cleared
			return nil, err
		}
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil, fmt.Errorf("%w: 101 Switching Protocols to a POST", errUpstreamProtocol)
	}
	b := &Body{c: c, u: u, stop: stop}
	if err := b.frame(resp); err != nil {
		return nil, err
	}
	resp.Body = b
	return resp, nil
}

// headEnd reads until the buffer holds a complete head (up to the empty
// line) and returns the index just past it.
func (c *upConn) headEnd() (int, error) {
	from := c.r
	for {
		if end := findHeadEnd(c.buf[c.r:c.w], from-c.r); end >= 0 {
			return c.r + end, nil
		}
		// Lines before the last newline are complete; scanning resumes
		// there after the buffer moves.
		scanned := 0
		if i := bytes.LastIndexByte(c.buf[c.r:c.w], '\n'); i >= 0 {
			scanned = i
		}
		if err := c.fill(maxResponseHeader); err != nil {
			if err == io.EOF && c.w > c.r {
				err = fmt.Errorf("%w: truncated head", errUpstreamProtocol)
			}
			return 0, err
		}
		from = c.r + scanned
	}
}

// findHeadEnd returns the index in b just past the line ending the head
// (an empty line, CRLF or LF), scanning from the line that starts at or
// before from; -1 when it is not in b yet.
func findHeadEnd(b []byte, from int) int {
	i := max(from, 0)
	for {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		k := i + j + 1 // the next line starts at k
		switch {
		case k < len(b) && b[k] == '\n':
			return k + 1
		case k+1 < len(b) && b[k] == '\r' && b[k+1] == '\n':
			return k + 2
		}
		i = k
	}
}

// parseResponseHead parses a status line and header fields (the bytes
// up to and including the empty line).
func parseResponseHead(b []byte) (*http.Response, error) {
	// One string holds the whole head: the status and every header value
	// are pieces of it, and the values' slices share one array (a few
	// allocations per response, not three per header line).
	head := string(b)
	line, rest := cutLineString(head)
	proto, status, _ := strings.Cut(line, " ")
	code, reason, _ := strings.Cut(status, " ")
	n := strings.Count(rest, "\n")
	resp := &http.Response{Proto: proto, ProtoMajor: 1, Header: make(http.Header, n), Status: status}
	switch proto {
	case "HTTP/1.1":
		resp.ProtoMinor = 1
	case "HTTP/1.0":
	default:
		return nil, fmt.Errorf("%w: status line %q", errUpstreamProtocol, trimForErrorString(line))
	}
	if len(code) != 3 || code[0] < '1' || code[0] > '9' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' {
		return nil, fmt.Errorf("%w: status line %q", errUpstreamProtocol, trimForErrorString(line))
	}
	resp.StatusCode = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if strings.ContainsFunc(reason, isCTL) {
		return nil, fmt.Errorf("%w: status line %q", errUpstreamProtocol, trimForErrorString(line))
	}
	strs := make([]string, n)
	for len(rest) > 0 {
		line, rest = cutLineString(rest)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("%w: folded header line", errUpstreamProtocol)
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || !validFieldName(k) {
			return nil, fmt.Errorf("%w: header line %q", errUpstreamProtocol, trimForErrorString(line))
		}
		v = strings.Trim(v, " \t")
		if strings.ContainsFunc(v, isCTL) {
			return nil, fmt.Errorf("%w: control byte in header %q", errUpstreamProtocol, trimForErrorString(k))
		}
		key := textproto.CanonicalMIMEHeaderKey(k)
		vv := resp.Header[key]
		if vv == nil && len(strs) > 0 {
			strs[0] = v
			vv, strs = strs[:1:1], strs[1:]
		} else {
			vv = append(vv, v)
		}
		resp.Header[key] = vv
	}
	return resp, nil
}

// cutLineString splits off the first line (its CRLF or LF removed).
func cutLineString(s string) (line, rest string) {
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return s, ""
	}
	line, rest = s[:i], s[i+1:]
	return strings.TrimSuffix(line, "\r"), rest
}

func trimForErrorString(s string) string {
	const n = 64
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// isCTL reports control characters other than HTAB, which no header
// value or reason phrase may hold.
func isCTL(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }

func trimForError(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Body framings (RFC 9112 6.3).
const (
	bodyNone    = iota // 1xx, 204, 304, or Content-Length: 0
	bodyLength         // Content-Length
	bodyChunked        // Transfer-Encoding ending in chunked
	bodyClose          // until the connection closes
)

// Chunked decoder states.
const (
	chunkSize    = iota // at a chunk-size line
	chunkData           // inside a chunk's data
	chunkDataEnd        // at the CRLF after a chunk's data
	chunkTrailer        // in the trailer section
	chunkDone
)

// Body reads one response body off its connection.
type Body struct {
	c      *upConn
	u      *Client
	stop   func() bool // stops the cancellation hook
	mode   int
	left   int64 // bodyLength: bytes to go; bodyChunked: of the current chunk
	state  int   // bodyChunked
	reuse  bool  // keep-alive on both sides
	eof    bool
	err    error
	closed bool
	trail  int // bytes of trailers read
}

// Conn is the connection the body is read from.
func (b *Body) Conn() net.Conn { return b.c.nc }

// NoReuse keeps the connection out of the pool once the body is closed
// (an idle watch set a past read deadline on it).
func (b *Body) NoReuse() { b.reuse = false }

// Loopable reports whether the stream loop can relay the body: chunked
// or ended by the close, on a TCP connection.
func (b *Body) Loopable() bool {
	return (b.mode == bodyChunked || b.mode == bodyClose) && upstreamTCPConn(b.c.nc) != nil
}

// frame reads the framing headers of resp into b and strips
// Transfer-Encoding from resp.Header as net/http does.
func (b *Body) frame(resp *http.Response) error {
	h := resp.Header
	b.reuse = resp.ProtoMinor == 1 && !HeaderHasToken(h["Connection"], "close")
	if resp.ProtoMinor == 0 && HeaderHasToken(h["Connection"], "keep-alive") {
		b.reuse = true
	}
	resp.ContentLength = -1
	te := h["Transfer-Encoding"]
	delete(h, "Transfer-Encoding")
	switch {
	case resp.StatusCode < 200 || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified:
		b.mode, b.eof = bodyNone, true
		resp.ContentLength = 0
	case len(te) > 0:
		resp.TransferEncoding = te
		if lastToken(te) != "chunked" {
			b.mode, b.reuse = bodyClose, false
			break
		}
		b.mode = bodyChunked
		if len(h["Content-Length"]) > 0 {
			// Both: Transfer-Encoding wins, and the connection is not
			// trusted again (RFC 9112 6.3).
			delete(h, "Content-Length")
			b.reuse = false
		}
	case len(h["Content-Length"]) > 0:
		n, err := contentLength(h["Content-Length"])
		if err != nil {
			return err
		}
		resp.ContentLength = n
		b.mode, b.left = bodyLength, n
		if n == 0 {
			b.mode, b.eof = bodyNone, true
		}
	default:
		b.mode, b.reuse = bodyClose, false
	}
	return nil
}

// contentLength parses Content-Length values: all must be the same
// decimal number.
func contentLength(vv []string) (int64, error) {
	var n int64 = -1
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			f = textproto.TrimString(f)
			m, err := strconv.ParseInt(f, 10, 64)
			if err != nil || m < 0 || f[0] == '+' || (n >= 0 && m != n) {
				return 0, fmt.Errorf("%w: Content-Length %q", errUpstreamProtocol, v)
			}
			n = m
		}
	}
	return n, nil
}

// HeaderHasToken reports whether a comma-separated header (its values)
// names tok, case-insensitively: a Connection header naming a field, or
// close / keep-alive.
func HeaderHasToken(vv []string, tok string) bool {
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(f), tok) {
				return true
			}
		}
	}
	return false
}

// lastToken is the last comma-separated element of the values, lower case.
func lastToken(vv []string) string {
	v := vv[len(vv)-1]
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.ToLower(textproto.TrimString(v))
}

// Read reads body bytes. A chunked body's Read returns every chunk's data
// already buffered, so a read off the socket that carried several chunks
// (several tokens) becomes one write to the client; it blocks only when
// it has nothing to return.
func (b *Body) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var err error
	switch b.mode {
	case bodyLength:
		n, err = b.readLength(p)
	case bodyChunked:
		n, err = b.readChunked(p)
	default:
		n, err = b.readClose(p)
	}
	if err != nil {
		if err == io.EOF {
			b.eof = true
		} else if err != errAgain {
			b.err = err
		}
	}
	return n, err
}

func (b *Body) readLength(p []byte) (int, error) {
	c := b.c
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	var n int
	if c.r < c.w {
		n = copy(p, c.buf[c.r:c.w])
		c.r += n
	} else {
		var err error
		n, err = c.read(p)
		if err == io.EOF {
			return 0, io.ErrUnexpectedEOF
		}
		if err != nil {
			return 0, err
		}
	}
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	return n, nil
}

func (b *Body) readClose(p []byte) (int, error) {
	c := b.c
	if c.r < c.w {
		n := copy(p, c.buf[c.r:c.w])
		c.r += n
		return n, nil
	}
	return c.read(p)
}

// readChunked decodes what the buffer holds into p, filling the buffer
// only while nothing has been decoded.
func (b *Body) readChunked(p []byte) (int, error) {
	c := b.c
	n := 0
	for n < len(p) {
		if c.r == c.w || (b.state != chunkData && !b.lineReady()) {
			if n > 0 {
				return n, nil
			}
			if err := c.fill(maxResponseHeader); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return 0, err
			}
			continue
		}
		switch b.state {
		case chunkSize:
			line := b.takeLine()
			size, err := parseChunkSize(line)
			if err != nil {
				return n, err
			}
			if size == 0 {
				b.state = chunkTrailer
			} else {
				b.left, b.state = size, chunkData
			}
		case chunkData:
			m := copy(p[n:], c.buf[c.r:c.r+int(min(b.left, int64(c.w-c.r)))])
			c.r += m
			n += m
			b.left -= int64(m)
			if b.left == 0 {
				b.state = chunkDataEnd
			}
		case chunkDataEnd:
			if line := b.takeLine(); len(line) != 0 {
				return n, fmt.Errorf("%w: chunk data longer than its size", errUpstreamProtocol)
			}
			b.state = chunkSize
		case chunkTrailer:
			line := b.takeLine()
			b.trail += len(line) + 2
			if b.trail > maxResponseHeader {
				return n, fmt.Errorf("%w: trailers over %d bytes", errUpstreamProtocol, maxResponseHeader)
			}
			if len(line) == 0 {
				b.state = chunkDone
				return n, io.EOF
			}
		}
	}
	return n, nil
}

// lineReady reports whether the buffer holds a whole line.
func (b *Body) lineReady() bool {
	return bytes.IndexByte(b.c.buf[b.c.r:b.c.w], '\n') >= 0
}

// takeLine consumes one buffered line (lineReady was true) and returns it
// without its CRLF or LF.
func (b *Body) takeLine() []byte {
	c := b.c
	i := bytes.IndexByte(c.buf[c.r:c.w], '\n')
	line := c.buf[c.r : c.r+i]
	c.r += i + 1
	return bytes.TrimSuffix(line, []byte{'\r'})
}

// parseChunkSize reads a chunk-size line: hex digits, optionally
// followed by chunk extensions (ignored).
func parseChunkSize(line []byte) (int64, error) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, fmt.Errorf("%w: chunk size %q", errUpstreamProtocol, trimForError(line))
	}
	var n int64
	for _, d := range line {
		switch {
		case d >= '0' && d <= '9':
			d -= '0'
		case d >= 'a' && d <= 'f':
			d -= 'a' - 10
		case d >= 'A' && d <= 'F':
			d -= 'A' - 10
		default:
			return 0, fmt.Errorf("%w: chunk size %q", errUpstreamProtocol, trimForError(line))
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

// Close releases the connection: back to the pool when the body was read
// to the end, the response allowed keep-alive and the request was not
// cancelled; closed otherwise.
func (b *Body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	stopped := b.stop()
	if b.eof && b.reuse && stopped && b.c.r == b.c.w {
		b.u.put(b.c)
		return nil
	}
	b.c.close()
	return nil
}
