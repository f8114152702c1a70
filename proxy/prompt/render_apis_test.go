package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type obj = map[string]any

// TestNewFormatsRenderLikeChat checks that one conversation renders to the
// same canonical text whichever API carries it, so the chat rendering's
// prefix property and answer framing carry over.
func TestNewFormatsRenderLikeChat(t *testing.T) {
	tool := obj{"type": "function", "name": "f", "parameters": obj{"type": "object"}}
	chat := func(t *testing.T, msgs []obj, tools []any) string {
		extra := map[string]any{}
		if tools != nil {
			extra["tools"] = tools
		}
		p, err := RenderChat(chatBody(t, msgs, extra))
		if err != nil {
			t.Fatal(err)
		}
		return string(p.Text)
	}
	tests := []struct {
		name   string
		render func([]byte) (Prompt, error)
		body   obj
		chat   []obj
		tools  []any
	}{
		{"responses string input", RenderResponses,
			obj{"model": "m", "instructions": "be brief", "input": "hello"},
			[]obj{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}}, nil},
		{"responses items", RenderResponses,
			obj{"model": "m", "tools": []any{tool}, "input": []any{
				obj{"role": "developer", "content": "rules"},
				obj{"type": "message", "role": "user", "content": []any{obj{"type": "input_text", "text": "a"}, obj{"type": "input_text", "text": "b"}}},
				obj{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": []any{obj{"type": "output_text", "text": "answer", "annotations": []any{}}}},
				obj{"type": "function_call", "call_id": "c1", "name": "f", "arguments": `{"x":1}`},
				obj{"type": "function_call_output", "call_id": "c1", "output": "42"},
			}},
			[]obj{{"role": "developer", "content": "rules"}, {"role": "user", "content": "ab"},
				{"role": "assistant", "content": "answer", "tool_calls": []any{obj{"id": "c1", "type": "function", "function": obj{"name": "f", "arguments": `{"x":1}`}}}},
				{"role": "tool", "tool_call_id": "c1", "content": "42"}},
			[]any{tool}},
		{"responses call without message", RenderResponses,
			obj{"model": "m", "input": []any{
				obj{"role": "user", "content": "q"},
				obj{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
				obj{"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
			}},
			[]obj{{"role": "user", "content": "q"}, {"role": "assistant", "content": nil, "tool_calls": []any{
				obj{"id": "c1", "function": obj{"name": "f", "arguments": "{}"}},
				obj{"id": "c2", "function": obj{"name": "g", "arguments": "{}"}}}}},
			nil},
		{"messages", RenderMessages,
			obj{"model": "m", "max_tokens": 10, "system": "be brief", "messages": []any{
				obj{"role": "user", "content": "hello"},
				obj{"role": "assistant", "content": []any{obj{"type": "text", "text": "hi"}, obj{"type": "text", "text": " there"}}},
				obj{"role": "user", "content": []any{obj{"type": "text", "text": "more"}}},
			}},
			[]obj{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
				{"role": "assistant", "content": "hi there"}, {"role": "user", "content": "more"}},
			nil},
		{"messages system blocks and tools", RenderMessages,
			obj{"model": "m", "tools": []any{tool}, "system": []any{obj{"type": "text", "text": "be "}, obj{"type": "text", "text": "brief", "cache_control": obj{"type": "ephemeral"}}},
				"messages": []any{obj{"role": "user", "content": "x"}}},
			[]obj{{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}},
			[]any{tool}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.render(mustJSON(t, tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if !p.Chat || p.Model != "m" {
				t.Fatalf("prompt %+v: want a chat-framed prompt for model m", p)
			}
			if want := chat(t, tc.chat, tc.tools); string(p.Text) != want {
				t.Fatalf("rendered\n%q\nchat renders\n%q", p.Text, want)
			}
		})
	}
}

// TestNewFormatsNextTurnExtendsTheLast is the property routing relies on: a
// conversation's next turn, sent with the earlier turns and the answer as
// input, renders to text that starts with the earlier prompt + answer.
func TestNewFormatsNextTurnExtendsTheLast(t *testing.T) {
	type turn struct {
		first, second obj
	}
	tests := []struct {
		name   string
		render func([]byte) (Prompt, error)
		turns  turn
	}{
		{"responses", RenderResponses, turn{
			obj{"model": "m", "instructions": "sys", "input": "question one"},
			obj{"model": "m", "instructions": "sys", "input": []any{
				obj{"role": "user", "content": "question one"},
				obj{"type": "message", "role": "assistant", "content": []any{obj{"type": "output_text", "text": "the answer"}}},
				obj{"role": "user", "content": "question two"},
			}},
		}},
		{"messages", RenderMessages, turn{
			obj{"model": "m", "system": "sys", "max_tokens": 5, "messages": []any{obj{"role": "user", "content": "question one"}}},
			obj{"model": "m", "system": "sys", "max_tokens": 5, "messages": []any{
				obj{"role": "user", "content": []any{obj{"type": "text", "text": "question one"}}},
				obj{"role": "assistant", "content": "the answer"},
				obj{"role": "user", "content": "question two"},
			}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p1, err := tc.render(mustJSON(t, tc.turns.first))
			if err != nil {
				t.Fatal(err)
			}
			p2, err := tc.render(mustJSON(t, tc.turns.second))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(p2.Text, p1.AppendAnswer("the answer")) {
				t.Fatalf("turn 2 %q does not start with turn 1 + answer %q", p2.Text, p1.AppendAnswer("the answer"))
			}
			if bytes.HasPrefix(p2.Text, p1.AppendAnswer("another answer")) {
				t.Fatal("turn 2 also extends a different answer")
			}
		})
	}
}

func TestNewFormatsFields(t *testing.T) {
	p, err := RenderResponses([]byte(`{"model":"m","input":"x","stream":true,"previous_response_id":"resp_1","prompt_cache_key":"k","cache_salt":"s","bootstrap_room": 12}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Stream || p.PreviousResponseID != "resp_1" || p.CacheKey != "k" || p.CacheSalt != "s" || p.BootstrapRoom != "12" {
		t.Fatalf("fields not read: %+v", p)
	}
	p, err = RenderMessages([]byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Stream || p.CacheKey != "" || p.PreviousResponseID != "" {
		t.Fatalf("fields not read: %+v", p)
	}
	// Different images, tool inputs or results render differently.
	a, _ := RenderMessages([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"data":"AAAA"}}]}]}`))
	b, _ := RenderMessages([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"data":"BBBB"}}]}]}`))
	c, _ := RenderMessages([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"1"}]}]}`))
	d, _ := RenderMessages([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"2"}]}]}]}`))
	if bytes.Equal(a.Text, b.Text) || bytes.Equal(c.Text, d.Text) || len(a.Text) == 0 {
		t.Fatal("different blocks render the same")
	}
}

func TestNewFormatsErrors(t *testing.T) {
	tests := []struct {
		name   string
		render func([]byte) (Prompt, error)
		body   string
	}{
		{"responses not json", RenderResponses, `{"model":`},
		{"responses no model", RenderResponses, `{"input":"x"}`},
		{"responses no input", RenderResponses, `{"model":"m"}`},
		{"responses number input", RenderResponses, `{"model":"m","input":5}`},
		{"responses item without type or role", RenderResponses, `{"model":"m","input":[{"content":"x"}]}`},
		{"responses message without role", RenderResponses, `{"model":"m","input":[{"type":"message","content":"x"}]}`},
		{"responses bad content", RenderResponses, `{"model":"m","input":[{"role":"user","content":5}]}`},
		{"responses bad item", RenderResponses, `{"model":"m","input":[5]}`},
		{"messages no model", RenderMessages, `{"messages":[{"role":"user","content":"x"}]}`},
		{"messages empty", RenderMessages, `{"model":"m","messages":[]}`},
		{"messages no role", RenderMessages, `{"model":"m","messages":[{"content":"x"}]}`},
		{"messages bad content", RenderMessages, `{"model":"m","messages":[{"role":"user","content":{}}]}`},
		{"messages bad system", RenderMessages, `{"model":"m","system":5,"messages":[{"role":"user","content":"x"}]}`},
		{"embeddings no model", RenderEmbeddings, `{"input":"x"}`},
		{"embeddings not json", RenderEmbeddings, `[`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.render([]byte(tc.body)); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err = %v, want ErrBadRequest", err)
			}
		})
	}
}
