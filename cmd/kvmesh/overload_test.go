//go:build overload

package main

// The overload measurement of issue 24's "done when" (admission): a
// router in front of two simulated vLLM replicas (replicasim, real time),
// arrivals at twice what they serve for a minute, a third of them high
// class. Run:
//
//	go test -tags overload -run TestOverload -v -timeout 20m ./cmd/kvmesh/
//
// KVMESH_OVERLOAD_SECONDS shortens (or lengthens) the overload phases
// (default 60). It prints the figures; it fails when a request is not
// answered, a shed request lacks Retry-After or waited past its deadline,
// the queue does not drain, or the high class's TTFT p99 under overload
// exceeds twice its idle value.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The simulated cluster: 2 replicas of 32 sequences, 12 output tokens at
// 40 ms each: a request holds a slot about 0.5 s, so the cluster serves
// about 133 requests a second (few tokens, so that the router, the
// engines and the clients share 2 cores without the CPU setting the
// tail).
const (
	olReplicas  = 2
	olSeqs      = 32
	olMaxTokens = 12
	olDecodeMs  = 40
	// olLowDeadline is the queue deadline the low class asks for
	// (admit.HeaderQueueTimeout).
	olLowDeadline = 2 * time.Second
)

// olCapacity is the cluster's requests per second, from its model.
func olCapacity() float64 {
	return olReplicas * olSeqs / (olMaxTokens * olDecodeMs / 1000.0)
}

type olResult struct {
	high             bool
	status           int
	retryAfter       string
	ttft, total      time.Duration
	transportFailure string
}

// olRun sends Poisson arrivals at rate per second for d, a share high of
// them high class, and returns every result once all are answered.
func olRun(t *testing.T, api string, rate, high float64, d time.Duration, seed uint64) []olResult {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}, Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(seed, 1))
	var mu sync.Mutex
	var out []olResult
	var wg sync.WaitGroup
	start := time.Now()
	next := start
	for i := 0; next.Sub(start) < d; i++ {
		time.Sleep(time.Until(next))
		isHigh := rng.Float64() < high
		body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"request %d of seed %d: %s"}]}`,
			"kvmesh-sim", i, seed, strings.Repeat("lorem ipsum ", 20))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := olSend(client, api, body, isHigh)
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	wg.Wait()
	return out
}

func olSend(client *http.Client, api, body string, high bool) olResult {
	res := olResult{high: high}
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if high {
		req.Header.Set(admit.HeaderPriority, "high")
	} else {
		req.Header.Set(admit.HeaderPriority, "low")
		req.Header.Set(admit.HeaderQueueTimeout, olLowDeadline.String())
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.transportFailure = err.Error()
		return res
	}
	defer resp.Body.Close()
	res.status, res.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		res.total = time.Since(t0)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if res.ttft == 0 && strings.HasPrefix(sc.Text(), "data: {") {
			res.ttft = time.Since(t0)
		}
	}
	res.total = time.Since(t0)
	if err := sc.Err(); err != nil {
		res.transportFailure = err.Error()
	}
	return res
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

// olSummary prints a phase's figures and returns the high class's TTFT
// p99.
func olSummary(t *testing.T, name string, rs []olResult) time.Duration {
	var highTTFT, lowTTFT []time.Duration
	var shed, shedNoRetry, late, failures, highShed int
	codes := map[int]int{}
	var maxShedWait time.Duration
	for _, r := range rs {
		codes[r.status]++
		switch {
		case r.transportFailure != "":
			failures++
			t.Errorf("%s: a request was not answered: %s", name, r.transportFailure)
		case r.status == http.StatusOK && r.high:
			highTTFT = append(highTTFT, r.ttft)
		case r.status == http.StatusOK:
			lowTTFT = append(lowTTFT, r.ttft)
		case r.status == http.StatusTooManyRequests || r.status == http.StatusServiceUnavailable:
			shed++
			if r.high {
				highShed++
			}
			if n, err := strconv.Atoi(r.retryAfter); err != nil || n < 1 {
				shedNoRetry++
			}
			maxShedWait = max(maxShedWait, r.total)
			if !r.high && r.total > olLowDeadline+time.Second {
				late++
			}
		default:
			t.Errorf("%s: status %d", name, r.status)
		}
	}
	t.Logf("%-22s requests %5d  codes %v", name, len(rs), codes)
	t.Logf("%-22s high: served %4d  shed %3d  TTFT p50 %6.0f ms  p90 %6.0f ms  p99 %6.0f ms  max %6.0f ms", name, len(highTTFT), highShed,
		ms(pct(highTTFT, .5)), ms(pct(highTTFT, .9)), ms(pct(highTTFT, .99)), ms(pct(highTTFT, 1)))
	t.Logf("%-22s low:  served %4d  shed %4d  TTFT p50 %6.0f ms  p99 %6.0f ms  (shed: longest answer %.0f ms, deadline %v)", name,
		len(lowTTFT), shed-highShed, ms(pct(lowTTFT, .5)), ms(pct(lowTTFT, .99)), ms(maxShedWait), olLowDeadline)
	if shedNoRetry > 0 {
		t.Errorf("%s: %d shed requests without Retry-After", name, shedNoRetry)
	}
	if late > 0 {
		t.Errorf("%s: %d low requests were answered past their queue deadline (+1 s)", name, late)
	}
	return pct(highTTFT, .99)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func olCluster(t *testing.T, ctx context.Context, adm admit.Config) (*router, func()) {
	var reps []simReplica
	for range olReplicas {
		sim, err := replicasim.New(replicasim.Config{MaxNumSeqs: olSeqs, DecodeMsPerToken: olDecodeMs, DefaultMaxTokens: olMaxTokens},
			hclog.NewNullLogger(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, simReplica{sim: sim, srv: httptest.NewServer(sim.Handler())})
	}
	cfg := routerConfig{name: "a", region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: io.Discard,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 200 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		admission: adm}
	cfg.sources.loadInterval = time.Second
	for _, r := range reps {
		cfg.replicas = append(cfg.replicas, r.srv.URL)
	}
	r, err := startRouter(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to see its replicas healthy", func() bool {
		return len(r.mesh.Candidates("kvmesh-sim", nil)) == olReplicas && r.health.Ready()
	})
	return r, func() {
		if err := r.shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		for _, rp := range reps {
			rp.close()
		}
	}
}

// olAdmitted logs how the router admitted each class, and how long the
// queued ones waited.
func olAdmitted(t *testing.T, r *router) {
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		switch f.GetName() {
		case "kvmesh_admission_admitted_total":
			for _, m := range f.GetMetric() {
				if v := m.GetCounter().GetValue(); v > 0 {
					t.Logf("admitted %v: %.0f", labels(m.GetLabel()), v)
				}
			}
		case "kvmesh_admission_queue_wait_seconds":
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				if h.GetSampleCount() == 0 {
					continue
				}
				var b []string
				for _, bk := range h.GetBucket() {
					b = append(b, fmt.Sprintf("≤%gs:%d", bk.GetUpperBound(), bk.GetCumulativeCount()))
				}
				t.Logf("queue wait %v: %d, mean %.0f ms; %s", labels(m.GetLabel()), h.GetSampleCount(), 1000*h.GetSampleSum()/float64(h.GetSampleCount()), strings.Join(b, " "))
			}
		}
	}
}

func labels(ls []*dto.LabelPair) string {
	var s []string
	for _, l := range ls {
		s = append(s, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(s, ",")
}

// olSample logs, every 2 s until stopped, what the router reads of its
// replicas: slots (published or learned), in flight, the engine's
// running and waiting.
func olSample(t *testing.T, r *router) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(2 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tk.C:
			}
			var s []string
			for _, c := range r.mesh.Candidates("kvmesh-sim", nil) {
				s = append(s, fmt.Sprintf("slots %d in flight %d running %d waiting %d", c.Slots, c.InFlight, c.Running, c.Waiting))
			}
			t.Logf("replicas: %s", strings.Join(s, " | "))
		}
	}()
	return func() { close(quit); <-done }
}

// olQueued is the router's admission queue depth, all classes.
func olQueued(t *testing.T, r *router) float64 {
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() == "kvmesh_admission_queue_depth" {
			for _, m := range f.GetMetric() {
				n += m.GetGauge().GetValue()
			}
		}
	}
	return n
}

func TestOverload(t *testing.T) {
	secs := 60
	if s, err := strconv.Atoi(os.Getenv("KVMESH_OVERLOAD_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	d := time.Duration(secs) * time.Second
	capacity := olCapacity()
	t.Logf("cluster: %d replicas x %d seqs, %d tokens x %d ms: capacity %.0f req/s; overload %.0f req/s for %v, %.2f of them high",
		olReplicas, olSeqs, olMaxTokens, olDecodeMs, capacity, 2*capacity, d, olHigh())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	r, stop := olCluster(t, ctx, admit.Config{MaxWaiting: admit.DefaultMaxWaiting})
	// Warm up the slot estimate (the engines must be seen queueing), then
	// the idle figure: high class alone at a quarter of capacity.
	olRun(t, r.api, 2*capacity, olHigh(), 5*time.Second, 1)
	eventually(t, "the warm-up to drain", func() bool { return olQueued(t, r) == 0 })
	idle := olSummary(t, "idle (0.25x, high)", olRun(t, r.api, capacity/4, 1, 20*time.Second, 2))
	stopSample := olSample(t, r)
	over := olSummary(t, "2x, admission", olRun(t, r.api, 2*capacity, olHigh(), d, 3))
	stopSample()
	eventually(t, "the queue to drain after the burst", func() bool { return olQueued(t, r) == 0 })
	olAdmitted(t, r)
	stop()

	// Without admission, for comparison: every request queues in the
	// engines, each holding three descriptors, so this phase is kept to
	// 20 s (60 s of it passes a 20,000-descriptor limit).
	r0, stop0 := olCluster(t, ctx, admit.Config{})
	off := olSummary(t, "2x, admission off", olRun(t, r0.api, 2*capacity, olHigh(), min(d, 20*time.Second), 3))
	stop0()

	t.Logf("high-class TTFT p99: idle %.0f ms, 2x with admission %.0f ms (%.2fx idle), 2x without (≤ 20 s) %.0f ms (%.2fx idle)",
		ms(idle), ms(over), float64(over)/float64(idle), ms(off), float64(off)/float64(idle))
	if over > 2*idle {
		t.Errorf("high-class TTFT p99 under overload %v exceeds 2x its idle value %v", over, idle)
	}
}

// olHigh is the high class's share of the arrivals: KVMESH_OVERLOAD_HIGH
// (default 1/6, a third of the capacity).
func olHigh() float64 {
	if f, err := strconv.ParseFloat(os.Getenv("KVMESH_OVERLOAD_HIGH"), 64); err == nil && f > 0 && f <= 1 {
		return f
	}
	return 1.0 / 6
}
