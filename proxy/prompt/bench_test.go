package prompt

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkRenderAndHash is the router's whole per-request prompt work:
// JSON parse, canonical rendering, block hashing and probes. "fast" is
// RenderChat (the single-pass scanner); "std" is the encoding/json
// reference, side by side so that the scanner's margin is measured in one
// run.
func BenchmarkRenderAndHash(b *testing.B) {
	renders := []struct {
		name   string
		render func([]byte) (Prompt, error)
	}{{"std", RenderChatStd}, {"fast", RenderChat}}
	// "escaped" is code-like text: a newline, quotes and a non-ASCII rune
	// every few dozen bytes, each breaking the scanner's 8-byte stride.
	shapes := []struct{ suffix, unit string }{
		{"", "lorem ipsum "},
		{"-escaped", "\tx := \"é\" // some code\n"},
	}
	for _, r := range renders {
		for _, size := range []int{8 << 10, 32 << 10, 512 << 10} {
			for _, sh := range shapes {
				if sh.suffix != "" && size != 32<<10 {
					continue
				}
				body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]any{
					{"role": "system", "content": "be brief"},
					{"role": "user", "content": strings.Repeat(sh.unit, size/len(sh.unit))},
				}})
				benchRender(b, fmt.Sprintf("%s/%dKB%s", r.name, size>>10, sh.suffix), body, r.render)
			}
		}
	}
}

func benchRender(b *testing.B, name string, body []byte, render func([]byte) (Prompt, error)) {
	c := summary.DefaultContract()
	b.Run(name, func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			p, err := render(body)
			if err != nil {
				b.Fatal(err)
			}
			h := c.AppendHashes(nil, c.Root(p.Model, ""), p.Text)
			summary.MakeProbes(nil, h)
		}
	})
}
