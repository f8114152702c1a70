package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var validityCases = []string{
	`{"a":[1,-2.5e+3,true,false,null,"x\n\u00e9"],"b":{}}`,
	` [ ] `,
	`"\ud83d\ude00"`,
	"\"bad \xff utf8 is valid JSON\"",
	`0`, `-0`, `01`, `1.`, `-`, `1e`, `1E+2`, `.5`,
	`tru`, `nul`, `falsey`,
	`{"a":1,}`, `[1,]`, `{"a" 1}`, `{1:2}`, `{"a":1}{}`, `{"a":1} x`,
	`"\x"`, `"\u12"`, "\"a\x01\"", `"unterminated`,
	``, ` `,
	strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
	strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat("}", 100),
}

// checkSkip holds Skip on a whole text to json.Valid's judgement.
func checkSkip(t *testing.T, doc []byte) {
	t.Helper()
	s := New(doc, MaxDepth)
	got := s.Skip(0) && s.End()
	if want := json.Valid(doc); got != want {
		t.Fatalf("%.80q: Skip says valid=%v, json.Valid %v", doc, got, want)
	}
}

func TestSkipMatchesValid(t *testing.T) {
	for _, c := range validityCases {
		checkSkip(t, []byte(c))
	}
}

// TestSkipDepthLimit: a scanner declines nesting beyond its own limit,
// counting the containers around the value.
func TestSkipDepthLimit(t *testing.T) {
	doc := []byte(strings.Repeat("[", 10) + strings.Repeat("]", 10))
	for _, tc := range []struct {
		limit, depth int
		ok           bool
	}{{10, 0, true}, {9, 0, false}, {12, 2, true}, {12, 3, false}} {
		s := New(doc, tc.limit)
		if got := s.Skip(tc.depth); got != tc.ok {
			t.Errorf("limit %d depth %d: ok=%v, want %v", tc.limit, tc.depth, got, tc.ok)
		}
	}
}

// checkDecode holds the string primitives to encoding/json's decoding of
// the string whose inside is body.
func checkDecode(t *testing.T, body []byte) {
	t.Helper()
	quoted := append(append([]byte{'"'}, body...), '"')
	var want string
	wantOK := json.Unmarshal(quoted, &want) == nil
	esc, ok := StringBody(body)
	if ok != wantOK {
		t.Fatalf("%q: StringBody ok=%v, encoding/json %v", body, ok, wantOK)
	}
	s := New(quoted, MaxDepth)
	raw, rawEsc, rawOK := s.RawString()
	if whole := rawOK && s.End(); whole != ok || (ok && (!bytes.Equal(raw, body) || rawEsc != esc)) {
		t.Fatalf("%q: RawString %q esc=%v ok=%v, StringBody esc=%v ok=%v", body, raw, rawEsc, rawOK, esc, ok)
	}
	if !ok {
		return
	}
	if esc != bytes.ContainsRune(body, '\\') {
		t.Fatalf("%q: esc=%v", body, esc)
	}
	got, dok := AppendDecoded([]byte("kept:"), body)
	if !dok || string(got) != "kept:"+want {
		t.Fatalf("%q: AppendDecoded %q (ok=%v), want %q", body, got, dok, want)
	}
	s = New(quoted, MaxDepth)
	str, sok := s.AppendString(nil)
	if sok != utf8.Valid(body) || (sok && string(str) != want) {
		t.Fatalf("%q: AppendString %q ok=%v, want %q (declined only for invalid UTF-8)", body, str, sok, want)
	}
}

var stringCases = []string{
	"plain", "", `line\nbreak\ttab \"quoted\" back\\slash \/`, "emoji 😀 é \u2028",
	`\ud83d\ude00`, `\ud83d x`, `\u00E9`, `bad \ud800`, `\ud800\u0041`, `\ude00\ud83d`, `\ud83d\ud83d\ude00`,
	"bad \xff utf8", "truncated \xe4\xb8", "surrogate \xed\xa0\x80 bytes", "\xff\\n\xfe",
	`\x`, `\u12`, `\u12g4`, "\x01 control", `a"b`, `trailing\`,
	strings.Repeat("lorem ipsum ", 20) + `\n` + strings.Repeat("é", 40),
}

func TestDecodeMatchesEncodingJSON(t *testing.T) {
	for _, c := range stringCases {
		checkDecode(t, []byte(c))
	}
}

// TestKeyAndElement walks an object and an array member by member.
func TestKeyAndElement(t *testing.T) {
	s := New([]byte(` { "a" : [1, 2] , "b\u0063" : null } `), MaxDepth)
	if !s.Eat('{') {
		t.Fatal("no object")
	}
	var keys []string
	for first := true; ; first = false {
		key, esc, done, ok := s.Key(first)
		if !ok {
			t.Fatalf("key %d failed at %d", len(keys), s.Pos())
		}
		if done {
			break
		}
		keys = append(keys, string(key)+map[bool]string{true: "+esc"}[esc])
		if string(key) == "a" {
			if !s.Eat('[') {
				t.Fatal("no array")
			}
			n := 0
			for first := true; ; first = false {
				done, ok := s.Element(first)
				if !ok {
					t.Fatal("element failed")
				}
				if done {
					break
				}
				s.Peek() // Number reads at the cursor
				start := s.Pos()
				if !s.Number() {
					t.Fatal("number failed")
				}
				n++
				if got := string(s.Since(start)); got != []string{"1", "2"}[n-1] {
					t.Fatalf("element %d is %q", n, got)
				}
			}
			continue
		}
		if !s.Skip(1) {
			t.Fatal("skip failed")
		}
	}
	if strings.Join(keys, ",") != `a,b\u0063+esc` || !s.End() {
		t.Fatalf("keys %v, end %v", keys, s.End())
	}
}

func TestUint32(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{{"0", 0, true}, {"7,", 7, true}, {"4294967295", 1<<32 - 1, true}, {"4294967296", 0, false}, {"-1", 0, false}, {"x", 0, false}} {
		s := New([]byte(tc.in), MaxDepth)
		got, ok := s.Uint32()
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q: %d %v, want %d %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzSkip holds the validator to json.Valid.
func FuzzSkip(f *testing.F) {
	for _, c := range validityCases {
		if len(c) < 1000 {
			f.Add([]byte(c))
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkSkip(t, doc)
	})
}

// FuzzDecode holds the string primitives to encoding/json's decoding.
func FuzzDecode(f *testing.F) {
	for _, c := range stringCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecode(t, body)
	})
}
