// Package sim is a discrete-event simulator, in virtual time, of routing
// policies over replicas with LRU prefix caches, driven by a Mooncake
// trace. The kvmesh policies run the real summary and route packages, the
// same code the router runs: each simulated router holds its own copies of
// the replicas' summaries, owners record what is dispatched to their
// replicas, and copies are fed by delayed gossip deltas (Since/Apply) and
// repaired with full copies (AppendEncode/Decode), as in the mesh.
//
// The engine model, per replica: an exact LRU cache of C blocks (a hit is
// the leading run of the request's blocks present), one prefill at a time
// at a fixed token rate, decode of output_tokens × a fixed time per token
// alongside other prefills, at most MaxNumSeqs sequences running, and a
// FIFO queue. TTFT is arrival to end of prefill.
//
// Simplifications, on purpose: the data path always works (a partition
// cuts only gossip, so a request still passes through the replica's owner,
// which records it); a copy that finds a gap is repaired at once from the
// owner's current state (the pull's round trip is not modelled); pending
// prefill is the dispatching router's estimate (blocks minus its predicted
// match), released when the prefill ends.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// rootHash is the chain root of every simulated prompt (one model).
const rootHash uint64 = 0x6b766d6573680001

// simReq is one trace request prepared for every policy; read-only.
type simReq struct {
	arrival       float64 // virtual ms, after load scaling
	input, output int
	ids           []int64
	req           route.Request
}

// prepared is the policy-independent part of a run, shared read-only by
// the policies' goroutines.
type prepared struct {
	cfg                Config
	reqs               []simReq
	cacheBlocks        int
	distinct           int
	scale, span        float64 // span is the scaled span in ms
	partStart, partEnd float64
	blockMs            float64
	ids                []string
	idHashes           []uint64
	fingerprint        uint64
}

// Run simulates every policy of cfg on reqs (any order; they are sorted by
// arrival, stably) and reports them in the order of cfg.Policies (all
// policies when empty). Policies run on identical arrivals and fresh,
// identical replicas, concurrently up to GOMAXPROCS; the result depends
// only on cfg and reqs.
func Run(ctx context.Context, cfg Config, reqs []trace.Request) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if len(reqs) == 0 {
		return Report{}, errors.New("sim: empty trace")
	}
	if cfg.FalsePositiveRate == 0 {
		cfg.FalsePositiveRate = summary.DefaultFalsePositiveRate
	}
	if cfg.Correction == "" {
		cfg.Correction = CorrectionNone
	}
	if cfg.Route == (route.Policy{}) {
		cfg.Route = route.DefaultPolicy()
	}
	policies := cfg.Policies
	if len(policies) == 0 {
		policies = AllPolicies
	}
	p, err := prepare(cfg, reqs)
	if err != nil {
		return Report{}, err
	}
	if _, err := summary.New(p.params(), 0); err != nil {
		return Report{}, fmt.Errorf("sim: %w", err)
	}

	out := make([]PolicyReport, len(policies))
	errs := make([]error, len(policies))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, name := range policies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = runPolicy(ctx, p, name)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Report{}, err
	}
	c := p.cfg
	return Report{Policies: out, Config: ConfigReport{
		Replicas: c.Replicas, Routers: c.Routers, CacheFraction: c.CacheFraction,
		CacheBlocksPerReplica: p.cacheBlocks, DistinctBlocks: p.distinct,
		Load: c.Load, TimeScale: p.scale, SpanMs: p.span,
		PrefillTokensPerS: c.PrefillTokensPerS, DecodeMsPerToken: c.DecodeMsPerToken,
		MaxNumSeqs: c.MaxNumSeqs, PrefillOverheadMs: c.PrefillOverheadMs,
		GossipIntervalMs: ms(c.GossipInterval.Seconds()), GossipDelayMs: ms(c.GossipDelay.Seconds()),
		LoadIntervalMs: ms(c.LoadInterval.Seconds()),
		StaleAfterMs:   ms(c.StaleAfter.Seconds()), ScrapeIntervalMs: ms(c.ScrapeInterval.Seconds()), SlotsPublished: c.SlotsPublished, PartitionStartMs: p.partStart, PartitionEndMs: p.partEnd,
		Seed: c.Seed, Policies: slices.Clone(policies),
		CapacityError: c.CapacityError, Correction: c.Correction,
	}}, nil
}

func ms(seconds float64) float64 { return seconds * 1000 }

func (p *prepared) params() summary.Params {
	c := p.cacheBlocks
	if k := p.cfg.CapacityError; k > 0 && k != 1 {
		c = max(int(math.Round(float64(c)*k)), 2)
	}
	return summary.Params{CapacityBlocks: c, FalsePositiveRate: p.cfg.FalsePositiveRate}
}

// splitmix64 is one step of the splitmix64 generator: trace ids are small
// integers, and this turns them into uniform 64-bit block hashes.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// prepare hashes the requests, sizes the caches and scales time for the
// requested load.
func prepare(cfg Config, in []trace.Request) (*prepared, error) {
	sorted := slices.Clone(in)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Arrival < sorted[j].Arrival })
	salt := splitmix64(cfg.Seed)
	p := &prepared{cfg: cfg, fingerprint: summary.DefaultContract().Fingerprint(),
		blockMs: trace.MooncakeBlockTokens / cfg.PrefillTokensPerS * 1000}

	seen := make(map[int64]struct{})
	p.reqs = make([]simReq, len(sorted))
	for i, r := range sorted {
		if r.InputTokens < 0 || r.OutputTokens < 0 {
			return nil, fmt.Errorf("sim: request %d has negative token counts", i)
		}
		hashes := make([]uint64, len(r.HashIDs))
		for k, id := range r.HashIDs {
			hashes[k] = splitmix64(uint64(id) ^ salt)
			seen[id] = struct{}{}
		}
		p.reqs[i] = simReq{
			arrival: float64(r.Arrival.Nanoseconds()) / 1e6,
			input:   r.InputTokens, output: r.OutputTokens, ids: r.HashIDs,
			req: route.Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: rootHash},
		}
	}
	p.distinct = len(seen)
	p.cacheBlocks = cfg.CacheBlocks
	if p.cacheBlocks <= 0 {
		p.cacheBlocks = int(math.Ceil(cfg.CacheFraction * float64(p.distinct) / float64(cfg.Replicas)))
	}
	p.cacheBlocks = max(p.cacheBlocks, 2) // the smallest summary

	first, last := p.reqs[0].arrival, p.reqs[len(p.reqs)-1].arrival
	span := last - first
	p.scale = 1
	if cfg.Load > 0 && span > 0 {
		// LRU hits do not depend on time, so round-robin's work follows
		// from the order alone. The binding resource is the prefill GPU
		// or, under a small max-num-seqs, the sequence slots.
		prefill, slot := p.roundRobinBusyMs()
		busy := max(prefill, slot/float64(cfg.MaxNumSeqs))
		p.scale = busy / (float64(cfg.Replicas) * span * cfg.Load)
	}
	for i := range p.reqs {
		p.reqs[i].arrival = first + (p.reqs[i].arrival-first)*p.scale
	}
	p.span = span * p.scale
	p.partStart, p.partEnd = first+p.span/4, first+3*p.span/4

	p.ids = make([]string, cfg.Replicas)
	p.idHashes = make([]uint64, cfg.Replicas)
	for j := range p.ids {
		p.ids[j] = fmt.Sprintf("http://replica-%d", j)
		p.idHashes[j] = route.HashID(p.ids[j])
	}
	return p, nil
}

// prefillMs is the time to prefill a request that hits hit blocks.
func (p *prepared) prefillMs(r *simReq, hit int) (ms float64, computed int) {
	computed = max(0, r.input-hit*trace.MooncakeBlockTokens)
	return float64(computed)/p.cfg.PrefillTokensPerS*1000 + p.cfg.PrefillOverheadMs, computed
}

// roundRobinBusyMs is the total prefill time of round-robin in arrival
// order, with no timing model, and the total time its requests hold a
// sequence slot (prefill and decode).
func (p *prepared) roundRobinBusyMs() (prefill, slot float64) {
	caches := make([]*lru, p.cfg.Replicas)
	for j := range caches {
		caches[j] = newLRU(p.cacheBlocks)
	}
	for i := range p.reqs {
		r := &p.reqs[i]
		c := caches[i%len(caches)]
		d, _ := p.prefillMs(r, c.leadingRun(r.ids))
		prefill += d
		slot += d + float64(r.output)*p.cfg.DecodeMsPerToken
		c.touchAll(r.ids)
	}
	return prefill, slot
}
