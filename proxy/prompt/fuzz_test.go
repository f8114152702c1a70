package prompt

import (
	"testing"

	"github.com/kvmesh/kvmesh/summary"
)

func FuzzRender(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function"}]}`))
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3]]}`))
	f.Add([]byte(`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"},{"type":"reasoning","summary":[]}],"previous_response_id":"r","prompt_cache_key":"k"}`))
	f.Add([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]}],"bootstrap_room":3}`))
	c := summary.DefaultContract()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, render := range []func([]byte) (Prompt, error){RenderChat, RenderCompletion, RenderResponses, RenderMessages, RenderEmbeddings} {
			p, err := render(body)
			if err != nil {
				continue
			}
			if p.Model == "" {
				t.Fatal("accepted a request without a model")
			}
			c.AppendHashes(nil, c.Root(p.Model, p.CacheSalt), p.Text)
			p.AppendAnswer("x")
		}
	})
}

// FuzzRenderMatchesReference checks the single-pass scanner against the
// encoding/json reference: it may decline any body, but what it accepts the
// reference must accept and render identically, and the public functions
// must agree with the reference on every body.
func FuzzRenderMatchesReference(f *testing.F) {
	for _, tc := range renderCases {
		f.Add([]byte(tc.body))
	}
	for _, b := range maxTokensBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, r := range renderers {
			checkAgainstReference(t, r, body)
		}
	})
}
