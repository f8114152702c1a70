package prompt

import (
	"strconv"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// This file is the router's fast path for request bodies: one pass over the
// bytes that validates the JSON grammar and renders the prompt as it goes,
// without reflection, a separate validation pass or copies of the content.
//
// It is deliberately not a full reimplementation of encoding/json's rules.
// It handles the shapes clients send and returns ok=false ("not sure") for
// everything else, and RenderChat/RenderCompletion then ask the
// encoding/json reference. So it never has to reproduce an error, or the
// corners where encoding/json is surprising: keys that match a field only
// case-insensitively (or through escapes or non-ASCII folding), duplicate
// keys (which merge into the earlier value), invalid UTF-8 in a decoded
// string (replaced by U+FFFD), nulls where the reference keeps a zero value,
// nesting deeper than maxScanDepth, and every missing required field.
// Declining costs one extra parse of a body that is unusual or bad anyway;
// accepting wrongly would route differently from the definition, which
// FuzzRenderMatchesReference guards against.

// maxScanDepth bounds the nesting the scanner follows. encoding/json allows
// 10000 levels; deeper-than-this bodies are left to it to accept or reject.
const maxScanDepth = 1024

// scanner is jsonscan's tokenizer with the rendering's policy: what it
// is not sure encoding/json would decide the same way, it declines.
type scanner struct{ jsonscan.Scanner }

// member starts the next member of an object whose '{' has been consumed:
// it returns the key, with the value next, or done at the closing '}'.
// first is true for the first call on an object. A key with escapes or
// non-ASCII bytes is not ok: encoding/json matches it after unquoting and
// Unicode case folding, which is the reference's business.
func (s *scanner) member(first bool) (key []byte, done, ok bool) {
	key, esc, done, ok := s.Key(first)
	if !ok || done {
		return nil, done, ok
	}
	if esc {
		return nil, false, false
	}
	for _, k := range key {
		if k >= utf8.RuneSelf {
			return nil, false, false
		}
	}
	return key, false, true
}

// stringValue consumes a string or null (which leaves a string field
// empty) and returns its value. The value aliases the body unless it had
// escapes, so it must be copied before it outlives the call.
func (s *scanner) stringValue() ([]byte, bool) {
	switch s.Peek() {
	case '"':
		raw, esc, ok := s.RawString()
		if !ok || !utf8.Valid(raw) {
			return nil, false
		}
		if !esc {
			return raw, true
		}
		return jsonscan.AppendDecoded(nil, raw)
	case 'n':
		return nil, s.Literal("null")
	}
	return nil, false
}

// skipString consumes a string or null whose value is not used: it must be
// valid, and a string for encoding/json to accept it.
func (s *scanner) skipString() bool {
	switch s.Peek() {
	case '"':
		_, _, ok := s.RawString()
		return ok
	case 'n':
		return s.Literal("null")
	}
	return false
}

// boolValue consumes true, false or null (which leaves a bool false).
func (s *scanner) boolValue() (bool, bool) {
	switch s.Peek() {
	case 't':
		return true, s.Literal("true")
	case 'f':
		return false, s.Literal("false")
	case 'n':
		return false, s.Literal("null")
	}
	return false, false
}

// unknown handles a key that is none of fields exactly. encoding/json
// would still bind it to a field that matches case-insensitively ("Model"
// sets model), so that case is declined; a truly unknown field is skipped
// after validation.
func (s *scanner) unknown(key []byte, depth int, fields ...string) bool {
	for _, f := range fields {
		if asciiEqualFold(key, f) {
			return false
		}
	}
	return s.Skip(depth)
}

// asciiEqualFold is bytes.EqualFold for the ASCII keys member lets through,
// without converting f.
func asciiEqualFold(key []byte, f string) bool {
	if len(key) != len(f) {
		return false
	}
	for i, k := range key {
		if k|0x20 != f[i]|0x20 || (k|0x20 < 'a' || k|0x20 > 'z') && k != f[i] {
			return false
		}
	}
	return true
}

// once records that field bit has been seen in an object and declines the
// second time: encoding/json merges a duplicate into the earlier value (a
// null keeps it, a second array reuses the first one's elements), which is
// left to it.
func once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// topFields is what both request kinds share.
type topFields struct {
	model, salt          []byte
	cacheKey, room       []byte
	priority             []byte
	stream, includeUsage bool
	// caps: max_completion_tokens, max_tokens, max_output_tokens (firstCap).
	caps [3]int64
}

// streamOptions consumes stream_options: an object or null.
func (s *scanner) streamOptions(depth int) (includeUsage, ok bool) {
	switch s.Peek() {
	case 'n':
		return false, s.Literal("null")
	case '{':
		s.Next()
	default:
		return false, false
	}
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return false, false
		}
		if done {
			return includeUsage, true
		}
		switch string(key) {
		case "include_usage":
			if !once(&seen, 1) {
				return false, false
			}
			if includeUsage, ok = s.boolValue(); !ok {
				return false, false
			}
		default:
			if !s.unknown(key, depth+1, "include_usage") {
				return false, false
			}
		}
	}
}

// common consumes one of the top-level members both request kinds have,
// reporting handled=false for any other key.
func (s *scanner) common(key []byte, seen *uint32, t *topFields) (handled, ok bool) {
	switch string(key) {
	case "model":
		if !once(seen, 1<<0) {
			return true, false
		}
		t.model, ok = s.stringValue()
	case "cache_salt":
		if !once(seen, 1<<1) {
			return true, false
		}
		t.salt, ok = s.stringValue()
	case "stream":
		if !once(seen, 1<<2) {
			return true, false
		}
		t.stream, ok = s.boolValue()
	case "stream_options":
		if !once(seen, 1<<3) {
			return true, false
		}
		t.includeUsage, ok = s.streamOptions(1)
	case "prompt_cache_key":
		if !once(seen, 1<<8) {
			return true, false
		}
		t.cacheKey, ok = s.stringValue()
	case "bootstrap_room":
		// An integer, as SGLang sends it; anything else (null, a batch's
		// array) is left to the reference.
		if !once(seen, 1<<9) {
			return true, false
		}
		if c := s.Peek(); c != '-' && (c < '0' || c > '9') {
			return true, false
		}
		start := s.Pos()
		ok = s.Number()
		t.room = s.Since(start)
	case "priority":
		// A number, as vLLM reads it; anything else is left to the
		// reference.
		if !once(seen, 1<<10) {
			return true, false
		}
		if c := s.Peek(); c != '-' && (c < '0' || c > '9') {
			return true, false
		}
		start := s.Pos()
		ok = s.Number()
		t.priority = s.Since(start)
	case "max_completion_tokens", "max_tokens", "max_output_tokens":
		// A non-negative integer; anything else is left to the reference.
		i := 0
		switch string(key) {
		case "max_tokens":
			i = 1
		case "max_output_tokens":
			i = 2
		}
		if !once(seen, 1<<(11+i)) {
			return true, false
		}
		if c := s.Peek(); c < '0' || c > '9' {
			return true, false
		}
		start := s.Pos()
		if !s.Number() {
			return true, false
		}
		n, err := strconv.ParseInt(string(s.Since(start)), 10, 64)
		t.caps[i], ok = n, err == nil
	default:
		return false, false
	}
	return true, ok
}

func (t *topFields) prompt(chat bool, text []byte) Prompt {
	return Prompt{
		Model:         string(t.model),
		CacheSalt:     string(t.salt),
		Stream:        t.stream,
		IncludeUsage:  t.includeUsage,
		Text:          text,
		Chat:          chat,
		CacheKey:      string(t.cacheKey),
		BootstrapRoom: string(t.room),
		Priority:      string(t.priority),
		MaxTokens:     firstCap(t.caps[:]...),
	}
}
