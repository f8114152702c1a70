package proxy

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
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
	hopRequests     *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	loraPlacements  *prometheus.CounterVec
	predictedCached prometheus.Counter
	reportedCached  prometheus.Counter
	promptTokens    prometheus.Counter
	predictionError prometheus.Histogram
	predictionMiss  prometheus.Histogram
	forgotten       prometheus.Counter
	ttft            *prometheus.HistogramVec
	duration        *prometheus.HistogramVec
	requestTTFT     *prometheus.HistogramVec
	inflight        *prometheus.GaugeVec
	retries         prometheus.Counter
	stallCuts       prometheus.Counter
	stallChecks     *prometheus.CounterVec
	loopStreams     prometheus.Counter
	loopClientWaits prometheus.Counter
	// midstream counts streams failed after their head, by cause and by
	// how they ended (midstream.go); its six children are resolved once.
	midstream *prometheus.CounterVec
	// ownerGone counts the hops of owners the mesh lost, by how they
	// ended (hop.Owners).
	ownerGone *prometheus.CounterVec

	// Children resolved once: WithLabelValues hashes its labels and
	// takes a lock on every call, and the request path would call it
	// five times per request.
	upstream [2]upstreamObservers // by target: [0] local, [1] peer
	// firstByte: kvmesh_request_ttft_seconds by route, [0] local, [1]
	// peer, [2] hop.
	firstByte [3]prometheus.Observer
	mu        sync.RWMutex
	reqs      map[requestKey]prometheus.Counter // requests by endpoint, code and hop
	replicas  map[string]prometheus.Gauge       // inflight by replica
	// byReason holds the decision counters of every known reason; it is
	// filled in newMetrics and only read afterwards.
	byReason map[route.Reason]prometheus.Counter
	// byLoRA holds the LoRA placement counters, filled in newMetrics.
	byLoRA map[route.LoRAPlacement]prometheus.Counter
}

// countDecision counts one routing decision by its reason.
func (m *metrics) countDecision(r route.Reason) {
	if c, ok := m.byReason[r]; ok {
		c.Inc()
		return
	}
	m.decisions.WithLabelValues(string(r)).Inc()
}

// countLoRA counts one decision for a LoRA adapter's request by where it
// went (none for a base model's).
func (m *metrics) countLoRA(pl route.LoRAPlacement) {
	if c, ok := m.byLoRA[pl]; ok {
		c.Inc()
	}
}

// upstreamObservers are the upstream histograms of one target.
type upstreamObservers struct {
	ttft, duration prometheus.Observer
}

type requestKey struct {
	endpoint string
	code     int
	hop      bool
}

// Routes of kvmesh_request_ttft_seconds: a hop is a request another
// router forwarded here.
const routeHop = "hop"

// firstByteAt records the time from st's arrival at this router to the
// first byte of the response body it relays, now, which it returns: a
// client's request to an owned replica (local) or through the owner
// (peer), or a hop served here (hop).
func firstByteAt(st *reqState, local bool) time.Time {
	now := st.p.now()
	i := 0
	switch {
	case st.hop:
		i = 2
	case !local:
		i = 1
	}
	st.p.m.firstByte[i].Observe(now.Sub(st.arrived).Seconds())
	return now
}

// target returns the upstream histograms of a local replica or a peer.
func (m *metrics) target(local bool) upstreamObservers {
	if local {
		return m.upstream[0]
	}
	return m.upstream[1]
}

// countRequest counts one request by endpoint and status code: a
// client's in kvmesh_requests_total, a hop (a request another router
// forwarded here) in kvmesh_hop_requests_total, so that a client's
// request is counted once in the mesh, at the router it reached. The
// children are kept in a map of their own: the labels are few
// (endpoints times the status codes seen), and the vector keeps each
// child for as long anyway.
func (m *metrics) countRequest(endpoint string, code int, hop bool) {
	k := requestKey{endpoint, code, hop}
	m.mu.RLock()
	c := m.reqs[k]
	m.mu.RUnlock()
	if c == nil {
		vec := m.requests
		if hop {
			vec = m.hopRequests
		}
		c = vec.WithLabelValues(endpoint, strconv.Itoa(code))
		m.mu.Lock()
		m.reqs[k] = c
		m.mu.Unlock()
	}
	c.Inc()
}

// inflightOf returns the in-flight gauge of one replica (kept like
// countRequest's children: the vector never drops a replica's either).
func (m *metrics) inflightOf(replica string) prometheus.Gauge {
	m.mu.RLock()
	g := m.replicas[replica]
	m.mu.RUnlock()
	if g == nil {
		g = m.inflight.WithLabelValues(replica)
		m.mu.Lock()
		m.replicas[replica] = g
		m.mu.Unlock()
	}
	return g
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_total",
			Help: "Client requests served by this router, by endpoint and HTTP status code (requests other routers forwarded here are in kvmesh_hop_requests_total).",
		}, []string{"endpoint", "code"}),
		hopRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_hop_requests_total",
			Help: "Requests other routers forwarded to this router for its replicas (hops), by endpoint and HTTP status code; their clients are counted in kvmesh_requests_total where they arrived.",
		}, []string{"endpoint", "code"}),
		decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_route_decisions_total",
			Help: "Routing decisions made by this router, by reason.",
		}, []string{"reason"}),
		loraPlacements: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_route_lora_placements_total",
			Help: "Routing decisions of this router for LoRA adapters' requests, by where they went: loaded (a replica running the adapter), load (one with room to load it), waiting (one where its requests wait), evict (a full one: it evicts or waits), unknown (no replica told: placed as a base model's).",
		}, []string{"placement"}),
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
		predictionError: f.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_cache_prediction_error_blocks",
			Help: "Predicted minus engine-reported cached prompt blocks per response that reported cached tokens (positive: the summary claimed blocks the replica no longer held).",
			// Symmetric around 0: both over- and under-prediction show.
			Buckets:                         []float64{-64, -16, -4, -1, -0.5, 0.5, 1, 4, 16, 64},
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}),
		predictionMiss: f.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_cache_prediction_abs_error_blocks",
			Help: "How far, in blocks either way, the predicted cached prompt blocks were from the engine-reported ones, per response that reported cached tokens: its quantiles are the prediction's accuracy (kvmesh_cache_prediction_error_blocks has the sign).",
			// Fine below a block, where a well-kept summary's errors are.
			Buckets:                         []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 4, 8, 16, 64},
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}),
		forgotten: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_forgotten_blocks_total",
			Help: "Blocks this router told an owned replica's summary to forget because the engine reported fewer cached tokens than predicted.",
		}),
		ttft: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:                            "kvmesh_upstream_ttft_seconds",
			Help:                            "Time from dispatch to the first response byte of the upstream, by target (local replica or peer router).",
			Buckets:                         prometheus.ExponentialBuckets(0.005, 2, 12),
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}, []string{"target"}),
		requestTTFT: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:                            "kvmesh_request_ttft_seconds",
			Help:                            "Time from this router starting to serve a request to the first byte of the response body it relays, by route: local (a client's request to an owned replica), peer (a client's request through the router owning the replica), hop (a request another router forwarded here). Less kvmesh_upstream_ttft_seconds, the router's own time (reading, routing, admission); a client's TTFT less the entry router's is the network and whatever sits in front.",
			Buckets:                         prometheus.ExponentialBuckets(0.005, 2, 12),
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: 3600e9,
		}, []string{"route"}),
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
		stallCuts: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_stalled_requests_total",
			Help: "Requests in flight at an owned replica judged stalled, ended there (retried elsewhere when nothing reached the client yet, else ended with an error event).",
		}),
		stallChecks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_stall_checks_total",
			Help: "Silences of owned replicas with requests in flight that lasted the stall window, by outcome, each counted once: prefilling (within the prefill the router expects of the requests waiting for their first byte; not judged), progressing (judged: the engine's progress counters moved) or stalled (ejected, its requests ended).",
		}, []string{"outcome"}),
		retries: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_upstream_retries_total",
			Help: "Upstream attempts retried on another candidate before the first response byte.",
		}),
		loopStreams: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_stream_loop_streams_total",
			Help: "Streams relayed by the stream loop (Linux; replica and client sockets served by epoll instead of a goroutine per stream).",
		}),
		loopClientWaits: f.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_stream_loop_client_waits_total",
			Help: "Streams the stream loop handed back to the normal path because the client's socket was full (a slow client).",
		}),
		midstream: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_upstream_midstream_failures_total",
			Help: "Responses whose upstream failed after their head was sent to the client, by cause (idle_timeout, upstream_error, owner_gone) and by how the client's response ended (error_event: an SSE error event and a clean end; aborted: the connection broken).",
		}, []string{"cause", "end"}),
		ownerGone: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_hops_owner_gone_total",
			Help: "Hops in flight to an owner router the mesh took for gone, by what became of them: error (answered 502 owner_router_gone), cut (its stream ended), kept (the owner answered or refused the probe, or sent the hop a byte since: leaving, or a wrong verdict), left (not dispatched: left to the dispatch timeout).",
		}, []string{"end"}),
	}
	// Initialise every label value so dashboards see zeros, not gaps.
	m.byReason = map[route.Reason]prometheus.Counter{}
	for _, r := range append(slices.Clone(route.Reasons), ReasonRehint, ReasonPreviousResponse, ReasonLoad, ReasonPolicyFault) {
		m.byReason[r] = m.decisions.WithLabelValues(string(r))
	}
	m.byLoRA = map[route.LoRAPlacement]prometheus.Counter{}
	for _, pl := range route.LoRAPlacements {
		m.byLoRA[pl] = m.loraPlacements.WithLabelValues(string(pl))
	}
	for i, t := range []string{targetLocal, targetPeer} {
		m.upstream[i] = upstreamObservers{ttft: m.ttft.WithLabelValues(t), duration: m.duration.WithLabelValues(t)}
	}
	for i, r := range []string{targetLocal, targetPeer, routeHop} {
		m.firstByte[i] = m.requestTTFT.WithLabelValues(r)
	}
	for _, c := range []string{midstreamIdle, midstreamError, midstreamOwnerGone} {
		for _, e := range []string{endErrorEvent, endAborted} {
			m.midstream.WithLabelValues(c, e)
		}
	}
	for _, e := range []string{hop.GoneError, hop.GoneCut, hop.GoneKept, hop.GoneLeft} {
		m.ownerGone.WithLabelValues(e)
	}
	// A router that has not been forwarded a request yet shows a zero
	// for the main endpoint, not a missing family.
	m.hopRequests.WithLabelValues(epChat, "200")
	m.reqs = map[requestKey]prometheus.Counter{}
	m.replicas = map[string]prometheus.Gauge{}
	return m
}
