package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

func TestLRULeadingRun(t *testing.T) {
	tests := []struct {
		name    string
		cap     int
		touches [][]int64 // requests admitted in order
		query   []int64
		want    int
	}{
		{"empty cache", 4, nil, []int64{1, 2}, 0},
		{"full prefix", 4, [][]int64{{1, 2, 3}}, []int64{1, 2, 3, 4}, 3},
		{"stops at first miss", 8, [][]int64{{1, 2, 3}, {9}}, []int64{1, 2, 7, 9}, 2},
		{"later cached block not counted", 8, [][]int64{{2, 3}}, []int64{1, 2, 3}, 0},
		// Capacity 3: {1,2,3} then {4,5}: touching 5 then 4 evicts the
		// least recent, 3 then 2 (the tail of the first request went first).
		{"tail evicted first", 3, [][]int64{{1, 2, 3}, {4, 5}}, []int64{1, 2, 3}, 1},
		// {1,2} then {3,4}: the head block 1 is the oldest after 2 was
		// refreshed by {2}; admitting 5 evicts 1, and with it the match.
		{"evicted head kills match", 4, [][]int64{{1, 2}, {3, 4}, {2}, {5}}, []int64{1, 2, 3}, 0},
		{"refresh keeps head", 3, [][]int64{{1, 2}, {1}, {7, 8}}, []int64{1, 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newLRU(tc.cap)
			for _, ids := range tc.touches {
				c.touchAll(ids)
				if c.count > tc.cap || len(c.slot) != c.count {
					t.Fatalf("count %d, map %d, cap %d", c.count, len(c.slot), tc.cap)
				}
			}
			if got := c.leadingRun(tc.query); got != tc.want {
				t.Fatalf("leadingRun(%v) = %d, want %d", tc.query, got, tc.want)
			}
		})
	}
}

// conversations builds a trace of n conversations of turns turns each,
// interleaved, one request every gap: every prompt starts with the global
// block 0, and turn k of a conversation extends turn k-1 by grow blocks.
func conversations(n, turns, grow int, gap time.Duration) []trace.Request {
	var out []trace.Request
	at := time.Duration(0)
	for k := 0; k < turns; k++ {
		for c := 0; c < n; c++ {
			blocks := 1 + (k+1)*grow
			ids := make([]int64, blocks)
			for b := 1; b < blocks; b++ {
				ids[b] = int64(1 + c*100000 + b)
			}
			out = append(out, trace.Request{Arrival: at, InputTokens: blocks * 512, OutputTokens: 10, HashIDs: ids})
			at += gap
		}
	}
	return out
}

func policy(t *testing.T, r Report, name string) PolicyReport {
	t.Helper()
	for _, p := range r.Policies {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no policy %q in report", name)
	return PolicyReport{}
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Load = 0
	return cfg
}

func TestTTFTGrowsWithQueueing(t *testing.T) {
	// One replica, requests of 10 distinct blocks (512 ms of prefill each):
	// spaced out they never wait; arriving together each waits for all
	// before it.
	mk := func(gap time.Duration) []trace.Request {
		var out []trace.Request
		for i := 0; i < 10; i++ {
			ids := make([]int64, 10)
			for b := range ids {
				ids[b] = int64(i*100 + b)
			}
			out = append(out, trace.Request{Arrival: time.Duration(i) * gap, InputTokens: 5120, OutputTokens: 5, HashIDs: ids})
		}
		return out
	}
	tests := []struct {
		name          string
		gap           time.Duration
		wantP99, tolP float64
		wantQueue     float64
	}{
		{"spaced", 10 * time.Second, 513, 0.01, 0},
		{"burst", 0, 10 * 513, 0.01, 513 * 4.5},
	}
	cfg := testConfig()
	cfg.Replicas, cfg.Routers = 1, 1
	cfg.Policies = []string{PolicyRoundRobin}
	cfg.CacheBlocks = 1000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Run(context.Background(), cfg, mk(tc.gap))
			if err != nil {
				t.Fatal(err)
			}
			p := r.Policies[0]
			if d := p.TTFTP99Ms - tc.wantP99; d > tc.tolP || d < -tc.tolP {
				t.Errorf("p99 %v ms, want %v", p.TTFTP99Ms, tc.wantP99)
			}
			if d := p.MeanQueueMs - tc.wantQueue; d > 0.01 || d < -0.01 {
				t.Errorf("mean queue %v ms, want %v", p.MeanQueueMs, tc.wantQueue)
			}
		})
	}
}

func TestMaxNumSeqsQueues(t *testing.T) {
	// Zero-prefill requests (fully cached after the first) with long decodes:
	// a cap of 1 makes each wait for the previous decode.
	reqs := []trace.Request{}
	for i := 0; i < 3; i++ {
		reqs = append(reqs, trace.Request{InputTokens: 512, OutputTokens: 100, HashIDs: []int64{1}})
	}
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheBlocks, cfg.MaxNumSeqs = 1, 1, 10, 1
	cfg.Policies = []string{PolicyRoundRobin}
	r, err := Run(context.Background(), cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	// Decode of 100 tokens is 2000 ms; the third waits for two of them
	// (plus two prefills).
	if p := r.Policies[0]; p.TTFTP99Ms < 4000 {
		t.Errorf("p99 %v ms with max-num-seqs 1, want >= 4000", p.TTFTP99Ms)
	}
}

func TestExactViewBeatsRoundRobinOnConversations(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 4, 2, 1
	r, err := Run(context.Background(), cfg, conversations(41, 5, 4, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rr, ex, mesh := policy(t, r, PolicyRoundRobin), policy(t, r, PolicyExactView), policy(t, r, PolicyMesh)
	t.Logf("hit: round-robin %.3f exact view %.3f mesh %.3f", rr.HitRatio, ex.HitRatio, mesh.HitRatio)
	if ex.HitRatio < rr.HitRatio || ex.HitRatio < 0.5 {
		t.Errorf("oracle hit %v, round-robin %v: want exact view >= both round-robin and 0.5", ex.HitRatio, rr.HitRatio)
	}
	if mesh.HitRatio <= rr.HitRatio {
		t.Errorf("mesh hit %v <= round-robin %v", mesh.HitRatio, rr.HitRatio)
	}
	for _, p := range r.Policies {
		if p.Requests != 205 {
			t.Errorf("%s served %d requests, want 205", p.Name, p.Requests)
		}
	}
}

func TestPartitionWindow(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 4, 2, 1
	cfg.Policies = []string{PolicyMesh, PolicyPartitioned}
	// 600 requests, 100 ms apart: a 60 s trace, cut from 15 s to 45 s.
	r, err := Run(context.Background(), cfg, conversations(100, 6, 2, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Config; c.PartitionStartMs != c.SpanMs/4 || c.PartitionEndMs != 3*c.SpanMs/4 {
		t.Errorf("partition [%v, %v) of span %v, want the middle half", c.PartitionStartMs, c.PartitionEndMs, c.SpanMs)
	}
	mesh, part := policy(t, r, PolicyMesh), policy(t, r, PolicyPartitioned)
	if mesh.FullCopies != 0 {
		t.Errorf("mesh needed %d full copies, want 0", mesh.FullCopies)
	}
	// After the heal every copy across the cut must be repaired once.
	if part.FullCopies < 1 {
		t.Errorf("partitioned mesh made %d full copies, want >= 1", part.FullCopies)
	}

	p, err := prepare(cfg, conversations(100, 6, 2, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{p: p, nR: 3, cut: true}
	for _, tc := range []struct {
		a, b int
		t    float64
		want bool
	}{
		{0, 1, 20000, true}, {1, 0, 20000, true}, {1, 2, 20000, false},
		{0, 2, 10000, false}, {0, 2, p.partEnd, false}, {0, 2, p.partStart, true},
	} {
		if got := w.partitioned(tc.a, tc.b, tc.t); got != tc.want {
			t.Errorf("partitioned(%d, %d, %v) = %v, want %v", tc.a, tc.b, tc.t, got, tc.want)
		}
	}
}

func TestDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 4, 3, 0.5
	reqs := conversations(30, 4, 3, 200*time.Millisecond)
	var out [2][]byte
	for i := range out {
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Fatalf("two runs differ:\n%s\n%s", out[0], out[1])
	}
}

func TestLoadScaling(t *testing.T) {
	// 10 requests of 10 distinct blocks, 1 s apart: round-robin computes
	// 10 × 513 ms of prefill over 2 replicas × 9 s.
	var reqs []trace.Request
	for i := 0; i < 10; i++ {
		ids := make([]int64, 10)
		for b := range ids {
			ids[b] = int64(i*100 + b)
		}
		reqs = append(reqs, trace.Request{Arrival: time.Duration(i) * time.Second, InputTokens: 5120, HashIDs: ids})
	}
	for _, load := range []float64{0.25, 0.5, 0.9} {
		cfg := DefaultConfig()
		cfg.Replicas, cfg.Load, cfg.Policies = 2, load, []string{PolicyRoundRobin}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		want := 10 * 513.0 / (2 * 9000 * load)
		if d := r.Config.TimeScale - want; d > 1e-9 || d < -1e-9 {
			t.Errorf("load %v: time scale %v, want %v", load, r.Config.TimeScale, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	reqs := conversations(2, 1, 1, time.Second)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"unknown policy", func(c *Config) { c.Policies = []string{"nope"} }},
		{"no replicas", func(c *Config) { c.Replicas = 0 }},
		{"no cache", func(c *Config) { c.CacheFraction = 0 }},
		{"zero prefill rate", func(c *Config) { c.PrefillTokensPerS = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mod(&cfg)
			if _, err := Run(context.Background(), cfg, reqs); err == nil {
				t.Fatal("Run accepted a bad config")
			}
		})
	}
	if _, err := Run(context.Background(), DefaultConfig(), nil); err == nil {
		t.Fatal("Run accepted an empty trace")
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, DefaultConfig(), conversations(50, 3, 2, time.Second)); err == nil {
		t.Fatal("Run ignored a cancelled context")
	}
}

func BenchmarkRunEmbedded(b *testing.B) {
	reqs := trace.EmbeddedConversationSlice()
	cfg := DefaultConfig()
	for b.Loop() {
		if _, err := Run(context.Background(), cfg, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLoadScalesOnTheBindingResource(t *testing.T) {
	// 10 requests of one 512-token block (51.2+1 ms of prefill) with 100
	// output tokens (2 s of decode), 1 s apart, on 2 replicas: prefill
	// binds with many slots, the slots bind with one.
	var reqs []trace.Request
	for i := 0; i < 10; i++ {
		reqs = append(reqs, trace.Request{Arrival: time.Duration(i) * time.Second, InputTokens: 512, OutputTokens: 100, HashIDs: []int64{int64(i)}})
	}
	prefill := 512/10000.0*1000 + 1
	tests := []struct {
		mns  int
		busy float64 // per request, ms of the binding resource
	}{
		{256, prefill},              // slot time / 256 < prefill
		{1, prefill + 100*20},       // one slot: prefill and decode
		{4, (prefill + 100*20) / 4}, // four slots
	}
	for _, tc := range tests {
		cfg := DefaultConfig()
		cfg.Replicas, cfg.Load, cfg.MaxNumSeqs, cfg.Policies = 2, 0.5, tc.mns, []string{PolicyRoundRobin}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		want := 10 * tc.busy / (2 * 9000 * 0.5)
		if d := r.Config.TimeScale - want; d > 1e-9 || d < -1e-9 {
			t.Errorf("max-num-seqs %d: time scale %v, want %v", tc.mns, r.Config.TimeScale, want)
		}
	}
}

func TestPooledBoundAndExactView(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 4, 2, 0.25
	cfg.Policies = []string{PolicyRoundRobin, PolicyExactView, PolicyPooled, PolicyMesh}
	r, err := Run(context.Background(), cfg, conversations(41, 5, 4, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rr, ex, pool := policy(t, r, PolicyRoundRobin), policy(t, r, PolicyExactView), policy(t, r, PolicyPooled)
	t.Logf("hit: round-robin %.3f exact view %.3f pooled %.3f", rr.HitRatio, ex.HitRatio, pool.HitRatio)
	if pool.HitRatio < ex.HitRatio || pool.HitRatio <= rr.HitRatio {
		t.Errorf("pooled bound hit %v below exact view %v or round-robin %v", pool.HitRatio, ex.HitRatio, rr.HitRatio)
	}
	if b := r.Best(); b.HitRatio == PolicyPooled || b.HitRatio == "" {
		t.Errorf("best of run %+v: the pooled bound is not a router and must not be named", b)
	}
	for _, p := range r.Policies {
		if p.TTFTMeanMs <= 0 || p.TTFTMeanMs < p.TTFTP50Ms/10 {
			t.Errorf("%s: mean TTFT %v with p50 %v", p.Name, p.TTFTMeanMs, p.TTFTP50Ms)
		}
	}
}

func TestGridVerdict(t *testing.T) {
	rep := func(mesh PolicyReport) Report {
		ps := []PolicyReport{
			{Name: PolicyRoundRobin, HitRatio: 0.1, TTFTP50Ms: 100, TTFTP99Ms: 1000},
			{Name: PolicyLeastLoaded, HitRatio: 0.1, TTFTP50Ms: 90, TTFTP99Ms: 1100},
			{Name: PolicyConsistentHash, HitRatio: 0.3, TTFTP50Ms: 80, TTFTP99Ms: 1200},
			{Name: PolicyLLMD, HitRatio: 0.5, TTFTP50Ms: 60, TTFTP99Ms: 900},
			{Name: PolicyDynamo, HitRatio: 0.4, TTFTP50Ms: 70, TTFTP99Ms: 800},
		}
		mesh.Name = PolicyMesh
		return Report{Policies: append(ps, mesh), Config: ConfigReport{Load: 0.6, MaxNumSeqs: 4, CacheFraction: 1}}
	}
	tests := []struct {
		name string
		mesh PolicyReport
		want Verdict
	}{
		{"wins everything", PolicyReport{HitRatio: 0.5, TTFTP50Ms: 60, TTFTP99Ms: 800},
			Verdict{true, true, true, true, true, true}},
		{"loses p50 to consistent hashing", PolicyReport{HitRatio: 0.5, TTFTP50Ms: 81, TTFTP99Ms: 800},
			Verdict{false, true, true, false, true, false}},
		{"low hit, p99 within 1.05x of the best peer", PolicyReport{HitRatio: 0.48, TTFTP50Ms: 60, TTFTP99Ms: 840},
			Verdict{true, true, false, true, false, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := judge("w", rep(tc.mesh))
			if err != nil {
				t.Fatal(err)
			}
			if c.PeerHit.Name != PolicyLLMD || c.PeerP99.Name != PolicyDynamo || c.BaseP50.Name != PolicyConsistentHash {
				t.Fatalf("best peer/baseline %+v %+v %+v", c.PeerHit, c.PeerP99, c.BaseP50)
			}
			if got := c.Verdict(); got != tc.want {
				t.Fatalf("verdict %+v, want %+v", got, tc.want)
			}
			var html bytes.Buffer
			if err := WriteHeatmap(&html, "t", []Cell{c}); err != nil || !bytes.Contains(html.Bytes(), []byte("<svg")) {
				t.Fatalf("heat-map: %v", err)
			}
		})
	}
	if _, err := judge("w", Report{Policies: []PolicyReport{{Name: PolicyRoundRobin}}}); err == nil {
		t.Fatal("judged a run without the mesh")
	}
}

// Three gossiping routers find a conversation's replica almost as often as
// one router that sees every request; three that cannot gossip do not.
func TestThreeRoutersAsGoodAsOne(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 6, 3, 1
	cfg.Policies = []string{PolicyMesh, PolicySingle, PolicyIsolated}
	r, err := Run(context.Background(), cfg, conversations(60, 5, 3, 150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mesh, single, iso := policy(t, r, PolicyMesh), policy(t, r, PolicySingle), policy(t, r, PolicyIsolated)
	t.Logf("retrace: mesh %.3f single %.3f isolated %.3f; hit %.3f %.3f %.3f", mesh.Retrace, single.Retrace, iso.Retrace, mesh.HitRatio, single.HitRatio, iso.HitRatio)
	if mesh.WarmRequests == 0 || mesh.Retrace < single.Retrace-0.03 || mesh.HitRatio < 0.95*single.HitRatio {
		t.Errorf("mesh retrace %v hit %v against one router's %v, %v", mesh.Retrace, mesh.HitRatio, single.Retrace, single.HitRatio)
	}
	if iso.Retrace >= mesh.Retrace {
		t.Errorf("isolated routers retrace %v >= mesh %v: the measure sees nothing", iso.Retrace, mesh.Retrace)
	}
}

// TestViewErrorMeasuresGossipLag checks the view-error diagnostic: when
// requests arrive together at all three routers, each places its share on
// the same gossiped snapshot, so a router's view of replicas it does not
// own misses the others' dispatches (in-flight under-counted, free slots
// that are taken); when they arrive one at a time, spaced beyond the
// gossip interval, every dispatch is gossiped before the next decision and
// no view shows a slot that is taken. A single router owns every replica
// and reports nothing.
func TestViewErrorMeasuresGossipLag(t *testing.T) {
	mk := func(perBurst int, gap time.Duration) []trace.Request {
		var out []trace.Request
		for b := 0; b < 40; b++ {
			for i := 0; i < perBurst; i++ {
				n := b*perBurst + i
				ids := []int64{int64(n*10 + 1), int64(n*10 + 2), int64(n*10 + 3), int64(n*10 + 4)}
				out = append(out, trace.Request{Arrival: time.Duration(b) * gap, InputTokens: 2048, OutputTokens: 100, HashIDs: ids})
			}
		}
		return out
	}
	cfg := testConfig()
	cfg.Policies = []string{PolicyMesh, PolicySingle}
	cfg.MaxNumSeqs, cfg.SlotsPublished, cfg.CacheBlocks = 2, true, 1000
	tests := []struct {
		name      string
		reqs      []trace.Request
		wantFalse bool // some view shows a free slot the engine lacks
	}{
		{"bursts of 12 at one instant", mk(12, 3*time.Second), true},
		{"one request a second", mk(1, time.Second), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Run(context.Background(), cfg, tc.reqs)
			if err != nil {
				t.Fatal(err)
			}
			mesh, single := policy(t, r, PolicyMesh), policy(t, r, PolicySingle)
			if single.ViewInFlightError != 0 || single.ViewFalseFree != 0 || single.ViewMissedFree != 0 {
				t.Errorf("single router reports a view error: %+v", single)
			}
			if got := mesh.ViewFalseFree > 0; got != tc.wantFalse {
				t.Errorf("mesh false-free share %v, want > 0: %v", mesh.ViewFalseFree, tc.wantFalse)
			}
			if tc.wantFalse && mesh.ViewInFlightError >= 0 {
				t.Errorf("mesh in-flight error %v, want < 0 (others' dispatches unseen)", mesh.ViewInFlightError)
			}
		})
	}
}

// The modelled admission holds requests in the entry router's queue once
// no replica has room in its view: with one router, which sees its
// engines exactly, the engines' queues stay within a place or so of
// AdmitMaxWaiting each (admission counts the places, routing picks the
// queue: a request let in for one replica's place may wait at a busier
// holder), and every request is still served. Without it, each burst
// queues in the engines.
// (The bursts begin after the owner's first scrape: until it has read an
// engine's slots, admission has no signal and lets every request in, as
// the router does.)
func TestAdmissionHoldsRequestsAtTheRouter(t *testing.T) {
	reqs := bursts(func(int) int { return 50 })
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.Load = 2, 1, 0
	cfg.MaxNumSeqs, cfg.SlotsPublished, cfg.CacheBlocks = 2, true, 1000
	cfg.Policies = []string{PolicySingle, PolicyMesh}
	for _, tc := range []struct {
		admit     int
		wantBound bool
	}{{0, false}, {1, true}} {
		cfg.AdmitMaxWaiting = tc.admit
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range cfg.Policies {
			p := policy(t, r, name)
			if p.Requests != len(reqs) {
				t.Errorf("admit %d, %s: served %d of %d", tc.admit, name, p.Requests, len(reqs))
			}
			bound := cfg.Replicas * 2 // (AdmitMaxWaiting + 1) per replica
			if got := p.MaxQueued <= bound; got != tc.wantBound {
				t.Errorf("admit %d, %s: most queued in the engines %d, want <= %d: %v", tc.admit, name, p.MaxQueued, bound, tc.wantBound)
			}
		}
	}
}

// With late binding the owners hold what their engines cannot start and
// send it when a slot frees: no engine ever queues, and every request is
// served (each burst here is three times the cluster's slots). An owner
// of a single replica holds nothing: its queue would be that engine's.
func TestLateBindingKeepsTheQueuesAtTheOwners(t *testing.T) {
	reqs := bursts(func(n int) int { return 20 + 40*(n%5) })
	cfg := testConfig()
	cfg.Replicas, cfg.Load = 2, 0
	cfg.MaxNumSeqs, cfg.SlotsPublished, cfg.CacheBlocks = 2, true, 1000
	cfg.Policies = []string{PolicySingle, PolicyMesh}
	for _, routers := range []int{1, 2} {
		cfg.Routers = routers
		for _, late := range []bool{false, true} {
			cfg.LateBind = late
			r, err := Run(context.Background(), cfg, reqs)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range cfg.Policies {
				p := policy(t, r, name)
				if p.Requests != len(reqs) {
					t.Errorf("%d routers, late %v, %s: served %d of %d", routers, late, name, p.Requests, len(reqs))
				}
				held := late && (routers == 1 || name == PolicySingle)
				if got := p.MaxQueued == 0; got != held {
					t.Errorf("%d routers, late %v, %s: most queued in the engines %d", routers, late, name, p.MaxQueued)
				}
			}
		}
	}
}

// bursts is 10 bursts of 12 requests of distinct prompts, 3 s apart,
// request n answering output(n) tokens, after a lone request at 0 that
// starts the owners' scrapes (until an engine's slots are read, the
// router lets every request through).
func bursts(output func(n int) int) []trace.Request {
	reqs := []trace.Request{{InputTokens: 512, OutputTokens: 1, HashIDs: []int64{-1}}}
	for b := 0; b < 10; b++ {
		for i := 0; i < 12; i++ {
			n := b*12 + i
			reqs = append(reqs, trace.Request{Arrival: time.Duration(b+1) * 3 * time.Second, InputTokens: 1024,
				OutputTokens: output(n), HashIDs: []int64{int64(n*10 + 1), int64(n*10 + 2)}})
		}
	}
	return reqs
}

// An owner that reads an engine of unknown slots as soon as it sends it
// more than it was seen running (the router's health.Checker.ProbeLoad)
// learns the slots at the engine's first queue, where scheduled scrapes
// (an hour apart here) would not: eight requests at 1 s on the 4 slots
// queue four, and late binding, which holds requests only for engines of
// known slots, then keeps the bursts of 12 after them out of the
// engines' queues.
func TestProbedSlotsAreLearntAtTheFirstQueue(t *testing.T) {
	reqs := bursts(func(n int) int { return 20 + 40*(n%5) })
	first := make([]trace.Request, 8)
	for i := range first {
		first[i] = trace.Request{Arrival: time.Second, InputTokens: 1024, OutputTokens: 50, HashIDs: []int64{int64(-10 - i)}}
	}
	reqs = slices.Insert(reqs, 1, first...)
	cfg := testConfig()
	cfg.Replicas, cfg.Load = 2, 0
	cfg.MaxNumSeqs, cfg.CacheBlocks, cfg.ScrapeInterval = 2, 1000, time.Hour
	cfg.LateBind, cfg.Routers = true, 1
	cfg.Policies = []string{PolicyMesh}
	for _, probe := range []bool{false, true} {
		cfg.ProbeSlots = probe
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		p := policy(t, r, PolicyMesh)
		if p.Requests != len(reqs) {
			t.Errorf("probe %v: served %d of %d", probe, p.Requests, len(reqs))
		}
		if got := p.MaxQueued <= 4; got != probe {
			t.Errorf("probe %v: most queued in the engines %d", probe, p.MaxQueued)
		}
	}
}

// Load beacons (Config.LoadInterval) carry an owner's in-flight counts
// between the summary ticks: with the summaries a second apart, the other
// routers' view of a replica's requests in flight is off by the
// dispatches and ends of that second; beaconed every 20 ms it is off by a
// fraction of that. Without the beacons the two runs would be the same.
func TestLoadBeaconsFreshenTheView(t *testing.T) {
	var reqs []trace.Request
	for n := 0; n < 300; n++ {
		ids := []int64{int64(n*10 + 1), int64(n*10 + 2)}
		reqs = append(reqs, trace.Request{Arrival: time.Duration(n) * 30 * time.Millisecond, InputTokens: 1024, OutputTokens: 40, HashIDs: ids})
	}
	run := func(li time.Duration) PolicyReport {
		cfg := testConfig()
		cfg.Policies = []string{PolicyMesh}
		cfg.Routers, cfg.Replicas, cfg.CacheBlocks = 4, 4, 1000
		cfg.GossipInterval, cfg.GossipDelay, cfg.LoadInterval = time.Second, time.Millisecond, li
		cfg.StaleAfter = 5 * time.Second
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return policy(t, r, PolicyMesh)
	}
	without, with := run(0), run(20*time.Millisecond)
	t.Logf("view in-flight |error|: %.3f without beacons, %.3f with", without.ViewInFlightAbsError, with.ViewInFlightAbsError)
	if !(with.ViewInFlightAbsError < without.ViewInFlightAbsError/2) {
		t.Errorf("view in-flight |error| %.3f with beacons, want under half of %.3f without", with.ViewInFlightAbsError, without.ViewInFlightAbsError)
	}
}

// TestLoadBeaconsWakeOnAChange: the router's beacon loop sends a load
// change at once when its last beacon is an interval old (mesh/beacon.go),
// not at the next tick of a clock. Pairs of requests 50 ms apart at two
// routers, pairs 3.3 s apart, beacons at most every second, states every
// 10 s: the second of a pair sees the first's dispatch only if a beacon
// went in between, which a one-second ticker does for about one pair in
// twenty and a woken loop for every pair.
func TestLoadBeaconsWakeOnAChange(t *testing.T) {
	var reqs []trace.Request
	for n := 0; n < 40; n++ {
		at := time.Duration(n/2)*3300*time.Millisecond + time.Duration(n%2)*50*time.Millisecond
		ids := []int64{int64(n*10 + 1), int64(n*10 + 2)}
		reqs = append(reqs, trace.Request{Arrival: at, InputTokens: 1024, OutputTokens: 40, HashIDs: ids})
	}
	run := func(li time.Duration) PolicyReport {
		cfg := testConfig()
		cfg.Policies = []string{PolicyMesh}
		cfg.Routers, cfg.Replicas, cfg.CacheBlocks = 2, 2, 1000
		cfg.GossipInterval, cfg.GossipDelay, cfg.LoadInterval = 10*time.Second, time.Millisecond, li
		cfg.StaleAfter = 30 * time.Second
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return policy(t, r, PolicyMesh)
	}
	without, with := run(0), run(time.Second)
	t.Logf("view in-flight |error|: %.3f without beacons, %.3f with beacons at most every second", without.ViewInFlightAbsError, with.ViewInFlightAbsError)
	if !(without.ViewInFlightAbsError > 0 && with.ViewInFlightAbsError < without.ViewInFlightAbsError/4) {
		t.Errorf("view in-flight |error| %.3f with beacons, want under a quarter of %.3f without", with.ViewInFlightAbsError, without.ViewInFlightAbsError)
	}
}
