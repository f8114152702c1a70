package upstream

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

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
	b.reuse = resp.ProtoMinor == 1 && !headerHasToken(h["Connection"], "close")
	if resp.ProtoMinor == 0 && headerHasToken(h["Connection"], "keep-alive") {
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

// headerHasToken reports whether a comma-separated header (its values)
// names tok, case-insensitively: a Connection header naming a field, or
// close / keep-alive.
func headerHasToken(vv []string, tok string) bool {
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
		b.c.afterStream = b.mode == bodyChunked
		b.u.put(b.c)
		return nil
	}
	b.c.close()
	return nil
}
