package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// BenchmarkAddedLatency measures what the router adds to a request on
// loopback: each iteration sends one request straight to a fake replica
// that answers at once, one through a standard reverse proxy
// (httputil.ReverseProxy, flushing every write, as a plain load balancer
// would) and one through the router, and reports the differences of their
// latency quantiles from the direct call, side by side.
func BenchmarkAddedLatency(b *testing.B) {
	for _, size := range []int{8 << 10, 32 << 10} {
		for _, stream := range []bool{false, true} {
			b.Run(fmt.Sprintf("prompt=%dKB/stream=%v", size>>10, stream), func(b *testing.B) {
				benchAdded(b, size, stream)
			})
		}
	}
}

func benchAdded(b *testing.B, size int, stream bool) {
	rep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if stream {
			sseChat(w, []string{"Hello", " there", ", friend."}, 0)
		} else {
			jsonChat(w, "Hello there, friend.", 0)
		}
	}))
	defer rep.Close()
	// Eight replicas with summaries, as a small region would have.
	rs := []fakeReplica{{id: rep.URL, match: 4}}
	for i := range 7 {
		rs = append(rs, fakeReplica{id: fmt.Sprintf("http://127.0.0.1:1/%d", i), match: 1})
	}
	view := nopRecordView{newFakeView([]string{"m"}, rs...)}
	p, err := New(Config{View: view, Policy: route.DefaultPolicy(), Contract: summary.DefaultContract()})
	if err != nil {
		b.Fatal(err)
	}
	router := httptest.NewServer(p)
	defer router.Close()
	target, _ := url.Parse(rep.URL)
	std := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
	})
	defer std.Close()
	body := []byte(chatBody("m", stream, strings.Repeat("lorem ipsum dolor sit amet ", size/27+1)[:size]))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	do := func(url string) time.Duration {
		start := time.Now()
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	for range 50 { // warm connections
		do(rep.URL)
		do(std.URL)
		do(router.URL)
	}
	direct := make([]time.Duration, 0, b.N)
	proxied := make([]time.Duration, 0, b.N)
	routed := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for range b.N {
		direct = append(direct, do(rep.URL))
		proxied = append(proxied, do(std.URL))
		routed = append(routed, do(router.URL))
	}
	b.StopTimer()
	q := func(d []time.Duration, f float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(f*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(routed, 0.5)-q(direct, 0.5), "added-p50-ms")
	b.ReportMetric(q(routed, 0.99)-q(direct, 0.99), "added-p99-ms")
	b.ReportMetric(q(proxied, 0.5)-q(direct, 0.5), "stdproxy-added-p50-ms")
	b.ReportMetric(q(proxied, 0.99)-q(direct, 0.99), "stdproxy-added-p99-ms")
	b.ReportMetric(q(direct, 0.5), "direct-p50-ms")
}
