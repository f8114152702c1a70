package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// sizedPool lends byte buffers by size class: 8, 16, 32 and 64 KB (plus
// extra bytes each), so that what a request holds for its whole life, a
// long stream included, is near the size it asked for, and is not garbage
// after every request.
type sizedPool struct {
	extra   int
	classes [4]sync.Pool
}

// bodyBufs holds request body buffers: a body of known length up to
// preallocBody is read into one (readKnown), the request path's largest
// allocation (8 KB of an 8 KB chat request). The extra byte is readKnown's
// EOF check.
var bodyBufs = sizedPool{extra: 1}

// textBufs holds buffers for rendered prompts (endpoint.renderTo), sized
// by the body: the rendering is the request path's other body-sized
// allocation. A request holds its buffer until inference returns; nothing
// keeps the prompt's text after that (the summary keeps hashes).
var textBufs sizedPool

// bodyClass is the size class of n bytes (0 < n <= preallocBody).
func bodyClass(n int64) int {
	c := 0
	for int64(8<<10)<<c < n {
		c++
	}
	return c
}

// get lends an empty buffer of capacity at least n (plus extra), nil when
// n is unknown or over preallocBody (the caller then allocates).
func (p *sizedPool) get(n int64) *[]byte {
	if n <= 0 || n > preallocBody {
		return nil
	}
	c := bodyClass(n)
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, (8<<10)<<c+p.extra)
	return &b
}

// put returns a buffer get lent.
func (p *sizedPool) put(b *[]byte) {
	p.classes[bodyClass(int64(cap(*b)-p.extra))].Put(b)
}

// readBody reads the request body once, under the size limit, as its
// bytes arrive: a Content-Length is only checked against the limit, never
// allocated, and the body deadline (setBodyDeadline) ends a trickle.
// A body of known small length is read into dst when it fits.
func (st *reqState) readBody(dst []byte) ([]byte, int, error) {
	p, w, r := st.p, st.w, st.r
	limit := p.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		abandonBody(w, r)
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds %d bytes", limit)
	}
	var b []byte
	var err error
	if r.ContentLength > 0 && r.ContentLength <= preallocBody {
		b, err = readKnown(dst, r.Body, r.ContentLength, limit)
	} else {
		b, err = readLimited(r.Body, limit)
	}
	switch {
	case err == nil:
		return b, 0, nil
	case errors.Is(err, errBodyTooLarge):
		abandonBody(w, r)
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds %d bytes", limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.edge.rejected.WithLabelValues(rejectBodyTimeout).Inc()
		p.junk.Printf("request body from %s not read within %v", r.RemoteAddr, p.cfg.BodyTimeout)
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestTimeout, fmt.Errorf("request body not received within %v", p.cfg.BodyTimeout)
	default:
		return nil, http.StatusBadRequest, fmt.Errorf("reading request body: %v", err)
	}
}

// preallocBody is the largest declared body read into one allocation of
// its size; a larger one grows as its bytes arrive, so that a declared
// length alone never makes the router allocate.
const preallocBody = 64 << 10

// readKnown reads a body whose Content-Length n (within the limit) is
// known and small: into dst when its capacity holds n+1 bytes, else one
// allocation of n bytes, where io.ReadAll would grow a slice from 512
// bytes through half a dozen copies. It reads on to the
// end of the body, since net/http watches for the client going away only
// once the body hit EOF; a body longer than declared (which net/http's
// server never delivers) is read on under the limit.
func readKnown(dst []byte, body io.Reader, n, limit int64) ([]byte, error) {
	var b []byte
	if int64(cap(dst)) > n {
		b = dst[:n]
	} else {
		b = make([]byte, n, n+1)
	}
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, err
	}
	for range 3 { // a Read may return (0, nil); a few are allowed
		m, err := body.Read(b[n : n+1])
		switch {
		case m == 0 && err == io.EOF:
			return b, nil
		case err != nil && err != io.EOF:
			return nil, err
		case m > 0:
			rest, err := readLimited(body, limit-n-1)
			if err != nil {
				return nil, err
			}
			return append(b[:n+1], rest...), nil
		}
	}
	rest, err := readLimited(body, limit-n)
	if err != nil {
		return nil, err
	}
	return append(b, rest...), nil
}

func (p *Proxy) clearBodyDeadline(w http.ResponseWriter, r *http.Request) {
	if p.cfg.BodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
}

// readLimited reads body as it arrives, failing once more than limit
// bytes came: memory follows the bytes received, never a Content-Length.
func readLimited(body io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errBodyTooLarge
	}
	return b, nil
}

var errBodyTooLarge = errors.New("body too large")
