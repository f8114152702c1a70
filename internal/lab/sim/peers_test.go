package sim

import (
	"context"
	"slices"
	"testing"
	"time"
)

// first breaks ties by the lowest index, so a table can name the winner.
func first(int) int { return 0 }

// last breaks ties by the highest index: a case whose answer changes with
// it has a tie.
func last(k int) int { return k - 1 }

func TestSGLangPick(t *testing.T) {
	tests := []struct {
		name       string
		load       []int
		match      []int
		tree       []int
		n          int
		want       int
		wantReason string
	}{
		// max−min = 70 > 64 and 80 > 1.5×10: shortest queue, even though
		// replica 0 holds the whole prompt.
		{"imbalanced goes to shortest queue", []int{80, 10, 40}, []int{10, 0, 0}, []int{5, 9, 1}, 10, 1, "imbalanced"},
		// max−min = 65 > 64 but 200 ≤ 1.5×135 = 202.5: both must hold.
		{"abs exceeded but rel not: balanced", []int{200, 135, 150}, []int{0, 0, 8}, []int{5, 9, 1}, 10, 2, "cache-hit"},
		{"rel exceeded but abs not: balanced", []int{60, 1, 30}, []int{0, 0, 4}, []int{5, 9, 1}, 10, 2, "cache-hit"},
		// match rate 4/10 = 0.4 > 0.3: best match.
		{"match above threshold", []int{0, 0, 0}, []int{1, 4, 2}, []int{1, 9, 9}, 10, 1, "cache-hit"},
		// 3/10 is not above 0.3: smallest tree.
		{"match at threshold goes to smallest tree", []int{0, 0, 0}, []int{3, 1, 0}, []int{7, 9, 2}, 10, 2, "cache-miss"},
		{"cold request goes to smallest tree", []int{5, 0, 0}, []int{0, 0, 0}, []int{0, 9, 3}, 4, 0, "cache-miss"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := sglangPick(sglangCLI, tc.load, tc.match, tc.tree, tc.n, first, nil)
			if got != tc.want || why != tc.wantReason {
				t.Fatalf("sglangPick = %d %q, want %d %q", got, why, tc.want, tc.wantReason)
			}
		})
	}
}

func TestDynamoPick(t *testing.T) {
	tests := []struct {
		name          string
		weight        float64
		match, active []int
		n             int
		want          int
		wantLast      int // with ties broken the other way
	}{
		// costs: 10+0, 2+3, 6+0 → replica 1.
		{"overlap beats idle", 1, []int{0, 8, 4}, []int{0, 3, 0}, 10, 1, 1},
		// costs: 10+0, 2+20 → the idle replica; decode load outweighs the hit.
		{"decode load beats overlap", 1, []int{0, 8}, []int{0, 20}, 10, 0, 0},
		// weight 4: 40+0 against 8+20 → the hit.
		{"higher overlap weight keeps the hit", 4, []int{0, 8}, []int{0, 20}, 10, 1, 1},
		// costs 10+3 = 13 and 7+6 = 13: a tie, broken by the picker.
		{"equal cost is a tie", 1, []int{0, 3, 0}, []int{3, 6, 9}, 10, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := dynamoPick(tc.weight, tc.match, tc.active, tc.n, first, nil); got != tc.want {
				t.Errorf("dynamoPick = %d, want %d", got, tc.want)
			}
			if got := dynamoPick(tc.weight, tc.match, tc.active, tc.n, last, nil); got != tc.wantLast {
				t.Errorf("dynamoPick (last tie) = %d, want %d", got, tc.wantLast)
			}
		})
	}
}

func TestEPPPick(t *testing.T) {
	tests := []struct {
		name  string
		match []int
		n     int
		queue []int
		usage []float64
		want  int
	}{
		// All queues equal (score 1 each), equal usage: prefix decides.
		{"prefix decides when load is equal", []int{2, 8, 0}, 8, []int{3, 3, 3}, []float64{0.5, 0.5, 0.5}, 1},
		// 3×1 + 2×0 (longest queue) + 2×1 = 5 against 3×0.5 + 2×1 + 2×1 = 5.5.
		{"queue outweighs a full match over a half match", []int{8, 4}, 8, []int{4, 0}, []float64{0, 0}, 1},
		// Queues 10, 9, 9 score 0, 1, 1: 3×1 + 0 + 2 = 5, 3×0.75 + 2 + 2 =
		// 6.25, 3×0.25 + 2 + 2 = 4.75.
		{"normalised queue: only the range matters", []int{8, 6, 2}, 8, []int{10, 9, 9}, []float64{0, 0, 0}, 1},
		// usage 0.9 costs 1.8: 3 + 2 + 0.2 = 5.2 against 0 + 2 + 2 = 4.
		{"kv utilisation", []int{8, 0}, 8, []int{0, 0}, []float64{0.9, 0}, 0},
		// usage above 1 is clamped, so the score stays in [0,1].
		{"usage clamped", []int{0, 0}, 8, []int{0, 0}, []float64{1.7, 1}, 0},
		{"cold and idle: tie at lowest index", []int{0, 0, 0}, 8, []int{0, 0, 0}, []float64{0, 0, 0}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := eppPick(eppDefault, tc.match, tc.n, tc.queue, tc.usage, first, nil); got != tc.want {
				t.Fatalf("eppPick = %d, want %d", got, tc.want)
			}
		})
	}
	if eppMaxPrefixBlocks != 8 {
		t.Errorf("eppMaxPrefixBlocks = %d, want 8 (4,096 tokens of 512-token blocks)", eppMaxPrefixBlocks)
	}
}

func TestProdStackPick(t *testing.T) {
	tests := []struct {
		name       string
		match      []int
		minBlocks  int
		qps        []float64
		tie        func(int) int
		want       int
		wantReason string
	}{
		{"longest match", []int{1, 3, 2}, 0, []float64{0, 9, 0}, last, 1, "prefix"},
		{"random among the longest", []int{3, 1, 3}, 0, []float64{0, 0, 0}, last, 2, "prefix"},
		// No match: every endpoint is a candidate (the HashTrie returns
		// all available endpoints), not the least loaded.
		{"no match is random among all", []int{0, 0, 0}, 0, []float64{5, 0, 1}, last, 2, "no-match"},
		{"below the minimum: lowest QPS", []int{1, 0, 0}, 2, []float64{5, 2, 1}, first, 2, "qps"},
		{"below the minimum: endpoint without stats first", []int{1, 0, 0}, 2, []float64{5, -1, 0}, first, 1, "qps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := prodStackPick(tc.match, tc.minBlocks, tc.qps, tc.tie, nil)
			if got != tc.want || why != tc.wantReason {
				t.Fatalf("prodStackPick = %d %q, want %d %q", got, why, tc.want, tc.wantReason)
			}
		})
	}
}

func TestLRUTouchInOrderEvictsHeadFirst(t *testing.T) {
	// Capacity 3: {1,2,3} in prompt order then {9}: 1, the head, is the
	// least recent and goes, killing the match; touchAll would have kept it.
	tests := []struct {
		name    string
		inOrder bool
		want    int
	}{
		{"in order", true, 0},
		{"tail first", false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newLRU(3)
			for _, ids := range [][]int64{{1, 2, 3}, {9}} {
				if tc.inOrder {
					c.touchInOrder(ids)
				} else {
					c.touchAll(ids)
				}
			}
			if got := c.leadingRun([]int64{1, 2, 3}); got != tc.want {
				t.Fatalf("leadingRun = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPeerModelsInTheWorld(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.Routers, cfg.CacheFraction = 4, 3, 1
	cfg.Policies = []string{PolicyRoundRobin, PolicySGLang, PolicyDynamo, PolicyLLMD, PolicyProductionStack}
	reqs := conversations(41, 5, 4, 300*time.Millisecond)
	r, err := Run(context.Background(), cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	rr := policy(t, r, PolicyRoundRobin)
	for _, p := range r.Policies {
		if p.Requests != len(reqs) {
			t.Errorf("%s served %d requests, want %d", p.Name, p.Requests, len(reqs))
		}
	}
	// Every prompt starts with the global block 0 and production-stack has
	// no load term: once one endpoint holds block 0 it is the only one
	// with the longest match, so every request lands there.
	ps := policy(t, r, PolicyProductionStack)
	if ps.PrefillMaxOverMean < 3.99 {
		t.Errorf("production-stack prefill max/mean %.2f, want 4 (all on one of 4 replicas)", ps.PrefillMaxOverMean)
	}
	// The exact-view and single-instance models must keep more of the
	// conversations' history than round-robin.
	for _, name := range []string{PolicyDynamo, PolicyLLMD} {
		if p := policy(t, r, name); p.HitRatio <= rr.HitRatio {
			t.Errorf("%s hit %.3f <= round-robin %.3f", name, p.HitRatio, rr.HitRatio)
		}
	}
	sg := policy(t, r, PolicySGLang)
	if got := sg.Reasons["cache-hit"] + sg.Reasons["cache-miss"] + sg.Reasons["imbalanced"]; got != len(reqs) {
		t.Errorf("sglang reasons %v sum to %d, want %d", sg.Reasons, got, len(reqs))
	}
	if !slices.Contains(AllPolicies, PolicySGLang) || AllPolicies[len(AllPolicies)-6] != PolicySGLang {
		t.Errorf("AllPolicies %v: the peer models must follow the existing policies", AllPolicies)
	}
}

func TestSGLangRoutersLearnAlone(t *testing.T) {
	// One conversation of turns of 5, 9, 13, 17, 21, 25 blocks, 1 s apart,
	// 2 replicas: with one router every later turn finds the previous one
	// (match rate > 0.3). With three routers in turn a router sees every
	// third turn: turns 1-3 are cold, turn 4 finds only turn 1 (5/17 <
	// 0.3), turns 5 and 6 find turns 2 and 3 (9/21, 13/25).
	reqs := conversations(1, 6, 4, time.Second)
	tests := []struct {
		routers  int
		wantHits int
	}{
		{1, 5},
		{3, 2},
	}
	for _, tc := range tests {
		cfg := testConfig()
		cfg.Replicas, cfg.Routers, cfg.CacheBlocks = 2, tc.routers, 1000
		cfg.Policies = []string{PolicySGLang}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Policies[0].Reasons["cache-hit"]; got != tc.wantHits {
			t.Errorf("%d routers: %d cache-hit decisions (%v), want %d", tc.routers, got, r.Policies[0].Reasons, tc.wantHits)
		}
	}
}

func TestSMGMeshSyncsTrees(t *testing.T) {
	// The conversation of TestSGLangRoutersLearnAlone (turns 1 s apart,
	// three routers in turn): a tree shared at once (interval 0) or
	// synced faster than the turns come finds every later turn; synced
	// less often than the whole conversation lasts, each router learns
	// alone, as sglang-router does.
	reqs := conversations(1, 6, 4, time.Second)
	tests := []struct {
		sync     time.Duration
		wantHits int
	}{
		{0, 5},
		{100 * time.Millisecond, 5},
		{time.Minute, 2},
	}
	for _, tc := range tests {
		cfg := testConfig()
		cfg.Replicas, cfg.Routers, cfg.CacheBlocks = 2, 3, 1000
		cfg.SMGSyncInterval = tc.sync
		cfg.Policies = []string{PolicySMGMesh}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Policies[0].Reasons["cache-hit"]; got != tc.wantHits {
			t.Errorf("sync %v: %d cache-hit decisions (%v), want %d", tc.sync, got, r.Policies[0].Reasons, tc.wantHits)
		}
	}
}

func TestEPPRefreshLagHerdsABurst(t *testing.T) {
	// 16 first turns at one instant over 4 idle replicas, every prompt
	// starting with the global block 0. Read at every decision, the EPP's
	// queue gauge shows each dispatch at once and outweighs the prefix
	// score of block 0, so the burst spreads evenly; refreshed every 50 ms,
	// as the EPP's metrics are, the gauges stay at the burst's start and
	// block 0's holder wins every request of it.
	reqs := conversations(16, 1, 4, 0)
	tests := []struct {
		refresh time.Duration
		want    float64 // prefill max/mean over the 4 replicas
	}{
		{0, 1},
		{50 * time.Millisecond, 4},
	}
	for _, tc := range tests {
		cfg := testConfig()
		cfg.Replicas, cfg.CacheBlocks, cfg.MaxNumSeqs = 4, 1000, 1
		cfg.EPPRefreshInterval = tc.refresh
		cfg.Policies = []string{PolicyLLMD}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Policies[0].PrefillMaxOverMean; got < tc.want-0.01 || got > tc.want+0.01 {
			t.Errorf("refresh %v: prefill max/mean %.2f, want %.2f", tc.refresh, got, tc.want)
		}
	}
}
