package replicasim

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseRequest feeds untrusted bodies to the request parser: it must
// never panic, every failure must be a 400, and a chat render must end with
// the generation prompt.
func FuzzParseRequest(f *testing.F) {
	seeds := []struct {
		chat bool
		body string
	}{
		{true, `{"model":"kvmesh-sim","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
		{true, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"max_completion_tokens":3}`},
		{true, `{"messages":[{"role":"assistant","content":null}]}`},
		{false, `{"prompt":"hello","max_tokens":5}`},
		{false, `{"prompt":["a","b"]}`},
		{false, `{"prompt":[1,2,3]}`},
		{false, `{"prompt":[[1,2],[3]]}`},
		{false, `{"prompt":[]}`},
		{true, `{"messages":[`},
		{false, `null`},
		{false, `{"prompt":"x","kv_transfer_params":{"do_remote_decode":true}}`},
		{false, `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"h","remote_port":8,"remote_request_id":"r"}}`},
		{true, `{"messages":[],"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":12345}`},
		{true, `{"messages":[],"bootstrap_host":"h","bootstrap_port":null,"bootstrap_room":-1}`},
	}
	for _, s := range seeds {
		f.Add(s.chat, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		ep := completionEndpoint
		if chat {
			ep = chatEndpoint
		}
		p, err := parseRequest(ep, body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		if chat && !strings.HasSuffix(p.Prompt, genPrompt) && !strings.Contains(string(body), "add_generation_prompt") {
			t.Fatalf("chat render %q lacks the generation prompt", p.Prompt)
		}
		if p.MaxTokens < 0 {
			t.Fatalf("negative max tokens %d", p.MaxTokens)
		}
		// Its disaggregation, as each role reads it: a 400 or a plan a
		// decode can act on.
		for _, role := range []Role{RoleBoth, RolePrefill, RoleDecode} {
			plan, err := p.PD.plan(role, p.MaxTokens)
			if err != nil {
				if !errors.Is(err, errBadRequest) {
					t.Fatalf("role %s: error %v does not wrap errBadRequest", role, err)
				}
				continue
			}
			if (plan.mode == modeDecodeVLLM || plan.mode == modeDecodeSGLang) && (plan.peer == "" || plan.key == "") {
				t.Fatalf("role %s: a decode without a peer or key: %+v", role, plan)
			}
		}
	})
}
