package upstream

// Framing follows the SSE event framing of one relayed stream, so
// that a failure can end it with an error event: the relay writes a
// stream's bytes up to its last complete event and holds back the rest of
// a partial event until its blank line arrives. The zero
// value is off: every byte is written as it comes.
type Framing struct {
	on bool
	// torn: the client holds part of an event (one longer than the
	// buffer was passed on), until an event end is written.
	torn bool
}

// NewFraming returns the framing of a response: on for an SSE stream
// whose body the router frames (no Content-Length in the head it wrote).
func NewFraming(on bool) Framing { return Framing{on: on} }

// Cut returns how many bytes of b (held bytes held back, then the new
// ones) to write now: up to the last event end, the rest being held.
// full reports that b fills the buffer, so nothing more can be held:
// all of it is written, and the client then holds a partial event.
func (f *Framing) Cut(b []byte, held int, full bool) int {
	if !f.on {
		return len(b)
	}
	if n := eventEnd(b, held); n > 0 {
		f.torn = false
		return n
	}
	if f.torn || full {
		f.torn = true
		return len(b)
	}
	return 0
}

// CanEnd reports whether a failure may end the stream with an error
// event: an SSE stream whose client holds no partial event.
func (f *Framing) CanEnd() bool { return f.on && !f.torn }

// eventEnd returns the length of the longest prefix of b that ends with
// an SSE event (a blank line), 0 when b has none; b's first held bytes
// are known to hold none, and are only looked back at. A blank line ends
// with "\n\n", "\n\r\n" (CRLF framing, or LF then CRLF) or "\r\r" (CR
// framing: a CR ends a line whether or not an LF follows, and an LF after
// the second CR is part of the same blank line's end). An LF then a CR at
// the end may be a CRLF's first half: it is not counted until the next
// read tells, so what is reported is always an event's end.
func eventEnd(b []byte, held int) int {
	n := len(b)
	if n >= 2 && b[n-1] == '\n' && b[n-2] == '\n' {
		return n // how an engine's write, and so nearly every read, ends
	}
	for i := n - 1; i >= max(held, 1); i-- {
		switch b[i] {
		case '\n':
			if b[i-1] == '\n' || (b[i-1] == '\r' && i >= 2 && b[i-2] == '\n') {
				return i + 1
			}
		case '\r':
			if b[i-1] == '\r' {
				return i + 1
			}
		}
	}
	return 0
}
