package upstream

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"syscall"
	"time"
)

// upConn is one connection to a replica with its read buffer.
type upConn struct {
	nc     net.Conn
	io     *SockIO         // raw reads and writes (sockio.go); nil: nc's
	raw    syscall.RawConn // nil: not a socket; idle checks are skipped
	host   string
	buf    []byte
	r, w   int // unread bytes are buf[r:w]
	idleAt time.Time
	// afterStream: its last response was chunked (Client.markCloser).
	afterStream bool
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
