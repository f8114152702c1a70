// Package jsonscan is the router's one hand-written JSON tokenizer: a
// cursor over a JSON text that validates the grammar as it reads tokens,
// without reflection, a separate validation pass or copies of string
// content. Request rendering (proxy/prompt) and answer extraction
// (proxy/reply) build their single-pass readers on it; encoding/json stays
// their reference (every accept/reject decision and decoded string here
// matches it, which the fuzz tests hold it to).
//
// Methods that return ok=false have met invalid JSON or, for Skip, nesting
// deeper than the scanner's limit; the caller then gives up on the text.
package jsonscan

// MaxDepth is encoding/json's nesting limit: a scanner with this limit
// accepts exactly the texts json.Valid accepts.
const MaxDepth = 10000

// Scanner walks one JSON text.
type Scanner struct {
	buf      []byte
	pos      int
	maxDepth int
}

// New returns a scanner at the start of buf that follows nesting up to
// maxDepth containers (at most MaxDepth).
func New(buf []byte, maxDepth int) Scanner {
	return Scanner{buf: buf, maxDepth: min(maxDepth, MaxDepth)}
}

// Pos is the offset of the cursor in the text.
func (s *Scanner) Pos() int { return s.pos }

// Since returns the text from offset start to the cursor.
func (s *Scanner) Since(start int) []byte { return s.buf[start:s.pos] }

// Next consumes the byte Peek returned.
func (s *Scanner) Next() { s.pos++ }

// Peek returns the next byte after whitespace, or 0 at the end (0 is
// invalid wherever a byte is expected, so callers need no length checks).
func (s *Scanner) Peek() byte {
	for s.pos < len(s.buf) {
		switch c := s.buf[s.pos]; c {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return c
		}
	}
	return 0
}

// Eat consumes c, the next byte after whitespace.
func (s *Scanner) Eat(c byte) bool {
	if s.Peek() != c {
		return false
	}
	s.pos++
	return true
}

// End reports whether only whitespace is left: encoding/json rejects
// anything after the top-level value.
func (s *Scanner) End() bool {
	return s.Peek() == 0 && s.pos == len(s.buf)
}

// RawString consumes a string at the cursor (which holds '"') and returns
// the bytes between the quotes, whether they hold escapes, and whether the
// string is valid JSON. It does not look at UTF-8: encoding/json accepts
// invalid UTF-8 in strings (and replaces it when it decodes them), so this
// is for strings that are validated or copied raw, not decoded.
func (s *Scanner) RawString() (raw []byte, esc, ok bool) {
	b := s.buf
	start := s.pos + 1
	i, end := start, -1
	for {
		j, ok := stringRun(b, i, &end, false)
		if !ok {
			return nil, false, false
		}
		if b[j] == '"' {
			s.pos = j + 1
			return b[start:j], esc, true
		}
		esc = true
		n, ok := escapeLen(b[j:])
		if !ok {
			return nil, false, false
		}
		i = j + n
	}
}

// AppendString consumes a string at the cursor (which holds '"') and
// appends its value to dst, in one pass that validates, unescapes and
// copies. Invalid UTF-8, which encoding/json would replace by U+FFFD, is
// not ok: callers that need the replacement use RawString and
// AppendDecoded.
func (s *Scanner) AppendString(dst []byte) ([]byte, bool) {
	b := s.buf
	i, end := s.pos+1, -1
	for {
		j, ok := stringRun(b, i, &end, true)
		if !ok {
			return dst, false
		}
		dst = append(dst, b[i:j]...)
		if b[j] == '"' {
			s.pos = j + 1
			return dst, true
		}
		var n int
		if dst, n, ok = appendEscape(dst, b[j:]); !ok {
			return dst, false
		}
		i = j + n
	}
}

// Literal consumes word (true, false or null) at the cursor; like Number
// and Uint32 it reads from the cursor, so callers Peek first.
func (s *Scanner) Literal(word string) bool {
	if len(s.buf)-s.pos < len(word) || string(s.buf[s.pos:s.pos+len(word)]) != word {
		return false
	}
	s.pos += len(word)
	return true
}

// Number consumes a number at the cursor per the JSON grammar.
func (s *Scanner) Number() bool {
	b, i := s.buf, s.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	s.pos = i
	return true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// Uint32 consumes a number at the cursor that is a plain non-negative
// integer below 2^32. Anything else (a fraction, an exponent, a sign, a
// value out of range) is not ok and leaves the cursor where it was.
func (s *Scanner) Uint32() (uint32, bool) {
	b, i := s.buf, s.pos
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return 0, false
	}
	if b[i] == '0' {
		s.pos = i + 1
		return 0, true
	}
	var v uint64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		v = v*10 + uint64(b[i]-'0')
		if v > 1<<32-1 {
			return 0, false
		}
	}
	s.pos = i
	return uint32(v), true
}

// Skip consumes and validates any value that stands inside depth
// containers. A value nested deeper than the scanner's limit is not ok.
func (s *Scanner) Skip(depth int) bool {
	switch c := s.Peek(); c {
	case '{', '[':
		return s.skipContainer(depth)
	default:
		return s.scalar(c)
	}
}

// scalar consumes a string, number or literal starting with c.
func (s *Scanner) scalar(c byte) bool {
	switch c {
	case '"':
		_, _, ok := s.RawString()
		return ok
	case 't':
		return s.Literal("true")
	case 'f':
		return s.Literal("false")
	case 'n':
		return s.Literal("null")
	default:
		return s.Number()
	}
}

// skipContainer is Skip for an object or array, walked without recursion.
func (s *Scanner) skipContainer(depth int) bool {
	// open holds one bit per open container, 1 for an object: a stack
	// array for the usual nesting, grown on the heap beyond 1024 levels.
	open := make([]uint64, 0, 16)
	n := 0
	for {
		// A value.
		switch c := s.Peek(); {
		case c == '{' || c == '[':
			if depth+n >= s.maxDepth {
				return false
			}
			s.pos++
			if n/64 == len(open) {
				open = append(open, 0)
			}
			if c == '{' {
				open[n/64] |= 1 << (n % 64)
			} else {
				open[n/64] &^= 1 << (n % 64)
			}
			n++
			if s.Eat(c + 2) { // '}' or ']'
				n--
				break
			}
			if c == '{' && !s.key() {
				return false
			}
			continue
		default:
			if !s.scalar(c) {
				return false
			}
		}
		// After a value: close containers until one continues.
		for {
			if n == 0 {
				return true
			}
			obj := open[(n-1)/64]&(1<<((n-1)%64)) != 0
			c := s.Peek()
			if c == ',' {
				s.pos++
				if obj && !s.key() {
					return false
				}
				break
			}
			if (obj && c == '}') || (!obj && c == ']') {
				s.pos++
				n--
				continue
			}
			return false
		}
	}
}

// key consumes `"name":` inside an object that is only validated.
func (s *Scanner) key() bool {
	if s.Peek() != '"' {
		return false
	}
	if _, _, ok := s.RawString(); !ok {
		return false
	}
	return s.Eat(':')
}

// Key starts the next member of an object whose '{' has been consumed: it
// returns the key's raw bytes and whether they hold escapes, with the
// value next, or done at the closing '}'. first is true for the first
// call on an object.
func (s *Scanner) Key(first bool) (key []byte, esc, done, ok bool) {
	c := s.Peek()
	if c == '}' {
		s.pos++
		return nil, false, true, true
	}
	if !first {
		if c != ',' {
			return nil, false, false, false
		}
		s.pos++
		c = s.Peek()
	}
	if c != '"' {
		return nil, false, false, false
	}
	key, esc, ok = s.RawString()
	if !ok {
		return nil, false, false, false
	}
	return key, esc, false, s.Eat(':')
}

// Element starts the next element of an array whose '[' has been
// consumed, or reports done at the closing ']'.
func (s *Scanner) Element(first bool) (done, ok bool) {
	c := s.Peek()
	if c == ']' {
		s.pos++
		return true, true
	}
	if first {
		return false, true
	}
	if c != ',' {
		return false, false
	}
	s.pos++
	return false, true
}
