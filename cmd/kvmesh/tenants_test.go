//go:build tenants

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// partitionGate stands between a router's ledger and the mesh: while cut
// is set it drops the usage of routers on the other side (sideOf), as a
// partition would; membership and routing stay as they are.
type partitionGate struct {
	mesh.Usage
	side   int
	sideOf map[string]int
	cut    *atomic.Bool
}

func (g *partitionGate) MergeGossip(origin string, boot uint64, b []byte, now time.Time) error {
	if g.cut.Load() && g.sideOf[origin] != g.side {
		return nil
	}
	return g.Usage.MergeGossip(origin, boot, b, now)
}

// tnCluster is three routers on 127.0.0.1, each in front of its own
// simulated replica, with tenant budgets and a partition switch.
type tnCluster struct {
	routers []*router
	reps    []simReplica
	cut     atomic.Bool
}

// tnStart starts the cluster: sides gives each router's side of the
// partition (r1 alone, r2 and r3 together).
func tnStart(t *testing.T, ctx context.Context, tc tenantConfig, sim replicasim.Config) *tnCluster {
	return tnStartAt(t, ctx, tc, sim, 0)
}

// tnStartAt is tnStart on ports from base (0: any free ports): replica
// i on base+i, router i's API on base+10+i and its gossip on base+20+i.
func tnStartAt(t *testing.T, ctx context.Context, tc tenantConfig, sim replicasim.Config, base int) *tnCluster {
	c := &tnCluster{}
	addr := func(off int) string {
		if base == 0 {
			return "127.0.0.1:0"
		}
		return fmt.Sprintf("127.0.0.1:%d", base+off)
	}
	sides := map[string]int{"t1": 0, "t2": 1, "t3": 1}
	for i, name := range []string{"t1", "t2", "t3"} {
		s, err := replicasim.New(sim, hclog.NewNullLogger(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", addr(i))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(s.Handler())
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		rep := simReplica{sim: s, srv: srv}
		c.reps = append(c.reps, rep)
		cfg := routerConfig{name: name, region: "local", listen: addr(10 + i), gossipBind: addr(20 + i), logLevel: hclog.Warn, logOutput: io.Discard,
			maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
			timing: mesh.TestTiming(), healthInterval: 100 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
			replicas: []string{rep.srv.URL}, tenants: tc}
		side := sides[name]
		cfg.tenants.wrapUsage = func(u mesh.Usage) mesh.Usage {
			return &partitionGate{Usage: u, side: side, sideOf: sides, cut: &c.cut}
		}
		if i > 0 {
			cfg.join = []string{c.routers[0].mesh.GossipAddr()}
		}
		r, err := startRouter(ctx, cfg)
		if err != nil {
			c.close(t)
			t.Fatal(err)
		}
		c.routers = append(c.routers, r)
	}
	for _, r := range c.routers {
		eventually(t, "every router to see the three replicas", func() bool {
			return len(r.mesh.Candidates("kvmesh-sim", nil)) == 3 && r.health.Ready()
		})
	}
	return c
}

func (c *tnCluster) close(t *testing.T) {
	for _, r := range c.routers {
		if err := r.shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	for _, r := range c.reps {
		r.close()
	}
}

// tnResult is one request's outcome: when it was sent, its status, the
// prompt tokens the engine reported, its time to first token, and the
// Retry-After of a refusal.
type tnResult struct {
	sent       time.Time
	status     int
	prompt     int64
	ttft       time.Duration
	retryAfter string
	errType    string
}

// tnBody is a streamed chat request of about promptBytes bytes asking
// for maxTokens tokens, with its usage.
func tnBody(promptBytes, maxTokens int, seq int) string {
	text := fmt.Sprintf("request %d: %s", seq, strings.Repeat("tenant budgets across the mesh. ", promptBytes/32))
	return fmt.Sprintf(`{"model":"kvmesh-sim","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, text)
}

// tnSend sends body as tenant to api and reads the answer.
func tnSend(client *http.Client, api, tenant, body string) tnResult {
	res := tnResult{sent: time.Now()}
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kvmesh-Tenant", tenant)
	resp, err := client.Do(req)
	if err != nil {
		res.status = -1
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		res.retryAfter = resp.Header.Get("Retry-After")
		var e struct {
			Error struct{ Type, Code string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		res.errType = e.Error.Type + "/" + e.Error.Code
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if res.ttft == 0 {
			res.ttft = time.Since(res.sent)
		}
		var c struct {
			Usage *struct {
				PromptTokens int64 `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(d), &c) == nil && c.Usage != nil {
			res.prompt = c.Usage.PromptTokens
		}
	}
	return res
}

// tnLoad sends tenant's requests at rate per second for d, to the
// routers in turn, and returns their results.
func tnLoad(ctx context.Context, c *tnCluster, client *http.Client, tenant string, rate float64, d time.Duration, promptBytes, maxTokens int) []tnResult {
	var mu sync.Mutex
	var out []tnResult
	var wg sync.WaitGroup
	n := int(rate * d.Seconds())
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		api := c.routers[i%len(c.routers)].api
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := tnSend(client, api, tenant, tnBody(promptBytes, maxTokens, i))
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b tnResult) int { return a.sent.Compare(b.sent) })
	return out
}

// peakWindow is the most prompt tokens the answered requests sent within
// any window of length w carried.
func peakWindow(rs []tnResult, w time.Duration) int64 {
	var peak, sum int64
	j := 0
	for i := range rs {
		if rs[i].status != http.StatusOK {
			continue
		}
		sum += rs[i].prompt
		for rs[i].sent.Sub(rs[j].sent) >= w {
			if rs[j].status == http.StatusOK {
				sum -= rs[j].prompt
			}
			j++
		}
		peak = max(peak, sum)
	}
	return peak
}

// count is the results of status.
func count(rs []tnResult, status int) int {
	n := 0
	for _, r := range rs {
		if r.status == status {
			n++
		}
	}
	return n
}

// TestTenantBudgetAcrossRouters: three routers, one tenant sending three
// times its input budget spread over all of them: what the mesh serves it
// in any window stays near the budget, every refusal is a 429
// rate_limit_exceeded with Retry-After, and a tenant within its budget is
// never refused (within 1.25 budgets here: the window is short). Then a partition of the usage gossip (r1 | r2, r3) for a
// window: the window holds at most two budgets (proxy/quota, Bounds).
// A short window (3 s) stands for the minute.
func TestTenantBudgetAcrossRouters(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const (
		window      = 3 * time.Second
		budget      = 12000 // input tokens per window
		promptBytes = 1600  // about 400 tokens
	)
	c := tnStart(t, ctx, tenantConfig{input: budget, window: window, interval: 100 * time.Millisecond},
		replicasim.Config{DecodeMsPerToken: 1, MaxNumSeqs: 64})
	defer c.close(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	// About 400 tokens a request: three budgets a window is 22.5 a
	// second; the light tenant sends a quarter of its budget.
	rate := 3 * budget / 400 / window.Seconds()
	run := func(d time.Duration) (heavy, light []tnResult) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			light = tnLoad(ctx, c, client, "light", 0.25*budget/400/window.Seconds(), d, promptBytes, 4)
		}()
		heavy = tnLoad(ctx, c, client, "heavy", rate, d, promptBytes, 4)
		wg.Wait()
		return heavy, light
	}
	heavy, light := run(2 * window)
	peak := peakWindow(heavy, window)
	t.Logf("connected: heavy tenant %d served, %d refused; at most %d prompt tokens in a window (budget %d); light tenant %d served, %d refused",
		count(heavy, 200), count(heavy, 429), peak, budget, count(light, 200), len(light)-count(light, 200))
	// The usage's lag (gossip every 100 ms, and a loaded machine's
	// scheduling) is thirty times the share of a 3 s window it is of the
	// minute, so the bound here is 1.25 budgets; the minute's 1.1 is the
	// lab run's (tenants_lab_test.go: 1.012). Without budgets it is 3.
	if peak > budget*5/4 {
		t.Errorf("the mesh served %d tokens in a window, budget %d", peak, budget)
	}
	if peak < budget/2 {
		t.Errorf("the mesh served only %d tokens in a window of a budget of %d", peak, budget)
	}
	if n := count(light, 200); n != len(light) || n == 0 {
		t.Errorf("the light tenant: %d of %d served", n, len(light))
	}
	for _, r := range heavy {
		if r.status != 200 && (r.status != 429 || r.retryAfter == "" || r.errType != "tokens/rate_limit_exceeded") {
			t.Fatalf("a refusal: status %d, Retry-After %q, error %s", r.status, r.retryAfter, r.errType)
		}
	}

	c.cut.Store(true)
	part, _ := run(window)
	c.cut.Store(false)
	after, _ := run(window)
	all := append(append(heavy, part...), after...)
	slices.SortFunc(all, func(a, b tnResult) int { return a.sent.Compare(b.sent) })
	ppeak := peakWindow(all, window)
	t.Logf("partition of one window and one after: at most %d prompt tokens in a window (bound 2 × %d)", ppeak, budget)
	if ppeak > 2*budget*11/10 {
		t.Errorf("partitioned, the mesh served %d tokens in a window, bound %d", ppeak, 2*budget)
	}
}
