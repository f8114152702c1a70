package sim

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
)

// Report is the outcome of Run: one entry per policy, in the order asked
// for, and the resolved configuration. It marshals to the JSON of
// `kvmesh sim --json`.
type Report struct {
	Policies []PolicyReport `json:"policies"`
	Config   ConfigReport   `json:"config"`
}

// PolicyReport is what one policy achieved on the trace.
type PolicyReport struct {
	// Name of the policy.
	Name string `json:"name"`
	// Requests served.
	Requests int `json:"requests"`
	// HitRatio is Σ hit blocks / Σ blocks as the replicas counted them
	// (leading run of the request's blocks in the replica's cache).
	HitRatio float64 `json:"hit_ratio"`
	// TokenHitRatio is Σ cached prompt tokens / Σ prompt tokens.
	TokenHitRatio float64 `json:"token_hit_ratio"`
	// TTFT percentiles in virtual milliseconds: arrival to end of prefill.
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// TTFTMeanMs is the mean TTFT.
	TTFTMeanMs float64 `json:"ttft_mean_ms"`
	// PrefillMaxOverMean is the busiest replica's computed prefill tokens
	// over the mean across replicas.
	PrefillMaxOverMean float64 `json:"prefill_max_over_mean"`
	// MeanQueueMs is the mean wait from arrival to the start of prefill.
	MeanQueueMs float64 `json:"mean_queue_ms"`
	// MaxQueued is the most requests ever waiting in the engines' queues
	// at once: in flight beyond the engines' slots, over all replicas.
	// The router's admission (Config.AdmitMaxWaiting) bounds it by
	// AdmitMaxWaiting per replica where the router sees the engines
	// exactly; routing decides which engine's queue each one waits in.
	MaxQueued int `json:"max_queued"`
	// Reasons counts the route decisions by route.Reason; empty for
	// policies that do not use route.
	Reasons map[string]int `json:"reasons"`
	// FullCopies counts summary copies replaced by a full copy (gap,
	// divergence or a delta the owner no longer had).
	FullCopies int `json:"full_copies"`
	// BelowBestMatch counts route decisions that chose a replica with a
	// shorter predicted match than the best candidate's (load or the
	// bound won over the cache), and GivenUpBlocks sums the difference.
	BelowBestMatch int   `json:"below_best_match"`
	GivenUpBlocks  int64 `json:"given_up_blocks"`
	// WarmRequests counts the requests that some replica's real cache held
	// more of than half the replicas' did (a conversation's later turn, a
	// hot prompt), and Retrace is the share of them sent to a replica
	// holding the most: whether every router finds where a conversation
	// lives (kvmesh-mesh against kvmesh-single shows what three routers
	// lose to one).
	WarmRequests int     `json:"warm_requests"`
	Retrace      float64 `json:"retrace"`
	// Corrections counts the requests whose engine held fewer blocks than
	// the recording summary predicted and that the feedback loop
	// corrected; CutsOlder and CutsBoth the generation cuts they caused.
	Corrections int `json:"corrections,omitempty"`
	CutsOlder   int `json:"cuts_older,omitempty"`
	CutsBoth    int `json:"cuts_both,omitempty"`
	// ViewInFlightError is the mean, over every decision and every replica
	// the deciding router does not own, of its in-flight count minus the
	// engine's at that instant (gossiping policies only: what the gossip
	// interval hides); negative when the other routers' dispatches since
	// the owner's last snapshot outnumber the requests that ended.
	ViewInFlightError float64 `json:"view_inflight_error,omitempty"`
	// ViewInFlightAbsError is the mean of the same difference's size:
	// requests unseen and ends unseen do not cancel in it.
	ViewInFlightAbsError float64 `json:"view_inflight_abs_error,omitempty"`
	// ViewFalseFree is the share of those views, among replicas with known
	// slots, that show a free sequence slot the engine did not have, and
	// ViewMissedFree the share that show none where it had one.
	ViewFalseFree  float64 `json:"view_false_free,omitempty"`
	ViewMissedFree float64 `json:"view_missed_free,omitempty"`
}

// ConfigReport is the configuration a Report was made with, after
// defaults and derived values were resolved.
type ConfigReport struct {
	Replicas              int      `json:"replicas"`
	Routers               int      `json:"routers"`
	CacheFraction         float64  `json:"cache_fraction"`
	CacheBlocksPerReplica int      `json:"cache_blocks_per_replica"`
	DistinctBlocks        int      `json:"distinct_blocks"`
	Load                  float64  `json:"load"`
	TimeScale             float64  `json:"time_scale"`
	SpanMs                float64  `json:"span_ms"`
	PrefillTokensPerS     float64  `json:"prefill_tokens_per_s"`
	DecodeMsPerToken      float64  `json:"decode_ms_per_token"`
	MaxNumSeqs            int      `json:"max_num_seqs"`
	PrefillOverheadMs     float64  `json:"prefill_overhead_ms"`
	GossipIntervalMs      float64  `json:"gossip_interval_ms"`
	GossipDelayMs         float64  `json:"gossip_delay_ms"`
	LoadIntervalMs        float64  `json:"load_interval_ms"`
	StaleAfterMs          float64  `json:"stale_after_ms"`
	ScrapeIntervalMs      float64  `json:"scrape_interval_ms"`
	SlotsPublished        bool     `json:"slots_published"`
	PartitionStartMs      float64  `json:"partition_start_ms"`
	PartitionEndMs        float64  `json:"partition_end_ms"`
	Seed                  uint64   `json:"seed"`
	Policies              []string `json:"policies"`
	CapacityError         float64  `json:"capacity_error,omitempty"`
	Correction            string   `json:"correction,omitempty"`
}

// WriteTable writes the report as an aligned table and a config line.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\trequests\thit\ttoken hit\tTTFT p50 ms\tp90 ms\tp99 ms\tmean ms\tprefill max/mean\tqueue ms\tretrace\t reasons")
	for _, p := range r.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.4f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.0f\t%.3f\t %s\n",
			p.Name, p.Requests, p.HitRatio, p.TokenHitRatio, p.TTFTP50Ms, p.TTFTP90Ms, p.TTFTP99Ms, p.TTFTMeanMs,
			p.PrefillMaxOverMean, p.MeanQueueMs, p.Retrace, reasonsString(p.Reasons)+correctionsString(p))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("sim table: %w", err)
	}
	if b := r.Best(); b.HitRatio != "" {
		fmt.Fprintf(w, "best of run (upper bound excluded): hit %s, TTFT p50 %s, p99 %s, mean %s\n", b.HitRatio, b.P50, b.P99, b.Mean)
	}
	c := r.Config
	_, err := fmt.Fprintf(w, "config: replicas=%d routers=%d cache=%.3g (%d blocks/replica of %d distinct, summaries sized ×%.3g, correction %s) load=%.3g (time scale %.4f, span %.0f s) prefill=%.0f tok/s decode=%.3g ms/tok max-num-seqs=%d gossip=%.0fms+%.0fms load=%.0fms scrape=%.0fms slots-published=%v stale-after=%.0fms partition=[%.0f,%.0f) s seed=%d\n",
		c.Replicas, c.Routers, c.CacheFraction, c.CacheBlocksPerReplica, c.DistinctBlocks, c.CapacityError, c.Correction, c.Load,
		c.TimeScale, c.SpanMs/1000, c.PrefillTokensPerS, c.DecodeMsPerToken, c.MaxNumSeqs,
		c.GossipIntervalMs, c.GossipDelayMs, c.LoadIntervalMs, c.ScrapeIntervalMs, c.SlotsPublished, c.StaleAfterMs, c.PartitionStartMs/1000, c.PartitionEndMs/1000, c.Seed)
	if err != nil {
		return fmt.Errorf("sim table: %w", err)
	}
	return nil
}

func reasonsString(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// percentile returns the nearest-rank p-quantile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Best names the best policy of a run on each measure, the pooled upper
// bound excluded (it is not a router).
type Best struct{ HitRatio, P50, P99, Mean string }

// Best returns the best policy of the run on hit ratio and TTFT.
func (r Report) Best() Best {
	var b Best
	var hit, p50, p99, mean float64
	for _, p := range r.Policies {
		if p.Name == PolicyPooled {
			continue
		}
		if b.HitRatio == "" || p.HitRatio > hit {
			b.HitRatio, hit = p.Name, p.HitRatio
		}
		if b.P50 == "" || p.TTFTP50Ms < p50 {
			b.P50, p50 = p.Name, p.TTFTP50Ms
		}
		if b.P99 == "" || p.TTFTP99Ms < p99 {
			b.P99, p99 = p.Name, p.TTFTP99Ms
		}
		if b.Mean == "" || p.TTFTMeanMs < mean {
			b.Mean, mean = p.Name, p.TTFTMeanMs
		}
	}
	return b
}

func correctionsString(p PolicyReport) string {
	var out string
	if p.Corrections > 0 {
		out = fmt.Sprintf(" | corrected=%d cut-older=%d cut-both=%d", p.Corrections, p.CutsOlder, p.CutsBoth)
	}
	if p.ViewInFlightError != 0 || p.ViewFalseFree != 0 || p.ViewMissedFree != 0 {
		out += fmt.Sprintf(" | view in-flight err=%+.2f (|err| %.2f) false-free=%.1f%% missed-free=%.1f%%",
			p.ViewInFlightError, p.ViewInFlightAbsError, 100*p.ViewFalseFree, 100*p.ViewMissedFree)
	}
	return out
}
