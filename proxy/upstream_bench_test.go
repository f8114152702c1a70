package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// wrappedTransport hides an *http.Transport behind another RoundTripper,
// which keeps every request of the router on net/http (the comparison).
type wrappedTransport struct{ t *http.Transport }

func (w wrappedTransport) RoundTrip(r *http.Request) (*http.Response, error) { return w.t.RoundTrip(r) }

// BenchmarkUpstreamClient sends requests through a router to an
// in-process replica, once with the router's own upstream client
// (upstream.go) and once with net/http's Transport, for an 8 KB chat
// request and for a 200-token stream (one flushed chunk per token). The
// client, the router and the replica share the process, so cpu-ns/op
// (the process's CPU time) and allocs/op differ between the two only by
// the router's client. This is
// the benchmark that keeps the hand-written client: if own stops beating
// net-http here and in internal/lab/bench/overhead.sh, it goes.
func BenchmarkUpstreamClient(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	answer := []byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`)
	rep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stream := r.Header.Get("X-Bench") == "stream"
		_, _ = io.Copy(io.Discard, r.Body)
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range 200 {
			_, _ = w.Write(chunk)
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer rep.Close()
	for _, mode := range []string{"request", "stream"} {
		for _, client := range []string{"own", "net-http"} {
			b.Run(mode+"/"+client, func(b *testing.B) {
				c := upstream.NewClient()
				if client == "net-http" {
					c.Transport = wrappedTransport{c.Transport.(*http.Transport)}
				}
				view := nopRecordView{newFakeView([]string{"m"}, fakeReplica{id: rep.URL})}
				p, err := New(Config{View: view, Policy: route.DefaultPolicy(), Contract: summary.DefaultContract(), Client: c})
				if err != nil {
					b.Fatal(err)
				}
				if (p.up != nil) != (client == "own") {
					b.Fatal("the router did not pick the client under test")
				}
				router := httptest.NewServer(p)
				defer router.Close()
				body := []byte(chatBody("m", mode == "stream", strings.Repeat("lorem ipsum dolor sit amet ", 300)))
				front := &http.Client{Transport: &http.Transport{DisableCompression: true}}
				defer front.CloseIdleConnections()
				cpu0 := processCPU(b)
				for b.Loop() {
					req, _ := http.NewRequest(http.MethodPost, router.URL+"/v1/chat/completions", bytes.NewReader(body))
					req.Header.Set("X-Bench", mode)
					resp, err := front.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || n == 0 {
						b.Fatal(resp.StatusCode, n)
					}
				}
				b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
