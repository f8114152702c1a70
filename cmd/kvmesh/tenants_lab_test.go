//go:build tenants

package main

// The tenants' token budgets measured with the real minute (issue 24,
// item 3): three routers on 127.0.0.1 (ports 24000-24022), each in front
// of its own simulated vLLM replica (real time), a heavy tenant sending
// three times its input budget spread over all three, a light tenant
// within its budget. Run:
//
//	go test -tags tenants -run TestTenantBudgetLab -v -timeout 20m ./cmd/kvmesh/
//
// Phases: the light tenant alone and beside the heavy one, 20 s each,
// four times over, then both for 60 s; a 30 s partition of the usage
// gossip (t1 | t2, t3) with both tenants, and 90 s after it heals. It
// prints, for the heavy tenant, the most prompt tokens served in any
// sliding minute in each phase, and the light tenant's TTFT p50/p99
// alone and beside the heavy one.

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
)

func TestTenantBudgetLab(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const (
		budget      = 60000 // input tokens per minute
		promptBytes = 1600  // about 400 tokens
		maxTokens   = 16
	)
	// The light tenant has a budget of its own, far from spent.
	c := tnStartAt(t, ctx, tenantConfig{input: budget, window: time.Minute, file: writeFile(t, "light 10000000 -\n")},
		replicasim.Config{DecodeMsPerToken: 10, MaxNumSeqs: 32}, 24000)
	defer c.close(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	defer client.CloseIdleConnections()
	heavyRate := 3.0 * budget / 400 / 60 // 7.5 a second
	lightRate := 3.0
	both := func(d time.Duration) (heavy, light []tnResult) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); light = tnLoad(ctx, c, client, "light", lightRate, d, promptBytes, maxTokens) }()
		heavy = tnLoad(ctx, c, client, "heavy", heavyRate, d, promptBytes, maxTokens)
		wg.Wait()
		return heavy, light
	}
	// Side by side: 20 s of the light tenant alone, then 20 s beside the
	// heavy one, four times over.
	var alone, heavy, light []tnResult
	for range 4 {
		alone = append(alone, tnLoad(ctx, c, client, "light", lightRate, 20*time.Second, promptBytes, maxTokens)...)
		h, l := both(20 * time.Second)
		heavy, light = append(heavy, h...), append(light, l...)
	}
	h, l := both(60 * time.Second) // the heavy one's window full and sliding
	heavy, light = append(heavy, h...), append(light, l...)
	c.cut.Store(true)
	heavyP, lightP := both(30 * time.Second)
	c.cut.Store(false)
	heavyH, lightH := both(90 * time.Second)

	ttft := func(rs []tnResult) (p50, p99 time.Duration, n int) {
		var ds []time.Duration
		for _, r := range rs {
			if r.status == http.StatusOK {
				ds = append(ds, r.ttft)
			}
		}
		slices.Sort(ds)
		return tnPct(ds, 0.50), tnPct(ds, 0.99), len(ds)
	}
	a50, a99, an := ttft(alone)
	b50, b99, bn := ttft(light)
	t.Logf("light tenant TTFT alone: p50 %.1f ms, p99 %.1f ms (%d of %d served)", tnMs(a50), tnMs(a99), an, len(alone))
	t.Logf("light tenant TTFT beside the heavy one: p50 %.1f ms, p99 %.1f ms (%d of %d served); p99 ratio %.2f",
		tnMs(b50), tnMs(b99), bn, len(light), float64(b99)/float64(a99))
	t.Logf("heavy tenant connected: %d served, %d refused (429); most prompt tokens in a sliding minute %d (%.3f budgets)",
		count(heavy, 200), count(heavy, 429), peakWindow(heavy, time.Minute), float64(peakWindow(heavy, time.Minute))/budget)
	all := slices.Concat(heavy, heavyP, heavyH)
	slices.SortFunc(all, func(a, b tnResult) int { return a.sent.Compare(b.sent) })
	pp := peakWindow(all, time.Minute)
	t.Logf("heavy tenant across a 30 s partition and 90 s after: most prompt tokens in a sliding minute %d (%.3f budgets; bound 2)",
		pp, float64(pp)/budget)
	if n := len(lightP) + len(lightH) + len(light) - count(lightP, 200) - count(lightH, 200) - count(light, 200); n > 0 {
		t.Errorf("the light tenant was refused %d times", n)
	}
	if peakWindow(heavy, time.Minute) > budget*11/10 || pp > 2*budget*11/10 {
		t.Errorf("over the bounds")
	}
}

// tnPct is the p-th quantile of sorted ds (nearest rank).
func tnPct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(int(p*float64(len(ds))), len(ds)-1)]
}

func tnMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
