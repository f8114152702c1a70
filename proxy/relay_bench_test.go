package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkRelayStream relays 1,000-token streams (one flushed chunk per
// token) from an in-process replica through the router, answer recording
// included: the router's CPU per stream, with -cpuprofile its breakdown.
// The router's server has no ConnContext, so every stream takes the
// normal path (relay's read and write loop).
func BenchmarkRelayStream(b *testing.B) { benchRelayStream(b, false) }

// BenchmarkRelayStreamLoop is BenchmarkRelayStream through the stream
// loop (streamloop.go; Linux: elsewhere it measures the normal path).
func BenchmarkRelayStreamLoop(b *testing.B) { benchRelayStream(b, true) }

func benchRelayStream(b *testing.B, loop bool) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	rep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range 1000 {
			_, _ = w.Write(chunk)
			_ = rc.Flush()
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n")
	}))
	defer rep.Close()
	view := nopRecordView{newFakeView([]string{"m"}, fakeReplica{id: rep.URL})}
	p, err := New(Config{View: view, Policy: route.DefaultPolicy(), Contract: summary.DefaultContract()})
	if err != nil {
		b.Fatal(err)
	}
	router := httptest.NewUnstartedServer(p)
	if loop {
		router.Config.ConnContext = ConnContext
	}
	router.Start()
	defer router.Close()
	defer p.Close()
	body := []byte(chatBody("m", true, strings.Repeat("lorem ipsum dolor sit amet ", 300)))
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	cpu0 := processCPU(b)
	for b.Loop() {
		resp, err := client.Post(router.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n < 1000*int64(len(chunk)) {
			b.Fatal(fmt.Sprint(resp.StatusCode, n))
		}
	}
	// The process's CPU per stream (the client's and the replica's
	// included, as in BenchmarkUpstreamClient): steadier than the wall
	// time on a shared machine.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
	if loop && runtime.GOOS == "linux" && testutil.ToFloat64(p.m.loopStreams) == 0 {
		b.Fatal("the stream loop took no stream")
	}
}
