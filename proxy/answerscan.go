package proxy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// answerUsage is what the router reads of an OpenAI usage object.
type answerUsage struct {
	present      bool  // the document had a usage object
	promptTokens int64 // usage.prompt_tokens (0 when absent or not an integer)
	hasCached    bool  // usage.prompt_tokens_details.cached_tokens is an integer
	cachedTokens int64
}

// maxJSONDepth is encoding/json's nesting limit; deeper documents are
// invalid for both.
const maxJSONDepth = 10000

// extractAnswer reads one response document (an SSE chunk's data or a
// whole non-streaming body) without decoding it into Go values. It
// appends to dst the answer text of the choices with index 0 (absent or
// null counts as 0) and returns the usage. A choice's text is the string
// delta.content, else message.content, else text. Keys match exactly;
// with duplicate keys the last wins, as with encoding/json into a map.
// ok is false, and dst unchanged, when doc is not valid JSON (exactly
// json.Valid's judgement); a valid document that is not an object yields
// nothing. Strings without escapes that are valid UTF-8 are copied as they
// are; the rare others are unquoted by encoding/json, so the text is
// always what encoding/json would decode.
func extractAnswer(dst, doc []byte) (out []byte, u answerUsage, ok bool) {
	out, u, _, _, ok = extractAnswerPart(dst, doc)
	return out, u, ok
}

// extractAnswerPart is extractAnswer that also returns the answer's one
// string, when exactly one string made it up (hasPart).
func extractAnswerPart(dst, doc []byte) (out []byte, u answerUsage, part jsonString, hasPart, ok bool) {
	s := scanner{b: doc}
	out, u, ok = s.extract(dst)
	return out, u, s.part, ok && s.parts == 1, ok
}

func (s *scanner) extract(dst []byte) (out []byte, u answerUsage, ok bool) {
	base := len(dst)
	s.ws()
	if s.peek() != '{' {
		if !s.value(0) || !s.end() {
			return dst[:base], answerUsage{}, false
		}
		return dst, answerUsage{}, true
	}
	s.i++
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return dst[:base], answerUsage{}, false
		}
		if done {
			break
		}
		switch {
		case keyIs(key, "choices"):
			// A later "choices" replaces an earlier one.
			dst = dst[:base]
			s.parts = 0
			if dst, ok = s.choices(dst); !ok {
				return dst[:base], answerUsage{}, false
			}
		case keyIs(key, "usage"):
			if u, ok = s.usage(); !ok {
				return dst[:base], answerUsage{}, false
			}
		default:
			if !s.value(1) {
				return dst[:base], answerUsage{}, false
			}
		}
	}
	if !s.end() {
		return dst[:base], answerUsage{}, false
	}
	return dst, u, true
}

// scanner walks a JSON document, validating as it goes.
type scanner struct {
	b []byte
	i int
	// The strings that made up the answer: how many, and the last one.
	parts int
	part  jsonString
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end reports whether only whitespace is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// member reads the next "key": of an object whose '{' was consumed
// (first: no comma before it). done reports the closing '}'.
func (s *scanner) member(first bool) (key jsonString, done, ok bool) {
	s.ws()
	c := s.peek()
	if c == '}' && first {
		s.i++
		return key, true, true
	}
	if !first {
		if c == '}' {
			s.i++
			return key, true, true
		}
		if c != ',' {
			return key, false, false
		}
		s.i++
		s.ws()
	}
	if key, ok = s.str(); !ok {
		return key, false, false
	}
	s.ws()
	if s.peek() != ':' {
		return key, false, false
	}
	s.i++
	s.ws()
	return key, false, true
}

// element prepares the next element of an array whose '[' was consumed.
// done reports the closing ']'.
func (s *scanner) element(first bool) (done, ok bool) {
	s.ws()
	c := s.peek()
	if c == ']' {
		s.i++
		return true, true
	}
	if !first {
		if c != ',' {
			return false, false
		}
		s.i++
		s.ws()
	}
	return false, true
}

// jsonString is a string token: its raw bytes between the quotes and
// whether it has escapes.
type jsonString struct {
	raw []byte
	esc bool
	at  int // index of raw in the document
}

// str reads a string token at the cursor.
func (s *scanner) str() (jsonString, bool) {
	if s.peek() != '"' {
		return jsonString{}, false
	}
	s.i++
	start := s.i
	esc := false
	for s.i < len(s.b) {
		// Skip the plain run quickly.
		j := s.i
		for j < len(s.b) {
			c := s.b[j]
			if c == '"' || c == '\\' || c < 0x20 {
				break
			}
			j++
		}
		s.i = j
		if j == len(s.b) {
			return jsonString{}, false
		}
		switch c := s.b[j]; {
		case c == '"':
			s.i++
			return jsonString{raw: s.b[start:j], esc: esc, at: start}, true
		case c < 0x20:
			return jsonString{}, false
		default: // backslash
			esc = true
			if j+1 >= len(s.b) {
				return jsonString{}, false
			}
			switch s.b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i = j + 2
			case 'u':
				if j+6 > len(s.b) {
					return jsonString{}, false
				}
				for _, h := range s.b[j+2 : j+6] {
					if !isHex(h) {
						return jsonString{}, false
					}
				}
				s.i = j + 6
			default:
				return jsonString{}, false
			}
		}
	}
	return jsonString{}, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// appendText appends the decoded string. The fast path copies the bytes;
// escapes and invalid UTF-8 go through encoding/json, whose unquoting
// (surrogates, U+FFFD replacement) is the reference.
func (t jsonString) appendText(dst []byte) []byte {
	if !t.esc && utf8.Valid(t.raw) {
		return append(dst, t.raw...)
	}
	q := make([]byte, 0, len(t.raw)+2)
	q = append(append(append(q, '"'), t.raw...), '"')
	var v string
	if json.Unmarshal(q, &v) != nil {
		return dst // cannot happen: str validated the token
	}
	return append(dst, v...)
}

// keyIs compares a key with a plain ASCII name.
func keyIs(k jsonString, name string) bool {
	if !k.esc {
		return string(k.raw) == name
	}
	return string(k.appendText(nil)) == name
}

// number reads a number token and returns its literal.
func (s *scanner) number() ([]byte, bool) {
	start := s.i
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case '1' <= c && c <= '9':
		s.i = digits(s.b, s.i)
	default:
		return nil, false
	}
	if s.peek() == '.' {
		s.i++
		j := digits(s.b, s.i)
		if j == s.i {
			return nil, false
		}
		s.i = j
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		j := digits(s.b, s.i)
		if j == s.i {
			return nil, false
		}
		s.i = j
	}
	return s.b[start:s.i], true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

func (s *scanner) literal(w string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(w)) {
		return false
	}
	s.i += len(w)
	return true
}

// value validates and skips one value at nesting depth (the number of
// containers around it).
func (s *scanner) value(depth int) bool {
	s.ws()
	switch c := s.peek(); c {
	case '{':
		if depth+1 > maxJSONDepth {
			return false
		}
		s.i++
		for first := true; ; first = false {
			_, done, ok := s.member(first)
			if !ok {
				return false
			}
			if done {
				return true
			}
			if !s.value(depth + 1) {
				return false
			}
		}
	case '[':
		if depth+1 > maxJSONDepth {
			return false
		}
		s.i++
		for first := true; ; first = false {
			done, ok := s.element(first)
			if !ok {
				return false
			}
			if done {
				return true
			}
			if !s.value(depth + 1) {
				return false
			}
		}
	case '"':
		_, ok := s.str()
		return ok
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		_, ok := s.number()
		return ok
	}
}

// intValue reads a value that should be an integer: ok reports validity,
// isInt whether it was an integer literal that fits an int64.
func (s *scanner) intValue(depth int) (v int64, isInt, ok bool) {
	s.ws()
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.value(depth)
	}
	lit, ok := s.number()
	if !ok {
		return 0, false, false
	}
	v, err := strconv.ParseInt(string(lit), 10, 64)
	return v, err == nil, true
}

// stringValue reads a value that should be a string: str is set when it
// is one.
func (s *scanner) stringValue(depth int) (str jsonString, isStr, ok bool) {
	s.ws()
	if s.peek() != '"' {
		return str, false, s.value(depth)
	}
	str, ok = s.str()
	return str, ok, ok
}

// choices reads the value of "choices" (top level, depth 1) and appends
// the text of its index-0 choices.
func (s *scanner) choices(dst []byte) ([]byte, bool) {
	s.ws()
	if s.peek() != '[' {
		return dst, s.value(1)
	}
	s.i++
	for first := true; ; first = false {
		done, ok := s.element(first)
		if !ok {
			return dst, false
		}
		if done {
			return dst, true
		}
		if dst, ok = s.choice(dst); !ok {
			return dst, false
		}
	}
}

// choice reads one element of choices (depth 2).
func (s *scanner) choice(dst []byte) ([]byte, bool) {
	const depth = 2
	s.ws()
	if s.peek() != '{' {
		return dst, s.value(depth)
	}
	s.i++
	zero := true // index absent or null counts as 0
	var delta, message, text jsonString
	var hasDelta, hasMessage, hasText bool
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return dst, false
		}
		if done {
			break
		}
		switch {
		case keyIs(key, "index"):
			if s.peek() == 'n' {
				if !s.literal("null") {
					return dst, false
				}
				zero = true
				continue
			}
			v, isInt, ok := s.intValue(depth + 1)
			if !ok {
				return dst, false
			}
			zero = isInt && v == 0
		case keyIs(key, "delta"):
			if delta, hasDelta, ok = s.content(depth + 1); !ok {
				return dst, false
			}
		case keyIs(key, "message"):
			if message, hasMessage, ok = s.content(depth + 1); !ok {
				return dst, false
			}
		case keyIs(key, "text"):
			if text, hasText, ok = s.stringValue(depth + 1); !ok {
				return dst, false
			}
		default:
			if !s.value(depth + 1) {
				return dst, false
			}
		}
	}
	if !zero {
		return dst, true
	}
	var part jsonString
	switch {
	case hasDelta:
		part = delta
	case hasMessage:
		part = message
	case hasText:
		part = text
	default:
		return dst, true
	}
	s.parts++
	s.part = part
	return part.appendText(dst), true
}

// content reads a delta or message value and returns its string
// "content", if it is an object that has one.
func (s *scanner) content(depth int) (c jsonString, has, ok bool) {
	s.ws()
	if s.peek() != '{' {
		return c, false, s.value(depth)
	}
	s.i++
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return c, false, false
		}
		if done {
			return c, has, true
		}
		if keyIs(key, "content") {
			if c, has, ok = s.stringValue(depth + 1); !ok {
				return c, false, false
			}
			continue
		}
		if !s.value(depth + 1) {
			return c, false, false
		}
	}
}

// usage reads the value of "usage" (depth 1).
func (s *scanner) usage() (answerUsage, bool) {
	const depth = 1
	var u answerUsage
	s.ws()
	if s.peek() != '{' {
		return u, s.value(depth)
	}
	s.i++
	u.present = true
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return u, false
		}
		if done {
			return u, true
		}
		switch {
		case keyIs(key, "prompt_tokens"):
			v, isInt, ok := s.intValue(depth + 1)
			if !ok {
				return u, false
			}
			u.promptTokens = 0
			if isInt {
				u.promptTokens = v
			}
		case keyIs(key, "prompt_tokens_details"):
			if u.cachedTokens, u.hasCached, ok = s.details(depth + 1); !ok {
				return u, false
			}
		default:
			if !s.value(depth + 1) {
				return u, false
			}
		}
	}
}

// details reads prompt_tokens_details and returns its integer
// cached_tokens, if any.
func (s *scanner) details(depth int) (cached int64, has, ok bool) {
	s.ws()
	if s.peek() != '{' {
		return 0, false, s.value(depth)
	}
	s.i++
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return 0, false, false
		}
		if done {
			return cached, has, true
		}
		if keyIs(key, "cached_tokens") {
			if cached, has, ok = s.intValue(depth + 1); !ok {
				return 0, false, false
			}
			if !has {
				cached = 0
			}
			continue
		}
		if !s.value(depth + 1) {
			return 0, false, false
		}
	}
}

// stringBody reports whether b is exactly the inside of a JSON string:
// no unescaped quote, no control character, complete escapes.
func stringBody(b []byte) (jsonString, bool) {
	esc := false
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"' || c < 0x20:
			return jsonString{}, false
		case c != '\\':
			i++
		case i+1 >= len(b):
			return jsonString{}, false
		default:
			esc = true
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return jsonString{}, false
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return jsonString{}, false
					}
				}
				i += 6
			default:
				return jsonString{}, false
			}
		}
	}
	return jsonString{raw: b, esc: esc}, true
}
