package prompt

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
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

// jsonScanner walks one JSON text. Every method that returns ok=false has
// either met invalid JSON or something it leaves to the reference; the
// caller then gives up on the whole body.
type jsonScanner struct {
	buf []byte
	pos int
}

// peek returns the next byte after whitespace, or 0 at the end (0 is
// invalid wherever a byte is expected, so callers need no length checks).
func (s *jsonScanner) peek() byte {
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

// eat consumes c, the next byte after whitespace.
func (s *jsonScanner) eat(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.pos++
	return true
}

// end reports whether only whitespace is left: encoding/json rejects
// anything after the top-level value.
func (s *jsonScanner) end() bool {
	return s.peek() == 0 && s.pos == len(s.buf)
}

// rawString consumes a string at s.pos (which holds '"') and returns the
// bytes between the quotes, whether they hold escapes, and whether the
// string is valid JSON. It does not look at UTF-8: encoding/json accepts
// invalid UTF-8 in strings (and replaces it when it decodes them), so this
// is for strings that are validated or copied raw, not decoded.
func (s *jsonScanner) rawString() (raw []byte, esc, ok bool) {
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

// stringRun returns the index of the first '"' or '\\' in b at or after i,
// once it has checked the bytes before it with plainRun. Short runs (text
// dense with escapes) are walked byte by byte; long ones are found with
// bytes.IndexByte and checked in bulk. *end caches the first quote at or
// after an earlier i (-1 at first), so that a long string with many
// escapes is not searched to its end once per escape.
func stringRun(b []byte, i int, end *int, checkUTF8 bool) (int, bool) {
	var hi byte
	for k := i; k < i+16 && k < len(b); k++ {
		switch c := b[k]; {
		case c == '"' || c == '\\':
			return k, !checkUTF8 || hi < utf8.RuneSelf || utf8.Valid(b[i:k])
		case c < 0x20:
			return 0, false
		default:
			hi |= c
		}
	}
	if *end < i {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		*end = i + q
	}
	j := *end
	if bs := bytes.IndexByte(b[i:j], '\\'); bs >= 0 {
		j = i + bs
	}
	return j, plainRun(b[i:j], checkUTF8)
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plainRun reports whether p, a run of string bytes without quotes or
// backslashes, is valid inside a JSON string: no control bytes, and with
// checkUTF8 valid UTF-8. Prompts are mostly long runs of plain ASCII, so
// it checks 32 bytes per step with SWAR arithmetic and only calls
// utf8.Valid for runs that have a non-ASCII byte.
func plainRun(p []byte, checkUTF8 bool) bool {
	// (w - 0x20 per byte) &^ w has a byte's high bit set if some byte
	// of w is below 0x20 (exact as to whether one is).
	const ctl = lsb * 0x20
	var hi uint64
	i := 0
	for ; i+32 <= len(p); i += 32 {
		w0 := binary.LittleEndian.Uint64(p[i:])
		w1 := binary.LittleEndian.Uint64(p[i+8:])
		w2 := binary.LittleEndian.Uint64(p[i+16:])
		w3 := binary.LittleEndian.Uint64(p[i+24:])
		if ((w0-ctl)&^w0|(w1-ctl)&^w1|(w2-ctl)&^w2|(w3-ctl)&^w3)&msb != 0 {
			return false
		}
		hi |= w0 | w1 | w2 | w3
	}
	for ; i+8 <= len(p); i += 8 {
		w := binary.LittleEndian.Uint64(p[i:])
		if (w-ctl)&^w&msb != 0 {
			return false
		}
		hi |= w
	}
	for ; i < len(p); i++ {
		if p[i] < 0x20 {
			return false
		}
		hi |= uint64(p[i])
	}
	return !checkUTF8 || hi&msb == 0 || utf8.Valid(p)
}

// escapeLen validates the escape at e[0] ('\\') and returns its length.
func escapeLen(e []byte) (int, bool) {
	if len(e) < 2 {
		return 0, false
	}
	switch e[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, true
	case 'u':
		_, ok := hex4(e[2:])
		return 6, ok
	}
	return 0, false
}

// appendEscape appends the value of the escape at e[0] ('\\') and returns
// its length. It decodes like unquote (and encoding/json): a \u surrogate
// pair is one rune, a surrogate without its pair is U+FFFD.
func appendEscape(dst, e []byte) ([]byte, int, bool) {
	if len(e) < 2 {
		return dst, 0, false
	}
	switch c := e[1]; c {
	case '"', '\\', '/':
		return append(dst, c), 2, true
	case 'b':
		return append(dst, '\b'), 2, true
	case 'f':
		return append(dst, '\f'), 2, true
	case 'n':
		return append(dst, '\n'), 2, true
	case 'r':
		return append(dst, '\r'), 2, true
	case 't':
		return append(dst, '\t'), 2, true
	case 'u':
		r, ok := hex4(e[2:])
		if !ok {
			return dst, 0, false
		}
		n := 6
		if utf16.IsSurrogate(r) {
			r2, ok := rune(0), false
			if len(e) >= 12 && e[6] == '\\' && e[7] == 'u' {
				r2, ok = hex4(e[8:])
			}
			if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
				r, n = dec, 12
			} else {
				r = utf8.RuneError
			}
		}
		return utf8.AppendRune(dst, r), n, true
	}
	return dst, 0, false
}

// appendString consumes a string and appends its value to dst, in one pass
// that validates, unescapes and copies. Invalid UTF-8, which encoding/json
// would replace by U+FFFD, is declined.
func (s *jsonScanner) appendString(dst []byte) ([]byte, bool) {
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

// stringValue consumes a string or null (which leaves a string field
// empty) and returns its value. The value aliases the body unless it had
// escapes, so it must be copied before it outlives the call.
func (s *jsonScanner) stringValue() ([]byte, bool) {
	switch s.peek() {
	case '"':
		start := s.pos
		raw, esc, ok := s.rawString()
		if !ok {
			return nil, false
		}
		if !esc {
			return raw, utf8.Valid(raw)
		}
		s.pos = start
		return s.appendString(nil)
	case 'n':
		return nil, s.literal("null")
	}
	return nil, false
}

// skipString consumes a string or null whose value is not used: it must be
// valid, and a string for encoding/json to accept it.
func (s *jsonScanner) skipString() bool {
	switch s.peek() {
	case '"':
		_, _, ok := s.rawString()
		return ok
	case 'n':
		return s.literal("null")
	}
	return false
}

// boolValue consumes true, false or null (which leaves a bool false).
func (s *jsonScanner) boolValue() (bool, bool) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	case 'n':
		return false, s.literal("null")
	}
	return false, false
}

func (s *jsonScanner) literal(word string) bool {
	if len(s.buf)-s.pos < len(word) || string(s.buf[s.pos:s.pos+len(word)]) != word {
		return false
	}
	s.pos += len(word)
	return true
}

// number consumes a number per the JSON grammar.
func (s *jsonScanner) number() bool {
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

// tokenID consumes a number that is a valid token id: a non-negative
// integer below 2^32. Anything else (a fraction, an exponent, "-0", an id
// out of range) is an error or a corner for the reference.
func (s *jsonScanner) tokenID() (uint32, bool) {
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

// skip consumes and validates any value, nested at depth.
func (s *jsonScanner) skip(depth int) bool {
	// open holds one bit per open container: 1 for an object.
	var open [maxScanDepth / 64]uint64
	n := 0
	for {
		// A value.
		switch c := s.peek(); {
		case c == '{' || c == '[':
			if depth+n >= maxScanDepth {
				return false
			}
			s.pos++
			if c == '{' {
				open[n/64] |= 1 << (n % 64)
			} else {
				open[n/64] &^= 1 << (n % 64)
			}
			n++
			if s.eat(c + 2) { // '}' or ']'
				n--
				break
			}
			if c == '{' && !s.key() {
				return false
			}
			continue
		case c == '"':
			if _, _, ok := s.rawString(); !ok {
				return false
			}
		case c == 't':
			if !s.literal("true") {
				return false
			}
		case c == 'f':
			if !s.literal("false") {
				return false
			}
		case c == 'n':
			if !s.literal("null") {
				return false
			}
		default:
			if !s.number() {
				return false
			}
		}
		// After a value: close containers until one continues.
		for {
			if n == 0 {
				return true
			}
			obj := open[(n-1)/64]&(1<<((n-1)%64)) != 0
			c := s.peek()
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
func (s *jsonScanner) key() bool {
	if s.peek() != '"' {
		return false
	}
	if _, _, ok := s.rawString(); !ok {
		return false
	}
	return s.eat(':')
}

// member starts the next member of an object whose '{' has been consumed:
// it returns the key, with the value next, or done at the closing '}'.
// first is true for the first call on an object. A key with escapes or
// non-ASCII bytes is not ok: encoding/json matches it after unquoting and
// Unicode case folding, which is the reference's business.
func (s *jsonScanner) member(first bool) (key []byte, done, ok bool) {
	c := s.peek()
	if c == '}' {
		s.pos++
		return nil, true, true
	}
	if !first {
		if c != ',' {
			return nil, false, false
		}
		s.pos++
		c = s.peek()
	}
	if c != '"' {
		return nil, false, false
	}
	key, esc, ok := s.rawString()
	if !ok || esc {
		return nil, false, false
	}
	for _, k := range key {
		if k >= utf8.RuneSelf {
			return nil, false, false
		}
	}
	return key, false, s.eat(':')
}

// element starts the next element of an array whose '[' has been consumed,
// or reports done at the closing ']'.
func (s *jsonScanner) element(first bool) (done, ok bool) {
	c := s.peek()
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

// unknown handles a key that is none of fields exactly. encoding/json
// would still bind it to a field that matches case-insensitively ("Model"
// sets model), so that case is declined; a truly unknown field is skipped
// after validation.
func (s *jsonScanner) unknown(key []byte, depth int, fields ...string) bool {
	for _, f := range fields {
		if asciiEqualFold(key, f) {
			return false
		}
	}
	return s.skip(depth)
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
	stream, includeUsage bool
}

// streamOptions consumes stream_options: an object or null.
func (s *jsonScanner) streamOptions(depth int) (includeUsage, ok bool) {
	switch s.peek() {
	case 'n':
		return false, s.literal("null")
	case '{':
		s.pos++
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
func (s *jsonScanner) common(key []byte, seen *uint32, t *topFields) (handled, ok bool) {
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
		if c := s.peek(); c != '-' && (c < '0' || c > '9') {
			return true, false
		}
		start := s.pos
		ok = s.number()
		t.room = s.buf[start:s.pos]
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
	}
}

// chatScan is the state of one scanChat.
type chatScan struct {
	jsonScanner
	// text is the rendering so far. Messages and tools are each rendered
	// into one region of it, in body order; tools are moved first at the end.
	text []byte
	// calls collects one message's tool calls, which render after its
	// content wherever they stand in the message object.
	calls []byte
}

var chatTopFields = []string{"model", "messages", "tools", "stream", "stream_options", "cache_salt", "prompt_cache_key", "bootstrap_room"}

// scanChat is RenderChat's fast path; ok=false means "ask RenderChatStd".
// It renders into buf when cap(buf) >= len(body) (RenderChatTo), else
// into a new array.
func scanChat(body, buf []byte) (Prompt, bool) {
	c := chatScan{jsonScanner: jsonScanner{buf: body}}
	if !c.eat('{') {
		return Prompt{}, false
	}
	var t topFields
	var seen uint32
	msgs, tools := [2]int{-1, -1}, [2]int{-1, -1}
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return Prompt{}, false
		}
		if done {
			break
		}
		handled, ok := c.common(key, &seen, &t)
		if handled {
			if !ok {
				return Prompt{}, false
			}
			continue
		}
		if c.text == nil && (string(key) == "messages" || string(key) == "tools") {
			// The rendering is about as long as the body: the content is
			// most of both. Sizing for it avoids regrowing a large text
			// several times.
			if cap(buf) >= len(body) {
				c.text = buf[:0]
			} else {
				c.text = make([]byte, 0, len(body)+64)
			}
		}
		switch string(key) {
		case "messages":
			if !once(&seen, 1<<4) {
				return Prompt{}, false
			}
			msgs[0] = len(c.text)
			if !c.messages() {
				return Prompt{}, false
			}
			msgs[1] = len(c.text)
		case "tools":
			if !once(&seen, 1<<5) {
				return Prompt{}, false
			}
			tools[0] = len(c.text)
			if !c.tools() {
				return Prompt{}, false
			}
			tools[1] = len(c.text)
		default:
			if !c.unknown(key, 1, chatTopFields...) {
				return Prompt{}, false
			}
		}
	}
	if !c.end() || len(t.model) == 0 || msgs[0] < 0 || msgs[0] == msgs[1] {
		return Prompt{}, false
	}
	text := c.text
	if tools[0] > msgs[0] && tools[1] > tools[0] {
		// Tools came after the messages in the body; they render first.
		// The two regions are adjacent, so rotate them.
		tl := bytes.Clone(text[tools[0]:tools[1]])
		copy(text[msgs[0]+len(tl):], text[msgs[0]:msgs[1]])
		copy(text[msgs[0]:], tl)
	}
	if cap(text) > 2*len(text)+4096 && buf == nil {
		// Mostly images or ignored fields: do not hold a body-sized
		// buffer for a short text (a lent buffer goes back anyway).
		text = bytes.Clone(text)
	}
	return t.prompt(true, text), true
}

// tools renders the tools array: each tool as its compacted JSON, as
// RenderChatStd does with the json.RawMessage.
func (c *chatScan) tools() bool {
	switch c.peek() {
	case 'n':
		return c.literal("null")
	case '[':
		c.pos++
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		c.peek()
		start := c.pos
		if !c.skip(2) {
			return false
		}
		c.text = append(c.text, recordSep)
		c.text = append(c.text, "tool"...)
		c.text = append(c.text, unitSep)
		c.text = appendCompactJSON(c.text, c.buf[start:c.pos])
	}
}

// messages renders the messages array. An empty or null one is an error,
// left to the reference.
func (c *chatScan) messages() bool {
	if !c.eat('[') {
		return false
	}
	for first := true; ; first = false {
		done, ok := c.element(first)
		if !ok || (done && first) {
			return false
		}
		if done {
			return true
		}
		if !c.message() {
			return false
		}
	}
}

var messageFields = []string{"role", "name", "content", "tool_calls", "tool_call_id"}

// message renders one message. Its fields may come in any order, so the
// content is rendered into text first and the header (role, name, tool
// call id) is slid in front of it once the object is complete.
func (c *chatScan) message() bool {
	if !c.eat('{') { // a null message has no role, which is an error
		return false
	}
	mark := len(c.text)
	c.calls = c.calls[:0]
	var role, name, callID []byte
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return false
		}
		if done {
			break
		}
		switch string(key) {
		case "role":
			ok = once(&seen, 1<<0)
			if ok {
				role, ok = c.stringValue()
			}
		case "name":
			ok = once(&seen, 1<<1)
			if ok {
				name, ok = c.stringValue()
			}
		case "tool_call_id":
			ok = once(&seen, 1<<2)
			if ok {
				callID, ok = c.stringValue()
			}
		case "content":
			ok = once(&seen, 1<<3) && c.content()
		case "tool_calls":
			ok = once(&seen, 1<<4) && c.toolCalls()
		default:
			ok = c.unknown(key, 3, messageFields...)
		}
		if !ok {
			return false
		}
	}
	if len(role) == 0 {
		return false
	}
	h := 2 + len(role)
	if len(name) > 0 {
		h += 1 + len(name)
	}
	if len(callID) > 0 {
		h += 1 + len(callID)
	}
	n := len(c.text)
	c.text = append(c.text, make([]byte, h)...)
	copy(c.text[mark+h:], c.text[mark:n])
	w := c.text[mark : mark+h]
	w[0] = recordSep
	i := 1 + copy(w[1:], role)
	if len(name) > 0 {
		w[i] = unitSep
		i += 1 + copy(w[i+1:], name)
	}
	if len(callID) > 0 {
		w[i] = unitSep
		i += 1 + copy(w[i+1:], callID)
	}
	w[i] = unitSep
	c.text = append(c.text, c.calls...)
	return true
}

// content renders a message's content like appendContent: a string as
// itself, null as nothing, an array part by part.
func (c *chatScan) content() bool {
	switch c.peek() {
	case '"':
		var ok bool
		c.text, ok = c.appendString(c.text)
		return ok
	case 'n':
		return c.literal("null")
	case '[':
		c.pos++
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		if !c.part() {
			return false
		}
	}
}

var partFields = []string{"type", "text"}

// part renders one content part: a text part as its text, any other as its
// type and the digest of its JSON. The type may follow the text, so the
// text is appended first and dropped if the part turns out not to be text.
func (c *chatScan) part() bool {
	c.peek()
	start := c.pos
	switch c.peek() {
	case 'n':
		// encoding/json decodes null into an empty part: no type, so a
		// digest of "null".
		if !c.literal("null") {
			return false
		}
		return c.partDigest(nil, start)
	case '{':
		c.pos++
	default:
		return false
	}
	mark := len(c.text)
	var typ []byte
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return false
		}
		if done {
			break
		}
		switch string(key) {
		case "type":
			ok = once(&seen, 1<<0)
			if ok {
				typ, ok = c.stringValue()
			}
		case "text":
			ok = once(&seen, 1<<1)
			if ok {
				switch c.peek() {
				case 'n':
					ok = c.literal("null")
				case '"':
					c.text, ok = c.appendString(c.text)
				default:
					ok = false
				}
			}
		default:
			ok = c.unknown(key, 5, partFields...)
		}
		if !ok {
			return false
		}
	}
	if string(typ) == "text" {
		return true
	}
	c.text = c.text[:mark]
	return c.partDigest(typ, start)
}

func (c *chatScan) partDigest(typ []byte, start int) bool {
	c.text = append(c.text, groupSep)
	c.text = append(c.text, typ...)
	c.text = append(c.text, unitSep)
	c.text = appendDigest(c.text, c.buf[start:c.pos])
	return true
}

var callFields = []string{"id", "type", "function"}

// toolCalls renders a message's tool calls into c.calls.
func (c *chatScan) toolCalls() bool {
	switch c.peek() {
	case 'n':
		return c.literal("null")
	case '[':
		c.pos++
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		if !c.toolCall() {
			return false
		}
	}
}

func (c *chatScan) toolCall() bool {
	var id, fname, args []byte
	switch c.peek() {
	case 'n': // an empty call, as encoding/json decodes it
		if !c.literal("null") {
			return false
		}
	case '{':
		c.pos++
		var seen uint32
		for first := true; ; first = false {
			key, done, ok := c.member(first)
			if !ok {
				return false
			}
			if done {
				break
			}
			switch string(key) {
			case "id":
				ok = once(&seen, 1<<0)
				if ok {
					id, ok = c.stringValue()
				}
			case "type":
				ok = once(&seen, 1<<1) && c.skipString()
			case "function":
				ok = once(&seen, 1<<2)
				if ok {
					fname, args, ok = c.function()
				}
			default:
				ok = c.unknown(key, 5, callFields...)
			}
			if !ok {
				return false
			}
		}
	default:
		return false
	}
	c.calls = append(c.calls, groupSep)
	c.calls = append(c.calls, "call"...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, id...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, fname...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, args...)
	return true
}

var functionFields = []string{"name", "arguments"}

func (c *chatScan) function() (name, args []byte, ok bool) {
	switch c.peek() {
	case 'n':
		return nil, nil, c.literal("null")
	case '{':
		c.pos++
	default:
		return nil, nil, false
	}
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return nil, nil, false
		}
		if done {
			return name, args, true
		}
		switch string(key) {
		case "name":
			ok = once(&seen, 1<<0)
			if ok {
				name, ok = c.stringValue()
			}
		case "arguments":
			ok = once(&seen, 1<<1)
			if ok {
				args, ok = c.stringValue()
			}
		default:
			ok = c.unknown(key, 6, functionFields...)
		}
		if !ok {
			return nil, nil, false
		}
	}
}

var completionTopFields = []string{"model", "prompt", "stream", "stream_options", "cache_salt", "prompt_cache_key", "bootstrap_room"}

// scanCompletion is RenderCompletion's fast path; ok=false means "ask
// renderCompletionStd".
func scanCompletion(body []byte) (Prompt, bool) {
	s := jsonScanner{buf: body}
	if !s.eat('{') {
		return Prompt{}, false
	}
	var t topFields
	var seen uint32
	var text []byte
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return Prompt{}, false
		}
		if done {
			break
		}
		handled, ok := s.common(key, &seen, &t)
		if handled {
			if !ok {
				return Prompt{}, false
			}
			continue
		}
		if string(key) == "prompt" {
			if !once(&seen, 1<<4) {
				return Prompt{}, false
			}
			if text, ok = s.prompt(); !ok {
				return Prompt{}, false
			}
			continue
		}
		if !s.unknown(key, 1, completionTopFields...) {
			return Prompt{}, false
		}
	}
	if !s.end() || len(t.model) == 0 || text == nil {
		return Prompt{}, false
	}
	return t.prompt(false, text), true
}

// prompt renders a completion prompt like renderPrompt: a string, the
// first string of a batch, token ids, or the first list of a batch of
// token ids. The result is never nil; every error is left to the reference.
func (s *jsonScanner) prompt() ([]byte, bool) {
	switch s.peek() {
	case '"':
		return s.appendString(make([]byte, 0, 64))
	case '[':
		s.pos++
	default:
		return nil, false
	}
	var text []byte
	var ok bool
	switch s.peek() {
	case '"':
		text, ok = s.appendString(make([]byte, 0, 64))
	case '[':
		s.pos++
		text, ok = s.tokenIDs()
	default:
		// The whole array is the token ids.
		return s.tokenIDs()
	}
	if !ok {
		return nil, false
	}
	// The rest of the batch is validated but does not route.
	for {
		done, ok := s.element(false)
		if !ok {
			return nil, false
		}
		if done {
			return text, true
		}
		if !s.skip(2) {
			return nil, false
		}
	}
}

// tokenIDs renders an array of token ids whose '[' has been consumed.
func (s *jsonScanner) tokenIDs() ([]byte, bool) {
	out := make([]byte, 0, 64)
	out = append(out, recordSep, 't')
	for first := true; ; first = false {
		done, ok := s.element(first)
		if !ok || (done && first) {
			return nil, false
		}
		if done {
			return out, true
		}
		s.peek()
		id, ok := s.tokenID()
		if !ok {
			return nil, false
		}
		out = binary.LittleEndian.AppendUint32(out, id)
	}
}
