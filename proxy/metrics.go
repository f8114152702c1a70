package proxy

import (
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// ReasonRehint is the decision label of a forwarded request that its
// owner re-picked among its own replicas because the hinted one was gone
// or over the load bound.
const ReasonRehint route.Reason = "rehint"

// Targets of the upstream histograms.
const (
	targetLocal = "local"
	targetPeer  = "peer"
)

// metrics are one router's proxy metrics, registered on its own registry.
type metrics struct {
	requests        *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	predictedCached prometheus.Counter
	reportedCached  prometheus.Counter
	promptTokens    prometheus.Counter
	ttft            *prometheus.HistogramVec
	duration        *prometheus.HistogramVec
	inflight        *prometheus.GaugeVec
	retries         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_total",
			Help: "Client requests served by this router, by endpoint and HTTP status code.",
		}, []string{"endpoint", "code"}),
		decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_route_decisions_total",
			Help: "Routing decisions made by this router, by reason.",
		}, []string{"reason"}),
		predictedCached: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_predicted_cached_tokens_total",
			Help: "Prompt tokens this router predicted the replica had cached, over responses that reported cached tokens.",
		}),
		reportedCached: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_reported_cached_tokens_total",
			Help: "Cached prompt tokens reported by replicas (usage.prompt_tokens_details.cached_tokens).",
		}),
		promptTokens: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_prompt_tokens_total",
			Help: "Prompt tokens reported by replicas (usage.prompt_tokens).",
		}),
		ttft: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:                            "kvmesh_upstream_ttft_seconds",
			Help:                            "Time from dispatch to the first response byte of the upstream, by target (local replica or peer router).",
			Buckets:                         prometheus.ExponentialBuckets(0.005, 2, 12),
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}, []string{"target"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:                            "kvmesh_upstream_duration_seconds",
			Help:                            "Time from dispatch to the end of the upstream response, by target (local replica or peer router).",
			Buckets:                         prometheus.ExponentialBucketsRange(0.05, 300, 16),
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}, []string{"target"}),
		inflight: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_inflight_requests",
			Help: "Requests this router has in flight to each replica (directly or through its owner).",
		}, []string{"replica"}),
		retries: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_upstream_retries_total",
			Help: "Upstream attempts retried on another candidate before the first response byte.",
		}),
	}
	// Initialise every label value so dashboards see zeros, not gaps.
	for _, r := range route.Reasons {
		m.decisions.WithLabelValues(string(r))
	}
	m.decisions.WithLabelValues(string(ReasonRehint))
	for _, t := range []string{targetLocal, targetPeer} {
		m.ttft.WithLabelValues(t)
		m.duration.WithLabelValues(t)
	}
	return m
}
