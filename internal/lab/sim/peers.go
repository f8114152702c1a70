package sim

// Models of the peer routers' published decision rules, so that kvmesh can
// be compared with them on the same arrivals and the same simulated
// replicas. Each is our own re-implementation of the rule as written down
// in /work/shared/research/peers.md (section cited per policy), run in the
// sim's world; none is the peer's code, and none models the peer's
// transport, tokenizer or metrics pipeline. The names say "model" in the
// docs for that reason.
//
// Units: the sim's block is the trace's 512 tokens. Peer constants given in
// engine blocks (16 tokens) or characters are converted where they matter
// and the conversion is stated where it is made.
//
// Ties: where the real picker breaks ties at random (Dynamo's argmin, the
// GIE max-score picker's shuffle, production-stack's random.choice) or in
// hash-map order (SGLang's tenant maps), the model breaks them uniformly by
// a seeded hash of the request index, so runs stay deterministic.

import (
	"math"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// Names of the peer-router models, appended to AllPolicies.
const (
	PolicySGLang          = "sglang-router"    // model of SGLang router/SMG cache_aware, one per router, no mesh
	PolicyDynamo          = "dynamo-kv"        // model of Dynamo's KV router with KV events (exact view)
	PolicyLLMD            = "llm-d-epp"        // model of the GIE/llm-d EPP with the approximate prefix scorer
	PolicyLLMD3           = "llm-d-epp-3"      // the same with three active EPPs, each learning alone
	PolicySMGMesh         = "smg-mesh"         // SGLang's rule, the routers' trees synced every Config.SMGSyncInterval
	PolicyProductionStack = "production-stack" // model of vLLM production-stack prefixaware routing
)

// sglangParams is the cache_aware policy's configuration. peers.md §1,
// "Defaults (they differ by entry point)": the smg CLI (clap) defaults are
// cache_threshold 0.3, balance_abs 64, balance_rel 1.5; the library
// CacheAwareConfig::default() is 0.5 / 32 / 1.1. The model uses the CLI
// row, the one a user launching the router gets (the brief suggested
// cache_threshold 0.5; peers.md gives 0.3 for the CLI, so 0.3).
type sglangParams struct {
	cacheThreshold float64
	balanceAbs     int
	balanceRel     float64
}

var sglangCLI = sglangParams{cacheThreshold: 0.3, balanceAbs: 64, balanceRel: 1.5}

// sglangPick is SGLang's cache_aware decision (peers.md §1, "Decision and
// load-balance formula") over one router's own view: load[j] is that
// router's in-flight count at replica j, match[j] the leading run of the
// request's n blocks in its index of replica j, tree[j] the size of that
// index. Imbalanced iff max−min > abs AND max > rel×min: shortest queue.
// Otherwise match_rate = best match / n; above cache_threshold the
// best-matching replica, else the smallest tree. tie picks among k tied
// candidates.
func sglangPick(prm sglangParams, load, match, tree []int, n int, tie func(k int) int, buf []int) (int, string) {
	minL, maxL := load[0], load[0]
	for _, l := range load[1:] {
		minL, maxL = min(minL, l), max(maxL, l)
	}
	if maxL-minL > prm.balanceAbs && float64(maxL) > prm.balanceRel*float64(minL) {
		return pickMin(load, tie, buf), "imbalanced"
	}
	best := 0
	for _, m := range match {
		best = max(best, m)
	}
	if n > 0 && float64(best)/float64(n) > prm.cacheThreshold {
		return pickMax(match, tie, buf), "cache-hit"
	}
	return pickMin(tree, tie, buf), "cache-miss"
}

// dynamoPick is Dynamo's KV router cost (peers.md §2, "Cost function and
// defaults"): cost = overlap_score_weight × prefill_blocks + decode_blocks
// with prefill_blocks = n − match[j] (the blocks the worker must compute)
// and decode_blocks = active[j] (blocks of the requests in flight there);
// temperature 0 means argmin. Both terms are in blocks, so the sim's
// 512-token blocks scale the cost uniformly and leave the argmin where
// 16-token blocks would put it (up to rounding of partial blocks).
func dynamoPick(weight float64, match, active []int, n int, tie func(k int) int, buf []int) int {
	best := math.Inf(1)
	buf = buf[:0]
	for j := range match {
		c := weight*float64(n-match[j]) + float64(active[j])
		switch {
		case c < best:
			best, buf = c, append(buf[:0], j)
		case c == best:
			buf = append(buf, j)
		}
	}
	return buf[tie(len(buf))]
}

// eppWeights are the GIE EPP default scorer weights (peers.md §3, "Default
// weights", pkg/epp/config/loader/defaults.go): queue 2, kv-cache
// utilization 2, prefix-cache 3.
type eppWeights struct{ prefix, queue, kv float64 }

var eppDefault = eppWeights{prefix: 3, queue: 2, kv: 2}

// eppMaxPrefixBlocks is GIE's defaultMaxPrefixBlocks = 256 blocks of 16
// tokens (peers.md §3, "Defaults"): only the first 4,096 tokens of a prompt
// are hashed, recorded and scored, which is 8 of the sim's 512-token blocks.
const eppMaxPrefixBlocks = 256 * 16 / trace.MooncakeBlockTokens

// eppPick is the EPP's weighted scoring with the max-score picker
// (peers.md §3, "Approximate prefix cache" and "Other scorers"): prefix =
// match[j]/n (n already capped at eppMaxPrefixBlocks), queue = (maxQ −
// q)/(maxQ − minQ) (1 for all when every queue is equal), kv utilization
// = 1 − usage[j]; each in [0,1], weighted sum, highest wins.
func eppPick(wt eppWeights, match []int, n int, queue []int, usage []float64, tie func(k int) int, buf []int) int {
	minQ, maxQ := queue[0], queue[0]
	for _, q := range queue[1:] {
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	best := math.Inf(-1)
	buf = buf[:0]
	for j := range match {
		prefix := 0.0
		if n > 0 {
			prefix = float64(match[j]) / float64(n)
		}
		qs := 1.0
		if maxQ > minQ {
			qs = float64(maxQ-queue[j]) / float64(maxQ-minQ)
		}
		kv := 1 - min(max(usage[j], 0), 1)
		s := wt.prefix*prefix + wt.queue*qs + wt.kv*kv
		switch {
		case s > best:
			best, buf = s, append(buf[:0], j)
		case s == best:
			buf = append(buf, j)
		}
	}
	return buf[tie(len(buf))]
}

// prodStackPick is production-stack's prefixaware routing (peers.md §4,
// "Routing logics"): the longest match over what it routed, a random
// endpoint among those holding it; below prefix_min_match_length the
// lowest-QPS endpoint instead. With no match at all every endpoint holds
// the (empty) longest prefix, so the pick is random among all, as the
// HashTrie returns every available endpoint. minBlocks is the minimum in
// blocks; the router's default prefix_min_match_length is 0 characters,
// so the QPS path only runs when it is raised. qps[j] < 0 marks an
// endpoint with no request stats, which the QPS routine returns at once.
func prodStackPick(match []int, minBlocks int, qps []float64, tie func(k int) int, buf []int) (int, string) {
	best := 0
	for _, m := range match {
		best = max(best, m)
	}
	if best < minBlocks {
		// _qps_routing: the first endpoint without stats, else the first
		// with the strictly lowest QPS.
		j, low := 0, math.Inf(1)
		for i, q := range qps {
			if q < 0 {
				return i, "qps"
			}
			if q < low {
				j, low = i, q
			}
		}
		return j, "qps"
	}
	reason := "prefix"
	if best == 0 {
		reason = "no-match"
	}
	return pickMax(match, tie, buf), reason
}

// pickMin returns a tie-broken argmin of v; pickMax an argmax.
func pickMin(v []int, tie func(k int) int, buf []int) int {
	buf = buf[:0]
	for j, x := range v {
		if len(buf) == 0 || x < v[buf[0]] {
			buf = append(buf[:0], j)
		} else if x == v[buf[0]] {
			buf = append(buf, j)
		}
	}
	return buf[tie(len(buf))]
}

func pickMax(v []int, tie func(k int) int, buf []int) int {
	buf = buf[:0]
	for j, x := range v {
		if len(buf) == 0 || x > v[buf[0]] {
			buf = append(buf[:0], j)
		} else if x == v[buf[0]] {
			buf = append(buf, j)
		}
	}
	return buf[tie(len(buf))]
}

// peerState is the learned state of the peer models in one world.
type peerState struct {
	// idx[k][j] is router k's index of what it routed to replica j
	// (sglang-router: one per router; llm-d-epp: one router).
	idx [][]*lru
	// load[k][j] is router k's own in-flight count at replica j
	// (sglang-router).
	load [][]int
	// unsent[k] lists the (request, replica) inserts smg-mesh router k
	// made into its own tree since the last sync, in order.
	unsent [][]smgInsert
	// seen[j] is production-stack's never-evicted record of the blocks it
	// routed to replica j.
	seen []map[int64]struct{}
	// sent[j] holds the dispatch times, oldest first, of production-stack's
	// requests to replica j inside its QPS window.
	sent [][]float64

	match, tree, queue, active []int
	usage, qps                 []float64
	buf                        []int

	// eppNext[e] is the virtual time (ms) from which EPP e refreshes its
	// engine gauges again (Config.EPPRefreshInterval); eppQueue[e] and
	// eppUsage[e] hold them between refreshes. llm-d-epp has one EPP,
	// llm-d-epp-3 one per router, each with its own scraper.
	eppNext  []float64
	eppQueue [][]int
	eppUsage [][]float64
}

// smgInsert is one tree insert an smg-mesh router has not yet synced.
type smgInsert struct{ req, replica int32 }

// smgSynced reports whether smg-mesh runs one tree per router, synced
// every Config.SMGSyncInterval, rather than one tree shared at once.
func (w *world) smgSynced() bool {
	return w.policy == PolicySMGMesh && w.p.cfg.SMGSyncInterval > 0
}

// smgSync applies every smg-mesh router's unsent inserts to the other
// routers' trees, as SMG's mesh delivers the tree operations of the last
// interval, and schedules the next sync while requests still arrive.
func (w *world) smgSync(more bool) {
	ps := w.peer
	for k, ops := range ps.unsent {
		for _, op := range ops {
			ids := w.p.reqs[op.req].ids
			for o := range ps.idx {
				if o != k {
					ps.idx[o][op.replica].touchAll(ids)
				}
			}
		}
		ps.unsent[k] = ops[:0]
	}
	if more {
		w.q.push(w.now+ms(w.p.cfg.SMGSyncInterval.Seconds()), evSMGSync, 0, 0)
	}
}

// prodStackQPSWindowMs is production-stack's request-stats sliding window,
// 60 s (peers.md §4, "Stats"), in virtual time.
const prodStackQPSWindowMs = 60_000

// makePeer builds the state of a peer model. sglang-router learns alone
// per router, bounded like SGLang's tree by eviction: the model holds an
// exact set per (router, replica) with the replica's capacity C and the
// replica's own eviction order (tail first, as SGLang evicts LRU leaves);
// the real bound is max_tree_size characters for the whole tree (2^26 on
// the CLI), which does not know C. llm-d-epp's per-server LRU uses C too:
// with autoTune (default) GIE reads the capacity from
// vllm:cache_config_info, the engine's real block count, instead of the
// 31,250-block default (≈ 977 of the sim's blocks).
func (w *world) makePeer() {
	cfg := w.p.cfg
	R := cfg.Replicas
	ps := &peerState{match: make([]int, R), tree: make([]int, R), queue: make([]int, R), active: make([]int, R),
		usage: make([]float64, R), qps: make([]float64, R), buf: make([]int, 0, R)}
	switch w.policy {
	case PolicySGLang, PolicySMGMesh, PolicyLLMD, PolicyLLMD3:
		ps.idx = make([][]*lru, w.nR)
		ps.load = make([][]int, w.nR)
		for k := range ps.idx {
			ps.idx[k] = make([]*lru, R)
			for j := range ps.idx[k] {
				ps.idx[k][j] = newLRU(w.p.cacheBlocks)
			}
			ps.load[k] = make([]int, R)
		}
		if w.smgSynced() {
			ps.unsent = make([][]smgInsert, w.nR)
		}
		ps.eppNext = make([]float64, w.nR)
		ps.eppQueue, ps.eppUsage = make([][]int, w.nR), make([][]float64, w.nR)
		for k := range ps.eppQueue {
			ps.eppQueue[k], ps.eppUsage[k] = make([]int, R), make([]float64, R)
		}
	case PolicyProductionStack:
		ps.seen = make([]map[int64]struct{}, R)
		for j := range ps.seen {
			ps.seen[j] = map[int64]struct{}{}
		}
		ps.sent = make([][]float64, R)
	}
	w.peer = ps
}

// tie returns a function choosing uniformly among k tied candidates for
// request i, seeded so runs repeat.
func (w *world) tie(i int32) func(k int) int {
	return func(k int) int {
		if k <= 1 {
			return 0
		}
		return int(splitmix64(w.p.cfg.Seed^0x7065657273^uint64(i)<<1) % uint64(k))
	}
}

// peerArrive routes request i, arriving at router k, under a peer model
// and records what that model learns from its own decision.
func (w *world) peerArrive(k int, i int32) int {
	r := &w.p.reqs[i]
	ps := w.peer
	n := len(r.ids)
	tie := w.tie(i)
	var j int
	switch w.policy {
	case PolicySGLang, PolicySMGMesh:
		// sglang-router learns alone per router. smg-mesh: each
		// router inserts into its own tree at once and sends the inserts
		// to the others every SMGSyncInterval (smgSync), as SMG's mesh
		// does; with the interval 0, every router's tree is one exact
		// tree updated at once (no sync delay). Load stays each router's
		// own in-flight count, as in SMG.
		idx := ps.idx[k]
		if w.policy == PolicySMGMesh && !w.smgSynced() {
			idx = ps.idx[0]
		}
		for o := range idx {
			ps.match[o] = idx[o].leadingRun(r.ids)
			ps.tree[o] = idx[o].count
		}
		var why string
		j, why = sglangPick(sglangCLI, ps.load[k], ps.match, ps.tree, n, tie, ps.buf)
		w.reasons[why]++
		// The request is inserted under the chosen worker on every path,
		// the imbalanced one included (peers.md §1).
		idx[j].touchAll(r.ids)
		if ps.unsent != nil {
			ps.unsent[k] = append(ps.unsent[k], smgInsert{req: i, replica: int32(j)})
		}
		ps.load[k][j]++
	case PolicyDynamo:
		for o, rep := range w.rep {
			ps.match[o] = rep.cache.leadingRun(r.ids)
			ps.active[o] = rep.activeBlocks
		}
		j = dynamoPick(1, ps.match, ps.active, n, tie, ps.buf)
	case PolicyLLMD, PolicyLLMD3:
		head := r.ids[:min(n, eppMaxPrefixBlocks)]
		// One active EPP (HA is active-passive), or, for llm-d-epp-3,
		// three active ones: approximate state is not shared between
		// EPPs (peers.md §3, #1892), so each learns from its own third.
		e := 0
		if w.policy == PolicyLLMD3 {
			e = k
		}
		idx, queue, usage := ps.idx[e], ps.eppQueue[e], ps.eppUsage[e]
		if refresh := w.p.cfg.EPPRefreshInterval; refresh == 0 || w.now >= ps.eppNext[e] {
			for o, rep := range w.rep {
				queue[o] = len(rep.queue) - rep.qhead
				usage[o] = float64(rep.runningBlocks) / float64(w.p.cacheBlocks)
			}
			ps.eppNext[e] = w.now + ms(refresh.Seconds())
		}
		for o := range w.rep {
			ps.match[o] = idx[o].leadingRun(head)
		}
		j = eppPick(eppDefault, ps.match, len(head), queue, usage, tie, ps.buf)
		// PreRequest records the (capped) hashes for the chosen pod, in
		// prompt order.
		idx[j].touchInOrder(head)
	case PolicyProductionStack:
		for o, seen := range ps.seen {
			m := 0
			for _, id := range r.ids {
				if _, ok := seen[id]; !ok {
					break
				}
				m++
			}
			ps.match[o] = m
			sent := ps.sent[o]
			for len(sent) > 0 && sent[0] <= w.now-prodStackQPSWindowMs {
				sent = sent[1:]
			}
			ps.sent[o] = sent
			ps.qps[o] = float64(len(sent)) / (prodStackQPSWindowMs / 1000)
			if len(sent) == 0 {
				ps.qps[o] = -1
			}
		}
		var why string
		j, why = prodStackPick(ps.match, 0, ps.qps, tie, ps.buf)
		w.reasons[why]++
		for _, id := range r.ids {
			ps.seen[j][id] = struct{}{}
		}
		ps.sent[j] = append(ps.sent[j], w.now)
	}
	return j
}

// peerDone releases router k's in-flight count when a request ends.
func (ps *peerState) peerDone(k, j int) {
	if ps.load != nil {
		ps.load[k][j]--
	}
}
