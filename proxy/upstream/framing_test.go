package upstream

import (
	"bytes"
	"testing"
)

// TestEventFramingHoldsPartialEvents: the relay writes up to the last
// event end, holds the rest, passes on an event that fills the buffer
// (the client then holds part of it: no error event), and is back at an
// event boundary once that event's end is written.
func TestEventFramingHoldsPartialEvents(t *testing.T) {
	f := Framing{on: true}
	b := []byte(event(0) + "data: {")
	if k := f.Cut(b, 0, false); k != len(event(0)) || !f.CanEnd() {
		t.Fatalf("cut %d, want %d", k, len(event(0)))
	}
	if k := f.Cut([]byte("data: {"), 0, false); k != 0 || !f.CanEnd() {
		t.Fatalf("a partial event alone: cut %d, want 0", k)
	}
	if k := f.Cut([]byte("data: {"), 0, true); k != 7 || f.CanEnd() {
		t.Fatalf("a full buffer: cut %d (want all) canEnd %v (want false)", k, f.CanEnd())
	}
	if k := f.Cut([]byte("}"), 0, false); k != 1 || f.CanEnd() {
		t.Fatalf("the rest of a torn event without its end: cut %d (want all) canEnd %v", k, f.CanEnd())
	}
	if k := f.Cut([]byte("\n\ndata: x"), 0, false); k != 2 || !f.CanEnd() {
		t.Fatalf("the torn event's end: cut %d (want 2) canEnd %v (want true)", k, f.CanEnd())
	}
	off := Framing{}
	if k := off.Cut([]byte("data: {"), 0, false); k != 7 || off.CanEnd() {
		t.Fatalf("off: cut %d, want all, and no error event", k)
	}
}

// isEventBoundary reports whether a stream that is exactly b ends with
// a blank line that follows another line (the reference of eventEnd):
// the SSE line ends are CRLF, LF and CR, a CR at the end counting as one.
func isEventBoundary(b []byte) bool {
	lines, start := 0, 0 // start: where the current line starts
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			continue
		}
		empty := i == start
		if c == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		lines++
		start = i + 1
		if start == len(b) {
			return empty && lines > 1
		}
	}
	return false
}

// FuzzEventEnd checks eventEnd against isEventBoundary, its use with held
// bytes, and the relay's framing over arbitrary reads: what it reports is
// always an event end (a cut there leaves the client whole events), it
// finds the last "\n\n" or "\r\n\r\n", and a stream relayed through
// Framing in any pieces reaches the client byte for byte, at an
// event end whenever it is not torn.
func FuzzEventEnd(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data: a\n\ndata: b", "data: a\r\n\r\ndata", "a\r\rb", "a\n\r", "a\r\n\r", "a\r\r\nb", "\n\nx", ": ping\n\n"} {
		f.Add([]byte(s), uint8(3), []byte{1, 5, 2})
	}
	f.Fuzz(func(t *testing.T, b []byte, held uint8, splits []byte) {
		r := eventEnd(b, 0)
		if r < 0 || r > len(b) || (r > 0 && !isEventBoundary(b[:r])) {
			t.Fatalf("eventEnd(%q) = %d, not an event end", b, r)
		}
		for _, sep := range []string{"\n\n", "\r\n\r\n"} {
			if i := bytes.LastIndex(b, []byte(sep)); i >= 0 && r < i+len(sep) {
				t.Fatalf("eventEnd(%q) = %d, before the %q at %d", b, r, sep, i)
			}
		}
		if h := int(held) % (len(b) + 1); eventEnd(b[:h], 0) == 0 {
			if got := eventEnd(b, h); got != r {
				t.Fatalf("eventEnd(%q, %d) = %d, want %d", b, h, got, r)
			}
		}
		// The relay's loop over reads of the sizes splits gives, with
		// a buffer of 16 bytes.
		const size = 16
		fr := Framing{on: true}
		var out []byte
		buf := make([]byte, size)
		n, rest := 0, b
		for i := 0; ; i++ {
			m := len(rest)
			if len(splits) > 0 {
				m = int(splits[i%len(splits)]) % (size + 1)
			}
			m = min(max(m, 1), size-n, len(rest))
			copy(buf[n:], rest[:m])
			rest = rest[m:]
			eof := len(rest) == 0
			k := n + m
			if !eof {
				k = fr.Cut(buf[:n+m], n, n+m == size)
			}
			out = append(out, buf[:k]...)
			n = copy(buf, buf[k:n+m])
			if !eof && fr.CanEnd() && len(out) > 0 && !isEventBoundary(out) {
				t.Fatalf("%q in reads of %v: the client got %q, not at an event end", b, splits, out)
			}
			if eof {
				break
			}
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("%q relayed as %q", b, out)
		}
	})
}

// BenchmarkEventFraming is the framing's cost per read of a stream: a
// read that ends with an event (how nearly every read ends), and one
// that ends inside an event (the rare read split mid-event, scanned back
// to the last event end).
func BenchmarkEventFraming(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	split := append(append([]byte{}, ev...), ev[:100]...)
	for _, tc := range []struct {
		name string
		b    []byte
	}{{"whole", ev}, {"split", split}} {
		b.Run(tc.name, func(b *testing.B) {
			f := Framing{on: true}
			for b.Loop() {
				if f.Cut(tc.b, 0, false) != len(ev) {
					b.Fatal("wrong cut")
				}
			}
		})
	}
}
