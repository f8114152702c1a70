package jsonscan

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// stringRun returns the index of the first '"' or '\\' in b at or after i,
// once it has checked the bytes before it with plainRun. Short runs (text
// dense with escapes) are walked byte by byte; long ones are found with
// bytes.IndexByte and checked in bulk. *end caches the first quote at or
// after an earlier i (-1 at first), so that a long string with many
// escapes is not searched to its end once per escape.
func stringRun(b []byte, i int, end *int, checkUTF8 bool) (int, bool) {
	var hi byte
	for k := i; k < i+32 && k < len(b); k++ {
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
// its length. It decodes like encoding/json: a \u surrogate pair is one
// rune, a surrogate without its pair is U+FFFD.
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

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// StringBody reports whether b is exactly the inside of a JSON string (no
// unescaped quote, no control byte, only complete escapes) and whether it
// has escapes. Like RawString it does not look at UTF-8. It walks byte by
// byte: it is for short strings (an answer's delta), where a bulk search
// costs more in calls than it saves.
func StringBody(b []byte) (esc, ok bool) {
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"' || c < 0x20:
			return false, false
		case c != '\\':
			i++
		default:
			n, ok := escapeLen(b[i:])
			if !ok {
				return false, false
			}
			esc = true
			i += n
		}
	}
	return esc, true
}

// AppendDecoded appends the value of body, the inside of a JSON string
// that StringBody or RawString accepted, decoded exactly as encoding/json
// decodes it: escapes unquoted (a surrogate without its pair is U+FFFD)
// and each byte of invalid UTF-8 replaced by U+FFFD. It reports false,
// with dst holding what was decoded so far, for a body that is not valid.
func AppendDecoded(dst, body []byte) ([]byte, bool) {
	for len(body) > 0 {
		i := bytes.IndexByte(body, '\\')
		run := body
		if i >= 0 {
			run = body[:i]
		}
		dst = appendValidUTF8(dst, run)
		if i < 0 {
			return dst, true
		}
		var n int
		var ok bool
		if dst, n, ok = appendEscape(dst, body[i:]); !ok {
			return dst, false
		}
		body = body[i+n:]
	}
	return dst, true
}

// appendValidUTF8 appends p with each byte that is not part of a valid
// UTF-8 sequence replaced by U+FFFD, as encoding/json does when it
// decodes a string.
func appendValidUTF8(dst, p []byte) []byte {
	if utf8.Valid(p) {
		return append(dst, p...)
	}
	start := 0
	for i := 0; i < len(p); {
		if p[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, p[start:i]...)
			dst = utf8.AppendRune(dst, utf8.RuneError)
			start = i + 1
		}
		i += n
	}
	return append(dst, p[start:]...)
}
