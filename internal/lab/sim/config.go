package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// The policies Run knows, in report order.
const (
	PolicyRoundRobin     = "round-robin"        // request i goes to replica i mod R
	PolicyLeastLoaded    = "least-loaded"       // fewest requests in flight, exact
	PolicyConsistentHash = "consistent-hash"    // rendezvous hashing of the first two blocks, bounded loads (c = 1.25) on in-flight
	PolicySingle         = "kvmesh-single"      // one router sees every request
	PolicyIsolated       = "kvmesh-isolated"    // N routers, no gossip
	PolicyMesh           = "kvmesh-mesh"        // N routers gossiping summaries and load
	PolicyPartitioned    = "kvmesh-partitioned" // the mesh, cut in two for the middle half of the trace
	PolicyExactView      = "kvmesh-exact-view"  // kvmesh's rule, one router reading every replica's real cache
	PolicyPooled         = "pooled-bound"       // upper bound: one pooled cache of R×C blocks (exact LRU) under kvmesh's load rule
)

// AllPolicies lists every policy in report order.
var AllPolicies = []string{
	PolicyRoundRobin, PolicyLeastLoaded, PolicyConsistentHash, PolicySingle,
	PolicyIsolated, PolicyMesh, PolicyPartitioned, PolicyExactView, PolicyPooled,
	PolicySGLang, PolicySMGMesh, PolicyDynamo, PolicyLLMD, PolicyLLMD3, PolicyProductionStack,
}

// Config describes one simulation: the cluster, the engine model, the mesh
// timing and which policies to compare. DefaultConfig fills every field.
type Config struct {
	// Replicas is the number of inference replicas, R.
	Replicas int
	// Routers is the number of routers, N; request i arrives at router
	// i mod N, and replica j is owned by router j mod N.
	Routers int
	// CacheFraction sizes the total replica cache as this share of the
	// trace's distinct blocks: C = ceil(f × distinct / R) per replica.
	CacheFraction float64
	// CacheBlocks, when positive, sets C directly and overrides
	// CacheFraction.
	CacheBlocks int
	// Load, when positive, rescales arrival times so that the binding
	// resource of round-robin's replicas is busy this share of the trace
	// span: the prefill GPU (round-robin's prefill time over R × span) or
	// the sequence slots (each request holds a slot for its prefill and
	// decode; slot time over R × MaxNumSeqs × span), whichever is higher.
	// Below 1 every cell is then a stable queue. Zero keeps the trace's
	// own timestamps.
	Load float64
	// PrefillTokensPerS is each replica's prefill rate.
	PrefillTokensPerS float64
	// DecodeMsPerToken is the decode time of one output token of a running
	// sequence; decode runs alongside other sequences' prefills.
	DecodeMsPerToken float64
	// MaxNumSeqs caps the sequences a replica runs at once (prefilling or
	// decoding); further requests wait in its FIFO queue.
	MaxNumSeqs int
	// PrefillOverheadMs is a fixed cost added to every prefill (scheduling,
	// the first decode step), so a full cache hit still costs something.
	PrefillOverheadMs float64
	// GossipInterval is how often an owner sends its replicas' summary
	// deltas and load to the other routers.
	GossipInterval time.Duration
	// GossipDelay is how long a gossip message takes to arrive.
	GossipDelay time.Duration
	// LoadInterval is how often at most an owner also sends its
	// replicas' load alone (requests in flight, queued prefill), between
	// the summary ticks, when it changes, as the router's load beacons do
	// (mesh Timing.LoadInterval); 0 sends it only with the summary deltas
	// every GossipInterval. The default is the router's lan profile's.
	LoadInterval time.Duration
	// ScrapeInterval is how often an owner reads its replicas' engine
	// counts (running, waiting), as a router scrapes /metrics: candidates'
	// Running and Waiting are stale by up to this much, while InFlight is
	// the routers' own fast count.
	ScrapeInterval time.Duration
	// SMGSyncInterval is how often the smg-mesh model's routers send each
	// other the radix-tree inserts they made since the last sync, as SMG's
	// mesh does every second (lightseekorg/smg mesh/src/ping_server.rs,
	// sync_stream: a 1 s interval sends the incremental updates of every
	// store, the policy store's tree operations among them). Until then a
	// router's tree lacks the others' requests. 0 models one tree shared by
	// every router and updated at once (the optimistic model before).
	SMGSyncInterval time.Duration
	// EPPRefreshInterval is how often the llm-d-epp models read the
	// engines' queue and KV-cache utilization, as the EPP's metrics
	// refresh does every 50 ms (peers.md §3: RefreshMetricsInterval).
	// Its default scorers (queue, kv-cache utilization) see only those
	// scraped gauges, not the EPP's own dispatches since. The model
	// refreshes lazily, at the first decision at least this long after
	// the last refresh: a snapshot never older than the real scraper's,
	// so the lag is if anything kinder to the peer than the real one.
	// 0 models gauges read at the instant of every decision (the model
	// before).
	EPPRefreshInterval time.Duration
	// SlotsPublished makes the engines publish max-num-seqs; otherwise the
	// owner learns it from the scrapes (route.SlotEstimate), as a router
	// must for vLLM.
	SlotsPublished bool
	// ProbeSlots has an owner read an engine of unknown slots at once
	// when it sends it more than it has seen it run (probeSlots), as the
	// router does (health.Checker.ProbeLoad); on by default.
	ProbeSlots bool
	// AdmitMaxWaiting models the router's admission (package proxy/admit,
	// `kvmesh router --admit-max-waiting`) in the kvmesh policies: when
	// no replica has room in the entry router's view (Slots +
	// AdmitMaxWaiting in flight, or an engine of unknown slots reporting
	// that many waiting, admit.RoomOf), the request waits in that
	// router's queue, first come first served, and is routed when a
	// request it admitted ends or at its next poll finds room. 0: off
	// (every request is routed on arrival).
	AdmitMaxWaiting int
	// LateBind models owners that keep their replicas' queues themselves
	// (lateBinding, latebind.go) in the kvmesh policies, as the router
	// does with --late-bind (off by default there too).
	LateBind bool
	// StaleAfter is how long a router keeps counting a copy (and load)
	// whose owner it has not heard from.
	StaleAfter time.Duration
	// FalsePositiveRate sizes every summary.
	FalsePositiveRate float64
	// Policies to run, by name (see AllPolicies); empty means all.
	Policies []string
	// Seed salts the mapping of trace block ids to block hashes and the
	// summaries' epochs, which moves Bloom false positives and rendezvous
	// placements; runs with the same seed are identical.
	Seed uint64
	// Route is the routing policy of the route-based policies.
	Route route.Policy
	// CapacityError sizes the summaries for CapacityError × the engines'
	// real capacity (0 or 1: the real capacity), as a router configured
	// with the wrong --kv-blocks, or sharing its engines with other
	// tenants, would.
	CapacityError float64
	// Correction is what an owner does when its engine reports fewer
	// cached blocks than its summary predicted (see Corrections).
	Correction string
}

// The corrections Config.Correction knows.
const (
	CorrectionNone   = "none"   // the engine's report is ignored
	CorrectionForget = "forget" // forget the blocks claimed beyond the report, then record the request again (the proxy before generation cuts)
	CorrectionCut    = "cut"    // summary.Correct: generation cuts and a learned rotation threshold, then record again
)

// Corrections lists Config.Correction's values.
var Corrections = []string{CorrectionNone, CorrectionForget, CorrectionCut}

// DefaultConfig returns the defaults of `kvmesh sim`.
func DefaultConfig() Config {
	return Config{
		Replicas:           8,
		Routers:            3,
		CacheFraction:      0.25,
		Load:               0.7,
		PrefillTokensPerS:  10000,
		DecodeMsPerToken:   20,
		MaxNumSeqs:         32,
		PrefillOverheadMs:  1,
		GossipInterval:     200 * time.Millisecond,
		GossipDelay:        50 * time.Millisecond,
		LoadInterval:       25 * time.Millisecond,
		StaleAfter:         2 * time.Second,
		ScrapeInterval:     time.Second,
		ProbeSlots:         true,
		SMGSyncInterval:    time.Second,
		EPPRefreshInterval: 50 * time.Millisecond,
		FalsePositiveRate:  0.01,
		Seed:               1,
		Route:              route.DefaultPolicy(),
		CapacityError:      1,
		Correction:         CorrectionCut,
	}
}

// Validate reports whether the config can run.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 1:
		return fmt.Errorf("sim: replicas %d, want at least 1", c.Replicas)
	case c.Routers < 1:
		return fmt.Errorf("sim: routers %d, want at least 1", c.Routers)
	case c.CacheBlocks <= 0 && !(c.CacheFraction > 0):
		return fmt.Errorf("sim: cache fraction %v, want > 0 (or set cache blocks)", c.CacheFraction)
	case c.Load < 0:
		return fmt.Errorf("sim: load %v, want >= 0", c.Load)
	case !(c.PrefillTokensPerS > 0):
		return fmt.Errorf("sim: prefill rate %v tokens/s, want > 0", c.PrefillTokensPerS)
	case c.DecodeMsPerToken < 0:
		return fmt.Errorf("sim: decode time %v ms/token, want >= 0", c.DecodeMsPerToken)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("sim: max-num-seqs %d, want at least 1", c.MaxNumSeqs)
	case c.PrefillOverheadMs < 0:
		return fmt.Errorf("sim: prefill overhead %v ms, want >= 0", c.PrefillOverheadMs)
	case c.GossipInterval <= 0:
		return fmt.Errorf("sim: gossip interval %v, want > 0", c.GossipInterval)
	case c.GossipDelay < 0:
		return fmt.Errorf("sim: gossip delay %v, want >= 0", c.GossipDelay)
	case c.LoadInterval < 0:
		return fmt.Errorf("sim: load interval %v, want >= 0", c.LoadInterval)
	case c.AdmitMaxWaiting < 0:
		return fmt.Errorf("sim: admit max waiting %d, want >= 0", c.AdmitMaxWaiting)
	case c.ScrapeInterval <= 0:
		return fmt.Errorf("sim: scrape interval %v, want > 0", c.ScrapeInterval)
	case c.SMGSyncInterval < 0:
		return fmt.Errorf("sim: smg sync interval %v, want >= 0", c.SMGSyncInterval)
	case c.EPPRefreshInterval < 0:
		return fmt.Errorf("sim: epp refresh interval %v, want >= 0", c.EPPRefreshInterval)
	case c.StaleAfter <= 0:
		return fmt.Errorf("sim: stale-after %v, want > 0", c.StaleAfter)
	case c.CapacityError < 0 || c.CapacityError > 64:
		return fmt.Errorf("sim: capacity error %v, want in [0, 64]", c.CapacityError)
	case c.Correction != "" && !slices.Contains(Corrections, c.Correction):
		return fmt.Errorf("sim: unknown correction %q (known: %v)", c.Correction, Corrections)
	}
	for _, p := range c.Policies {
		if !knownPolicy(p) {
			return fmt.Errorf("sim: unknown policy %q (known: %v)", p, AllPolicies)
		}
	}
	return nil
}

func knownPolicy(name string) bool {
	for _, p := range AllPolicies {
		if p == name {
			return true
		}
	}
	return false
}
