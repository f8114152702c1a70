package summary

import (
	"testing"
)

func FuzzDecode(f *testing.F) {
	c := DefaultContract().Fingerprint()
	s, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 1)
	s.Add(chain(40, 1))
	f.Add(s.AppendEncode(nil, c))
	f.Add([]byte("KVMS\x01\x07\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Decode(data, c)
		if err != nil {
			return
		}
		// Anything accepted must be usable and re-encode to itself.
		d.Match(MakeProbes(nil, chain(10, 1)))
		d.Add(chain(3, 2))
		if got := d.AppendEncode(nil, c); len(got) != len(data) {
			t.Fatalf("re-encoded %d bytes from %d", len(got), len(data))
		}
	})
}

func FuzzDecodeDelta(f *testing.F) {
	s, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 1)
	s.Add(chain(40, 1))
	s.Forget(chain(5, 1))
	enc, _, _ := s.AppendDelta(nil, 0)
	f.Add(enc)
	v := s.Version()
	s.Cut(CutBoth) // generation cuts are consecutive rotations
	s.Add(chain(3, 2))
	enc, _, _ = s.AppendDelta(nil, v)
	f.Add(enc)
	f.Add([]byte{})
	f.Add(make([]byte, 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDelta(data)
		if err != nil {
			return
		}
		// Anything accepted re-encodes to a delta that decodes the same,
		// and applies (or is refused) without harm.
		again, err := DecodeDelta(d.AppendEncode(nil))
		if err != nil || again.Count != d.Count || again.From != d.From || len(again.segs) != len(d.segs) {
			t.Fatalf("re-encoded delta: %v", err)
		}
		cp, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, d.Epoch)
		if cp.ApplyDelta(d) == nil {
			cp.Match(MakeProbes(nil, chain(10, 1)))
			if _, err := Decode(cp.AppendEncode(nil, 1), 1); err != nil {
				t.Fatalf("applied delta left an unencodable summary: %v", err)
			}
		}
	})
}

func FuzzRender(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function"}]}`))
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3]]}`))
	f.Add([]byte(`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"},{"type":"reasoning","summary":[]}],"previous_response_id":"r","prompt_cache_key":"k"}`))
	f.Add([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]}],"bootstrap_room":3}`))
	c := DefaultContract()
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
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, r := range renderers {
			checkAgainstReference(t, r, body)
		}
	})
}
