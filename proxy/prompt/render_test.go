package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func chatBody(t testing.TB, msgs []map[string]any, extra map[string]any) []byte {
	t.Helper()
	req := map[string]any{"model": "m", "messages": msgs}
	for k, v := range extra {
		req[k] = v
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChatRenderingKeepsThePrefixProperty(t *testing.T) {
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100)
	convs := map[string][]map[string]any{
		"strings": {
			{"role": "system", "content": "You are terse. " + long},
			{"role": "user", "content": "hello " + long},
			{"role": "assistant", "content": "hi there " + long},
			{"role": "user", "content": "and now?"},
		},
		"parts and images": {
			{"role": "user", "content": []map[string]any{
				{"type": "text", "text": long},
				{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,AAAA"}},
			}},
			{"role": "assistant", "content": long},
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "more"}}},
		},
		"tools": {
			{"role": "user", "content": long},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{
				{"id": "c1", "type": "function", "function": map[string]any{"name": "f", "arguments": `{"x":1}`}},
			}},
			{"role": "tool", "tool_call_id": "c1", "content": "42"},
			{"role": "user", "name": "bob", "content": long},
		},
	}
	for name, msgs := range convs {
		t.Run(name, func(t *testing.T) {
			var prev []byte
			for k := 1; k <= len(msgs); k++ {
				p, err := RenderChat(chatBody(t, msgs[:k], nil))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasPrefix(p.Text, prev) {
					t.Fatalf("messages[:%d] does not render to a prefix of messages[:%d]", k-1, k)
				}
				prev = p.Text
			}
		})
	}
}

func TestAnswerIsThePrefixOfTheNextTurn(t *testing.T) {
	turn1 := []map[string]any{{"role": "user", "content": "question one"}}
	p1, err := RenderChat(chatBody(t, turn1, nil))
	if err != nil {
		t.Fatal(err)
	}
	answer := "answer one"
	turn2 := append(turn1, map[string]any{"role": "assistant", "content": answer}, map[string]any{"role": "user", "content": "q2"})
	p2, err := RenderChat(chatBody(t, turn2, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(p2.Text, p1.AppendAnswer(answer)) {
		t.Fatal("turn 2 does not start with turn 1 plus its answer")
	}
	c1, _ := RenderCompletion([]byte(`{"model":"m","prompt":"abc"}`))
	c2, _ := RenderCompletion([]byte(`{"model":"m","prompt":"abcdefghi"}`))
	if !bytes.HasPrefix(c2.Text, c1.AppendAnswer("def")) {
		t.Fatal("completion prompt + answer is not a prefix of the next prompt")
	}
}

func TestRenderDistinguishesWhatEnginesDistinguish(t *testing.T) {
	render := func(msgs []map[string]any) string {
		p, err := RenderChat(chatBody(t, msgs, nil))
		if err != nil {
			t.Fatal(err)
		}
		return string(p.Text)
	}
	img := func(url string) []map[string]any {
		return []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": url}}}}}
	}
	pairs := []struct {
		name string
		a, b []map[string]any
	}{
		{"role", []map[string]any{{"role": "user", "content": "x"}}, []map[string]any{{"role": "system", "content": "x"}}},
		{"split content", []map[string]any{{"role": "user", "content": "ab"}}, []map[string]any{{"role": "user", "content": "a"}, {"role": "user", "content": "b"}}},
		{"image", img("data:image/png;base64,AAAA"), img("data:image/png;base64,BBBB")},
		{"name", []map[string]any{{"role": "user", "name": "a", "content": "x"}}, []map[string]any{{"role": "user", "content": "x"}}},
	}
	for _, tc := range pairs {
		if render(tc.a) == render(tc.b) {
			t.Errorf("%s: different requests render the same", tc.name)
		}
	}
	// The same image sent again, spaced differently, must render the same:
	// the digest is of the compacted part.
	spaced, err := RenderChat([]byte(`{"model":"m","messages":[{"role":"user","content":[ { "image_url" : { "url" : "data:x" } , "type" : "image_url" } ]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(spaced.Text) != render(img("data:x")) {
		t.Error("the same image renders differently")
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name, body string
		chat       bool
	}{
		{"not json", `{"model":`, true},
		{"no model", `{"messages":[{"role":"user","content":"x"}]}`, true},
		{"no messages", `{"model":"m","messages":[]}`, true},
		{"bad content", `{"model":"m","messages":[{"role":"user","content":5}]}`, true},
		{"no role", `{"model":"m","messages":[{"content":"x"}]}`, true},
		{"completion no prompt", `{"model":"m"}`, false},
		{"completion bad prompt", `{"model":"m","prompt":{}}`, false},
		{"completion bad token", `{"model":"m","prompt":[-1]}`, false},
		{"completion empty batch", `{"model":"m","prompt":[]}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.chat {
				_, err = RenderChat([]byte(tc.body))
			} else {
				_, err = RenderCompletion([]byte(tc.body))
			}
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err = %v, want ErrBadRequest", err)
			}
		})
	}
}

func TestCompletionPromptForms(t *testing.T) {
	tests := []struct{ body, wantPrefix string }{
		{`{"model":"m","prompt":"hello"}`, "hello"},
		{`{"model":"m","prompt":["hello","other"]}`, "hello"},
		{`{"model":"m","prompt":[1,2,3]}`, "\x1et\x01\x00\x00\x00"},
		{`{"model":"m","prompt":[[1,2],[3]]}`, "\x1et\x01\x00\x00\x00\x02"},
	}
	for _, tc := range tests {
		p, err := RenderCompletion([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if !strings.HasPrefix(string(p.Text), tc.wantPrefix) {
			t.Errorf("%s: text %q", tc.body, p.Text)
		}
	}
}

func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"plain", "line\nbreak\ttab \"quoted\" back\\slash /", "emoji 😀 \u00e9 \u2028", "\x01 control", "surrogate \U0001F600 end", ""} {
		lit, _ := json.Marshal(s)
		var fast rawText
		if err := fast.UnmarshalJSON(lit); err != nil || string(fast) != s {
			t.Errorf("%q: got %q, %v", s, fast, err)
		}
	}
	for _, lit := range []string{`"\ud83d\ude00"`, `"\ud83d x"`, `"\u00E9"`, `"bad \ud800"`} {
		var want string
		json.Unmarshal([]byte(lit), &want)
		var fast rawText
		if err := fast.UnmarshalJSON([]byte(lit)); err != nil || string(fast) != want {
			t.Errorf("%s: got %q want %q (%v)", lit, fast, want, err)
		}
	}
}

// samePrompt reports how a and b differ, or "" if they are the same Prompt.
func samePrompt(a, b Prompt) string {
	switch {
	case a.Model != b.Model:
		return fmt.Sprintf("model %q vs %q", a.Model, b.Model)
	case a.CacheSalt != b.CacheSalt:
		return fmt.Sprintf("cache salt %q vs %q", a.CacheSalt, b.CacheSalt)
	case a.CacheKey != b.CacheKey || a.BootstrapRoom != b.BootstrapRoom || a.PreviousResponseID != b.PreviousResponseID:
		return fmt.Sprintf("keys %q/%q/%q vs %q/%q/%q", a.CacheKey, a.BootstrapRoom, a.PreviousResponseID, b.CacheKey, b.BootstrapRoom, b.PreviousResponseID)
	case a.Stream != b.Stream || a.IncludeUsage != b.IncludeUsage || a.Chat != b.Chat:
		return fmt.Sprintf("flags %v/%v/%v vs %v/%v/%v", a.Stream, a.IncludeUsage, a.Chat, b.Stream, b.IncludeUsage, b.Chat)
	case !bytes.Equal(a.Text, b.Text):
		return fmt.Sprintf("text %q vs %q", a.Text, b.Text)
	case a.Priority != b.Priority || a.MaxTokens != b.MaxTokens:
		return fmt.Sprintf("priority, max tokens %q/%d vs %q/%d", a.Priority, a.MaxTokens, b.Priority, b.MaxTokens)
	}
	return ""
}

type renderer struct {
	name        string
	fast        func([]byte) (Prompt, bool)
	public, std func([]byte) (Prompt, error)
}

var renderers = []renderer{
	{"chat", func(b []byte) (Prompt, bool) { return scanChat(b, nil) }, RenderChat, RenderChatStd},
	{"completion", scanCompletion, RenderCompletion, renderCompletionStd},
	// Chat into a lent buffer holding another request's bytes
	// (RenderChatTo); renderCases of chatCase run through it too.
	{"chat-lent", func(b []byte) (Prompt, bool) { return scanChat(b, dirtyBuf(len(b))) }, lentRenderChat, RenderChatStd},
}

// dirtyBuf is a lent buffer of capacity n full of another prompt's bytes.
func dirtyBuf(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "\x1e\x1fuser"[i%6]
	}
	return b[:min(n, 3)]
}

func lentRenderChat(b []byte) (Prompt, error) { return RenderChatTo(dirtyBuf(len(b)), b) }

// checkAgainstReference fails t if the scanner accepts what the reference
// rejects, renders differently, or the public function disagrees with the
// reference. It returns whether the scanner took the body and whether the
// reference accepted it.
func checkAgainstReference(t *testing.T, r renderer, body []byte) (fast, accepted bool) {
	t.Helper()
	want, wantErr := r.std(body)
	if wantErr != nil && !errors.Is(wantErr, ErrBadRequest) {
		t.Fatalf("%s: reference error %v does not wrap ErrBadRequest", r.name, wantErr)
	}
	got, fast := r.fast(body)
	if fast {
		if wantErr != nil {
			t.Fatalf("%s: scanner accepted %q, reference rejects it: %v", r.name, body, wantErr)
		}
		if d := samePrompt(got, want); d != "" {
			t.Fatalf("%s: scanner and reference differ on %q: %s", r.name, body, d)
		}
	}
	pub, pubErr := r.public(body)
	if (pubErr != nil) != (wantErr != nil) {
		t.Fatalf("%s: %q: error %v, reference %v", r.name, body, pubErr, wantErr)
	}
	if pubErr != nil && !errors.Is(pubErr, ErrBadRequest) {
		t.Fatalf("%s: error %v does not wrap ErrBadRequest", r.name, pubErr)
	}
	if d := samePrompt(pub, want); pubErr == nil && d != "" {
		t.Fatalf("%s: %q: %s", r.name, body, d)
	}
	return fast, wantErr == nil
}

var caseText = strings.Repeat("lorem ipsum dolor ", 40)

const (
	chatCase       = 0
	completionCase = 1
)

// renderCases are bodies with what the reference does with them. fast
// says whether the scanner must take the body itself (so the fast
// path is not silently always declining); ok is the reference's verdict.
var renderCases = []struct {
	name     string
	kind     int
	body     string
	fast, ok bool
}{
	{"plain", chatCase, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, true, true},
	{"long", chatCase, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + caseText + `"}]}`, true, true},
	{"content first", chatCase, `{"messages":[{"content":"x","name":"bob","role":"user"}],"model":"m"}`, true, true},
	{"whitespace", chatCase, " \r\n\t{ \"model\" : \"m\" , \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"x\" } ] } \n", true, true},
	{"escapes", chatCase, `{"model":"m\n","messages":[{"role":"us\"er","content":"a\nb\"c\\d\/e\b\f\r\t\u00e9\u20AC"}]}`, true, true},
	{"surrogate pair", chatCase, `{"model":"m","messages":[{"role":"user","content":"\ud83d\ude00 ok"}]}`, true, true},
	{"lone high surrogate", chatCase, `{"model":"m","messages":[{"role":"user","content":"a\ud83d b"}]}`, true, true},
	{"lone low surrogate", chatCase, `{"model":"m","messages":[{"role":"user","content":"a\ude00\ud83d"}]}`, true, true},
	{"two high surrogates", chatCase, `{"model":"m","messages":[{"role":"user","content":"\ud83d\ud83d\ude00"}]}`, true, true},
	{"surrogate then escape", chatCase, `{"model":"m","messages":[{"role":"\ud800\u0041","content":"x"}]}`, true, true},
	{"utf8 text", chatCase, `{"model":"模型","messages":[{"role":"user","content":"héllo 世界 😀 ` + "\ufffd" + `"}]}`, true, true},
	{"invalid utf8 in content", chatCase, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\xc3\"}]}", false, true},
	{"invalid utf8 in model", chatCase, "{\"model\":\"m\xed\xa0\x80\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false, true},
	{"invalid utf8 in unknown", chatCase, "{\"model\":\"m\",\"user\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", true, true},
	{"control char", chatCase, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\"}]}", false, false},
	{"bad escape", chatCase, `{"model":"m","messages":[{"role":"user","content":"\x"}]}`, false, false},
	{"short unicode escape", chatCase, `{"model":"m","messages":[{"role":"user","content":"\u12"}]}`, false, false},
	{"duplicate model", chatCase, `{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}`, false, true},
	{"duplicate model null", chatCase, `{"model":"a","model":null,"messages":[{"role":"user","content":"x"}]}`, false, true},
	{"duplicate messages", chatCase, `{"model":"m","messages":[{"role":"user","name":"n","content":"x"}],"messages":[{"role":"user","content":"y"}]}`, false, true},
	{"duplicate content", chatCase, `{"model":"m","messages":[{"role":"user","content":"x","content":null}]}`, false, true},
	{"case folded key", chatCase, `{"Model":"m","messages":[{"role":"user","content":"x"}]}`, false, true},
	{"case folded both", chatCase, `{"model":"a","MODEL":"b","messages":[{"ROLE":"user","content":"x"}]}`, false, true},
	{"kelvin fold", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false,"` + "\u017f" + `tream":true}`, false, true},
	{"escaped key", chatCase, `{"mod\u0065l":"m","messages":[{"role":"user","content":"x"}]}`, false, true},
	{"unknown fields", chatCase, `{"model":"m","temperature":0.7,"max_tokens":100,"stop":["a",null],"logit_bias":{"1":-1e5},"x":[[{}],true,false,-0.5E-3],"messages":[{"role":"user","content":"x","extra":{"a":[1,2]}}]}`, true, true},
	{"unknown bad number", chatCase, `{"model":"m","t":01,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"unknown bad number 2", chatCase, `{"model":"m","t":1.,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"unknown bad number 3", chatCase, `{"model":"m","t":-,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"unknown bad literal", chatCase, `{"model":"m","t":nul,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"unknown unclosed", chatCase, `{"model":"m","t":[1,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"deep unknown", chatCase, `{"model":"m","t":` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `,"messages":[{"role":"user","content":"x"}]}`, true, true},
	{"deeper than the scanner", chatCase, `{"model":"m","t":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `,"messages":[{"role":"user","content":"x"}]}`, false, true},
	{"deeper than encoding/json", chatCase, `{"model":"m","t":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"nulls", chatCase, `{"model":"m","cache_salt":null,"stream":null,"stream_options":null,"tools":null,"messages":[{"role":"user","name":null,"tool_call_id":null,"content":null,"tool_calls":null}]}`, true, true},
	{"null model", chatCase, `{"model":null,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"model number", chatCase, `{"model":5,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"stream string", chatCase, `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, false, false},
	{"stream options", chatCase, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"x":1},"cache_salt":"s","messages":[{"role":"user","content":"x"}]}`, true, true},
	{"messages object", chatCase, `{"model":"m","messages":{"role":"user"}}`, false, false},
	{"null message", chatCase, `{"model":"m","messages":[null]}`, false, false},
	{"no role", chatCase, `{"model":"m","messages":[{"role":"","content":"x"}]}`, false, false},
	{"trailing garbage", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}]}x`, false, false},
	{"two values", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}]}{}`, false, false},
	{"trailing comma", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"},]}`, false, false},
	{"trailing comma object", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}],}`, false, false},
	{"unterminated", chatCase, `{"model":"m","messages":[{"role":"user","content":"x`, false, false},
	{"top null", chatCase, `null`, false, false},
	{"top array", chatCase, `[]`, false, false},
	{"empty", chatCase, ``, false, false},
	{"content parts", chatCase, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\n"},{"text":"b","type":"text"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"image_url","text":"ignored","image_url":{ "url" : "data:x" }},null,{"type":"text"},{"type":"text","text":null},{}]}]}`, true, true},
	{"content empty parts", chatCase, `{"model":"m","messages":[{"role":"user","content":[]}]}`, true, true},
	{"content part string", chatCase, `{"model":"m","messages":[{"role":"user","content":["x"]}]}`, false, false},
	{"content part text number", chatCase, `{"model":"m","messages":[{"role":"user","content":[{"type":"image","text":5}]}]}`, false, false},
	{"content number", chatCase, `{"model":"m","messages":[{"role":"user","content":5}]}`, false, false},
	{"content object", chatCase, `{"model":"m","messages":[{"role":"user","content":{}}]}`, false, false},
	{"tool calls", chatCase, `{"model":"m","messages":[{"role":"user","content":"q"},{"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},null,{}],"role":"assistant","content":null},{"role":"tool","tool_call_id":"c1","content":"42"}]}`, true, true},
	{"tool call function null", chatCase, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":null}]}]}`, true, true},
	{"tool call bad type", chatCase, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":1}]}]}`, false, false},
	{"tools first", chatCase, `{"model":"m","tools":[{"type":"function","function":{ "name" : "f", "parameters" : {"type":"object"} }},"x",null,1.50],"messages":[{"role":"user","content":"x"}]}`, true, true},
	{"tools last", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":"y"}],"stream":true,"tools":[ {"type" : "function"} ]}`, true, true},
	{"tools empty", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]}`, true, true},
	{"tools object", chatCase, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`, false, false},
	{"client keys", chatCase, `{"model":"m","prompt_cache_key":"conv-1","bootstrap_room":-12e3,"messages":[{"role":"user","content":"x"}]}`, true, true},
	{"client keys null", chatCase, `{"model":"m","prompt_cache_key":null,"bootstrap_room":null,"messages":[{"role":"user","content":"x"}]}`, false, true},
	{"bootstrap room batch", chatCase, `{"model":"m","bootstrap_room":[1, 2],"messages":[{"role":"user","content":"x"}]}`, false, true},
	{"prompt cache key number", chatCase, `{"model":"m","prompt_cache_key":5,"messages":[{"role":"user","content":"x"}]}`, false, false},
	{"prompt cache key folded", chatCase, `{"model":"m","Prompt_Cache_Key":"k","messages":[{"role":"user","content":"x"}]}`, false, true},
	{"chat prompt is unknown", chatCase, `{"model":"m","prompt":5,"messages":[{"role":"user","content":"x"}]}`, true, true},

	{"string prompt", completionCase, `{"model":"m","prompt":"hello\u00e9"}`, true, true},
	{"empty prompt", completionCase, `{"model":"m","prompt":""}`, true, true},
	{"batch", completionCase, `{"model":"m","prompt":["a","b",5,{"x":[]}]}`, true, true},
	{"ids", completionCase, `{"model":"m","prompt":[1, 2 ,0,4294967295],"stream":true,"stream_options":{"include_usage":false}}`, true, true},
	{"id batch", completionCase, `{"model":"m","prompt":[[1,2],[3],"x"]}`, true, true},
	{"negative id", completionCase, `{"model":"m","prompt":[-1]}`, false, false},
	{"minus zero id", completionCase, `{"model":"m","prompt":[-0]}`, false, true},
	{"big id", completionCase, `{"model":"m","prompt":[4294967296]}`, false, false},
	{"huge id", completionCase, `{"model":"m","prompt":[99999999999999999999]}`, false, false},
	{"fraction id", completionCase, `{"model":"m","prompt":[1.0]}`, false, false},
	{"exponent id", completionCase, `{"model":"m","prompt":[1e2]}`, false, false},
	{"null id", completionCase, `{"model":"m","prompt":[1,null]}`, false, true},
	{"string after id", completionCase, `{"model":"m","prompt":[1,"a"]}`, false, false},
	{"nested too deeply", completionCase, `{"model":"m","prompt":[["a"]]}`, false, false},
	{"empty inner", completionCase, `{"model":"m","prompt":[[]]}`, false, false},
	{"empty batch", completionCase, `{"model":"m","prompt":[]}`, false, false},
	{"null prompt", completionCase, `{"model":"m","prompt":null}`, false, false},
	{"no prompt", completionCase, `{"model":"m"}`, false, false},
	{"object prompt", completionCase, `{"model":"m","prompt":{}}`, false, false},
	{"completion client keys", completionCase, `{"model":"m","prompt":"x","prompt_cache_key":"k\u00e9","bootstrap_room":7}`, true, true},
	{"completion messages unknown", completionCase, `{"model":"m","prompt":"x","messages":7}`, true, true},
	{"Prompt folded", completionCase, `{"model":"m","Prompt":"x"}`, false, true},
	{"invalid utf8 prompt", completionCase, "{\"model\":\"m\",\"prompt\":\"\xff\"}", false, true},
}

func TestRenderMatchesReference(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			fast, ok := checkAgainstReference(t, renderers[tc.kind], []byte(tc.body))
			if tc.kind == chatCase {
				lentFast, lentOK := checkAgainstReference(t, renderers[2], []byte(tc.body))
				if lentFast != fast || lentOK != ok {
					t.Errorf("lent buffer: fast=%v accepted=%v, without: fast=%v accepted=%v", lentFast, lentOK, fast, ok)
				}
			}
			if ok != tc.ok {
				t.Errorf("reference accepted=%v, want %v", ok, tc.ok)
			}
			if fast != tc.fast {
				t.Errorf("fast path taken=%v, want %v", fast, tc.fast)
			}
		})
	}
}

// TestPriority: the body's priority is read as vLLM sends it, by the
// scanner and the reference alike (it is not part of the rendering: the
// pinned digest does not cover it).
func TestPriority(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","priority":-1,"messages":[{"role":"user","content":"x"}]}`:             "-1",
		`{"model":"m","priority":null,"messages":[{"role":"user","content":"x"}]}`:           "",
		`{"model":"m","priority":"high","messages":[{"role":"user","content":"x"}]}`:         `"high"`,
		`{"model":"m","priority":1,"Priority":2,"messages":[{"role":"user","content":"x"}]}`: "2",
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`:                           "",
	} {
		p, err := RenderChat([]byte(body))
		ref, refErr := RenderChatStd([]byte(body))
		if err != nil || refErr != nil || p.Priority != want || ref.Priority != want {
			t.Errorf("%s: priority %q (%v), reference %q (%v), want %q", body, p.Priority, err, ref.Priority, refErr, want)
		}
	}
	p, err := RenderCompletion([]byte(`{"model":"m","prompt":"x","priority": 7}`))
	if err != nil || p.Priority != "7" {
		t.Errorf("completion: priority %q (%v), want 7", p.Priority, err)
	}
}

// TestMaxTokens: the output cap is read by the scanner and the reference
// alike, max_completion_tokens first, then max_tokens, then
// max_output_tokens; what is not a non-negative integer is no cap.
func TestMaxTokens(t *testing.T) {
	for _, body := range maxTokensBodies {
		for _, r := range renderers {
			checkAgainstReference(t, r, []byte(body))
		}
	}
	for body, want := range map[string]int64{
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"x"}]}`:                            64,
		`{"model":"m","max_tokens":64,"max_completion_tokens":32,"messages":[{"role":"user","content":"x"}]}`: 32,
		`{"model":"m","max_completion_tokens":0,"max_tokens":9,"messages":[{"role":"user","content":"x"}]}`:   9,
		`{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"x"}]}`:                          0,
		`{"model":"m","max_tokens":-3,"messages":[{"role":"user","content":"x"}]}`:                            0,
		`{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}`:                           0,
		`{"model":"m","Max_Tokens":12,"messages":[{"role":"user","content":"x"}]}`:                            12,
		`{"model":"m","max_tokens":1,"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`:              2,
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`:                                            0,
	} {
		p, err := RenderChat([]byte(body))
		ref, refErr := RenderChatStd([]byte(body))
		if err != nil || refErr != nil || p.MaxTokens != want || ref.MaxTokens != want {
			t.Errorf("%s: max tokens %d (%v), reference %d (%v), want %d", body, p.MaxTokens, err, ref.MaxTokens, refErr, want)
		}
	}
	p, err := RenderCompletion([]byte(`{"model":"m","prompt":"x","max_tokens": 7}`))
	if err != nil || p.MaxTokens != 7 {
		t.Errorf("completion: max tokens %d (%v), want 7", p.MaxTokens, err)
	}
	p, err = RenderResponses([]byte(`{"model":"m","input":"x","max_output_tokens": 5}`))
	if err != nil || p.MaxTokens != 5 {
		t.Errorf("responses: max tokens %d (%v), want 5", p.MaxTokens, err)
	}
}

// maxTokensBodies seed the reference checks with output caps (they are
// not renderCases, whose rendering is pinned: a cap renders nothing).
var maxTokensBodies = []string{
	`{"model":"m","max_tokens":64,"max_completion_tokens":32,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","max_tokens":null,"prompt":"x"}`,
	`{"model":"m","max_output_tokens":9,"input":"x","max_tokens":99999999999999999999}`,
}
