package reply

import (
	"strconv"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

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
	out, f, _, _, ok := extractAnswerPart(dst, doc)
	return out, f.usage(), ok
}

// extractAnswerPart is extractAnswer that returns the usage field by
// field (for a stream's objects to merge) and the answer's one string,
// when exactly one string made it up (hasPart).
func extractAnswerPart(dst, doc []byte) (out []byte, u usageFields, part jsonString, hasPart, ok bool) {
	s := scanner{Scanner: jsonscan.New(doc, jsonscan.MaxDepth)}
	out, u, ok = s.extract(dst)
	return out, u, s.part, ok && s.parts == 1, ok
}

// extract reads the document's answer and usage. The usage object is
// the top-level "usage" (Chat Completions, Completions, and a whole
// Responses or Messages body, or Anthropic's message_delta event), else
// the one inside "response" (a Responses stream's response.completed
// event) or "message" (Anthropic's message_start event); where a
// document has several, the top level's fields override the others',
// "response"'s override "message"'s.
func (s *scanner) extract(dst []byte) (out []byte, u usageFields, ok bool) {
	base := len(dst)
	if s.Peek() != '{' {
		if !s.Skip(0) || !s.End() {
			return dst[:base], usageFields{}, false
		}
		return dst, usageFields{}, true
	}
	s.Next()
	var top, response, message usageFields
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return dst[:base], usageFields{}, false
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
				return dst[:base], usageFields{}, false
			}
		case keyIs(key, "usage"):
			if top, ok = s.usage(1); !ok {
				return dst[:base], usageFields{}, false
			}
		case keyIs(key, "response"):
			if response, ok = s.usageWithin(1); !ok {
				return dst[:base], usageFields{}, false
			}
		case keyIs(key, "message"):
			if message, ok = s.usageWithin(1); !ok {
				return dst[:base], usageFields{}, false
			}
		default:
			if !s.Skip(1) {
				return dst[:base], usageFields{}, false
			}
		}
	}
	if !s.End() {
		return dst[:base], usageFields{}, false
	}
	return dst, message.merge(response).merge(top), true
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

// stringBody reports whether b is exactly the inside of a JSON string:
// no unescaped quote, no control character, complete escapes.
func stringBody(b []byte) (jsonString, bool) {
	esc, ok := jsonscan.StringBody(b)
	return jsonString{raw: b, esc: esc}, ok
}
