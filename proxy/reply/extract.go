package reply

import (
	"strconv"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// Usage is what the router reads of an OpenAI usage object.
type Usage struct {
	// Present reports that the document had a usage object.
	Present bool
	// PromptTokens is usage.prompt_tokens (0 when absent or not an integer).
	PromptTokens int64
	// CompletionTokens is usage.completion_tokens (0 when absent or not an
	// integer): what a tenant's output budget is charged, and where the
	// answer's blocks end in the engine's cache.
	CompletionTokens int64
	// HasCached reports that usage.prompt_tokens_details.cached_tokens is
	// an integer, CachedTokens.
	HasCached    bool
	CachedTokens int64
}

// extractAnswer reads one response document (an SSE chunk's data or a
// whole non-streaming body) without decoding it into Go values. It
// appends to dst the answer text of the choices with index 0 (absent or
// null counts as 0) and returns the usage. A choice's text is the string
// delta.content, else message.content, else text. Keys match exactly;
// with duplicate keys the last wins, as with encoding/json into a map.
// ok is false, and dst unchanged, when doc is not valid JSON (exactly
// json.Valid's judgement); a valid document that is not an object yields
// nothing. Strings without escapes that are valid UTF-8 are copied as they
// are; the others are decoded by jsonscan.AppendDecoded, so the text is
// always what encoding/json would decode.
func extractAnswer(dst, doc []byte) (out []byte, u Usage, ok bool) {
	out, u, _, _, ok = extractAnswerPart(dst, doc)
	return out, u, ok
}

// extractAnswerPart is extractAnswer that also returns the answer's one
// string, when exactly one string made it up (hasPart).
func extractAnswerPart(dst, doc []byte) (out []byte, u Usage, part jsonString, hasPart, ok bool) {
	s := scanner{Scanner: jsonscan.New(doc, jsonscan.MaxDepth)}
	out, u, ok = s.extract(dst)
	return out, u, s.part, ok && s.parts == 1, ok
}

func (s *scanner) extract(dst []byte) (out []byte, u Usage, ok bool) {
	base := len(dst)
	if s.Peek() != '{' {
		if !s.Skip(0) || !s.End() {
			return dst[:base], Usage{}, false
		}
		return dst, Usage{}, true
	}
	s.Next()
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return dst[:base], Usage{}, false
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
				return dst[:base], Usage{}, false
			}
		case keyIs(key, "usage"):
			if u, ok = s.usage(); !ok {
				return dst[:base], Usage{}, false
			}
		default:
			if !s.Skip(1) {
				return dst[:base], Usage{}, false
			}
		}
	}
	if !s.End() {
		return dst[:base], Usage{}, false
	}
	return dst, u, true
}

// scanner walks a JSON document, validating as it goes, and remembers the
// strings that made up the answer: how many, and the last one.
type scanner struct {
	jsonscan.Scanner
	parts int
	part  jsonString
}

// member reads the next "key": of an object whose '{' was consumed
// (first: no comma before it). done reports the closing '}'.
func (s *scanner) member(first bool) (key jsonString, done, ok bool) {
	raw, esc, done, ok := s.Key(first)
	return jsonString{raw: raw, esc: esc}, done, ok
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
	at := s.Pos() + 1
	raw, esc, ok := s.RawString()
	return jsonString{raw: raw, esc: esc, at: at}, ok
}

// appendText appends the decoded string, as encoding/json decodes it.
// Most answer strings are short, plain and valid UTF-8: copied at once.
func (t jsonString) appendText(dst []byte) []byte {
	if !t.esc && utf8.Valid(t.raw) {
		return append(dst, t.raw...)
	}
	out, _ := jsonscan.AppendDecoded(dst, t.raw) // str validated the token
	return out
}

// keyIs compares a key with a plain ASCII name.
func keyIs(k jsonString, name string) bool {
	if !k.esc {
		return string(k.raw) == name
	}
	return string(k.appendText(nil)) == name
}

// intValue reads a value that should be an integer: ok reports validity,
// isInt whether it was an integer literal that fits an int64.
func (s *scanner) intValue(depth int) (v int64, isInt, ok bool) {
	c := s.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.Skip(depth)
	}
	start := s.Pos()
	if !s.Number() {
		return 0, false, false
	}
	v, err := strconv.ParseInt(string(s.Since(start)), 10, 64)
	return v, err == nil, true
}

// stringValue reads a value that should be a string: str is set when it
// is one.
func (s *scanner) stringValue(depth int) (str jsonString, isStr, ok bool) {
	if s.Peek() != '"' {
		return str, false, s.Skip(depth)
	}
	str, ok = s.str()
	return str, ok, ok
}

// choices reads the value of "choices" (top level, depth 1) and appends
// the text of its index-0 choices.
func (s *scanner) choices(dst []byte) ([]byte, bool) {
	if s.Peek() != '[' {
		return dst, s.Skip(1)
	}
	s.Next()
	for first := true; ; first = false {
		done, ok := s.Element(first)
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
	if s.Peek() != '{' {
		return dst, s.Skip(depth)
	}
	s.Next()
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
			if s.Peek() == 'n' {
				if !s.Literal("null") {
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
			if !s.Skip(depth + 1) {
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
	if s.Peek() != '{' {
		return c, false, s.Skip(depth)
	}
	s.Next()
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
		if !s.Skip(depth + 1) {
			return c, false, false
		}
	}
}

// usage reads the value of "usage" (depth 1).
func (s *scanner) usage() (Usage, bool) {
	const depth = 1
	var u Usage
	if s.Peek() != '{' {
		return u, s.Skip(depth)
	}
	s.Next()
	u.Present = true
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
			u.PromptTokens = 0
			if isInt {
				u.PromptTokens = v
			}
		case keyIs(key, "completion_tokens"):
			v, isInt, ok := s.intValue(depth + 1)
			if !ok {
				return u, false
			}
			u.CompletionTokens = 0
			if isInt {
				u.CompletionTokens = v
			}
		case keyIs(key, "prompt_tokens_details"):
			if u.CachedTokens, u.HasCached, ok = s.details(depth + 1); !ok {
				return u, false
			}
		default:
			if !s.Skip(depth + 1) {
				return u, false
			}
		}
	}
}

// details reads prompt_tokens_details and returns its integer
// cached_tokens, if any.
func (s *scanner) details(depth int) (cached int64, has, ok bool) {
	if s.Peek() != '{' {
		return 0, false, s.Skip(depth)
	}
	s.Next()
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
		if !s.Skip(depth + 1) {
			return 0, false, false
		}
	}
}

// stringBody reports whether b is exactly the inside of a JSON string:
// no unescaped quote, no control character, complete escapes.
func stringBody(b []byte) (jsonString, bool) {
	esc, ok := jsonscan.StringBody(b)
	return jsonString{raw: b, esc: esc}, ok
}
