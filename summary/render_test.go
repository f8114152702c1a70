package summary

import (
	"bytes"
	"encoding/json"
	"errors"
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
	if render(img("data:x")) != render(img("data:x")) {
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

func TestContractScopesAndChains(t *testing.T) {
	c := DefaultContract()
	text := bytes.Repeat([]byte("abcdefgh"), c.BlockBytes) // 8 blocks
	a := c.AppendHashes(nil, c.Root("m1", ""), text)
	if len(a) != 8 {
		t.Fatalf("%d hashes, want 8", len(a))
	}
	if b := c.AppendHashes(nil, c.Root("m2", ""), text); b[0] == a[0] {
		t.Error("two models share a block hash")
	}
	if b := c.AppendHashes(nil, c.Root("m1", "salt"), text); b[0] == a[0] {
		t.Error("a cache salt does not scope the chain")
	}
	// Changing block 3 changes hashes 3.. and keeps 0..2.
	mod := bytes.Clone(text)
	mod[3*c.BlockBytes+5] ^= 1
	b := c.AppendHashes(nil, c.Root("m1", ""), mod)
	for i := range a {
		if (a[i] == b[i]) != (i < 3) {
			t.Fatalf("block %d: equal=%v", i, a[i] == b[i])
		}
	}
	if got := len(c.AppendHashes(nil, 0, text[:c.BlockBytes-1])); got != 0 {
		t.Errorf("a partial block was hashed")
	}
	if DefaultContract().ID() != c.ID() || (Contract{BlockBytes: 512, Seed: c.Seed}).ID() == c.ID() {
		t.Error("contract IDs do not pin the block size")
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
