package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkRequestJSON decides the request-side JSON parser on the whole
// request: each iteration is one chat request through the router's handler
// (body read, parse and render, hashing, routing over eight replicas with
// summaries, the upstream request, relaying and reading the answer) to an
// in-memory replica, with the single-pass scanner ("scanner", what
// the chat endpoint uses, into a lent buffer) or encoding/json alone ("std"), and the same prompt as a
// Responses request ("responses-std", encoding/json only). "prose" is plain text;
// "code" has a newline, quotes and a non-ASCII rune every few dozen bytes.
// cpu-ns/op is the process CPU time (user + system, GC included) per
// request: on a shared machine it is steadier than ns/op, which counts the
// time the benchmark waits for a core.
func BenchmarkRequestJSON(b *testing.B) {
	rs := make([]fakeReplica, 8)
	for i := range rs {
		rs[i] = fakeReplica{id: fmt.Sprintf("http://replica-%d", i), match: i}
	}
	view := nopRecordView{newFakeView([]string{"m"}, rs...)}
	p, err := New(Config{View: view, Policy: route.DefaultPolicy(), Contract: summary.DefaultContract(),
		Client: &http.Client{Transport: cannedReplica{}}})
	if err != nil {
		b.Fatal(err)
	}
	shapes := []struct{ name, unit string }{{"prose", "lorem ipsum "}, {"code", "\tx := \"é\" // some code\n"}}
	for _, size := range []int{8 << 10, 32 << 10} {
		for _, sh := range shapes {
			body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]any{
				{"role": "system", "content": "be brief"},
				{"role": "user", "content": strings.Repeat(sh.unit, size/len(sh.unit))},
			}})
			// The same prompt as a Responses request, which only
			// encoding/json parses.
			resp, _ := json.Marshal(map[string]any{"model": "m", "instructions": "be brief",
				"input": strings.Repeat(sh.unit, size/len(sh.unit))})
			cases := []struct {
				name string
				ep   endpoint
				body []byte
			}{
				{"scanner", chatAPI, body},
				{"std", endpoint{label: epChat, render: prompt.RenderChatStd}, body},
				{"responses-std", responsesAPI, resp},
			}
			for _, tc := range cases {
				ep, body := tc.ep, tc.body
				b.Run(fmt.Sprintf("%dKB/%s/%s", size>>10, sh.name, tc.name), func(b *testing.B) {
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					cpu0 := processCPU(b)
					for b.Loop() {
						r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
						w := httptest.NewRecorder()
						p.inference(w, r, &ep)
						if w.Code != http.StatusOK {
							b.Fatalf("status %d: %s", w.Code, w.Body)
						}
					}
					b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

// processCPU returns the process's user + system CPU time in nanoseconds.
func processCPU(b *testing.B) int64 {
	d, ok := threadcpu.Process()
	if !ok {
		b.Skip("process CPU time is not read on this platform")
	}
	return int64(d)
}
