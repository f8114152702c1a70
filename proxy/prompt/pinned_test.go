package prompt

import (
	"testing"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

// pinnedContractID and pinnedRendering tie the canonical rendering to the
// contract ID: a change to either fails this test. A rendering change must
// bump summary's renderVersion (routers that render differently must
// refuse each other) and then record both new values here.
const (
	pinnedContractID = "kvm1-r1-xxh3-b1024-s6b766d6573680001"
	pinnedRendering  = 0x19a0bf26456902b1
)

// TestRenderingIsPinned renders every reference case with every renderer
// and digests the texts and the answers appended to them.
func TestRenderingIsPinned(t *testing.T) {
	var all []byte
	for _, tc := range renderCases {
		for _, render := range []func([]byte) (Prompt, error){RenderChat, RenderCompletion, RenderResponses, RenderMessages, RenderEmbeddings} {
			p, err := render([]byte(tc.body))
			if err != nil {
				all = append(all, 0)
				continue
			}
			all = append(all, p.AppendAnswer("answer")...)
		}
	}
	for _, tc := range pinnedAPIBodies {
		p, err := tc.render([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		all = append(all, p.AppendAnswer("answer")...)
	}
	id := summary.DefaultContract().ID()
	if got := xxh3.Hash(all); got != pinnedRendering || id != pinnedContractID {
		t.Fatalf("rendering digest %#x under contract %s, pinned %#x under %s: a rendering change bumps summary's renderVersion, then both pins are updated", got, id, uint64(pinnedRendering), pinnedContractID)
	}
}

// pinnedAPIBodies exercise the Responses and Messages renderings.
var pinnedAPIBodies = []struct {
	render func([]byte) (Prompt, error)
	body   string
}{
	{RenderResponses, `{"model":"m","instructions":"s","tools":[{"type":"function","name":"f"}],"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"},{"type":"reasoning","summary":[]}]}`},
	{RenderResponses, `{"model":"m","input":"hello"}`},
	{RenderMessages, `{"model":"m","system":[{"type":"text","text":"s"}],"tools":[{"name":"f"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]},{"type":"tool_use","id":"t","name":"f","input":{ "a" : 1 }},{"type":"image","source":{}}]},{"role":"assistant","content":"ok"}]}`},
}
