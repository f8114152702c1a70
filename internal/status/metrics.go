package status

import (
	"math"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Metric names the page reads (proxy and mesh register them).
const (
	metricDecisions = "kvmesh_route_decisions_total"
	metricPredicted = "kvmesh_predicted_cached_tokens_total"
	metricReported  = "kvmesh_reported_cached_tokens_total"
	metricPrompt    = "kvmesh_prompt_tokens_total"
	metricRequests  = "kvmesh_requests_total"
	metricRetries   = "kvmesh_upstream_retries_total"
	metricTTFT      = "kvmesh_upstream_ttft_seconds"
	metricGossipB   = "kvmesh_gossip_bytes_total"
	metricDropped   = "kvmesh_gossip_dropped_total"
	metricQueue     = "kvmesh_gossip_queue_depth"
	metricResyncs   = "kvmesh_summary_resyncs_total"
	metricRefusals  = "kvmesh_mesh_contract_refusals_total"

	metricPredErr       = "kvmesh_cache_prediction_error_blocks"
	metricForgotten     = "kvmesh_forgotten_blocks_total"
	metricRejected      = "kvmesh_rejected_requests_total"
	metricStreamRefused = "kvmesh_gossip_streams_refused_total"
	metricEngineReqs    = "kvmesh_replica_engine_requests"
	metricEngineSlots   = "kvmesh_replica_engine_slots"
	metricFullCopies    = "kvmesh_summary_full_copies_total"
	metricDeltaBytes    = "kvmesh_summary_delta_bytes_total"
	metricDeltaEntries  = "kvmesh_summary_delta_entries_total"
)

// hist is one classic histogram: cumulative counts at its finite upper
// bounds, the count of all observations (the +Inf bucket) and their sum.
type hist struct {
	bounds, counts []float64
	count, sum     float64
}

// readHist reads a classic histogram, or reports false when m is none.
func readHist(m *dto.Metric) (hist, bool) {
	h := m.GetHistogram()
	if h == nil {
		return hist{}, false
	}
	var x hist
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			continue
		}
		x.bounds = append(x.bounds, b.GetUpperBound())
		x.counts = append(x.counts, float64(b.GetCumulativeCount()))
	}
	x.count, x.sum = float64(h.GetSampleCount()), h.GetSampleSum()
	return x, true
}

// buckets returns the observations in each bucket (not cumulative), the
// +Inf bucket last.
func (h hist) buckets() []float64 {
	out := make([]float64, len(h.counts)+1)
	below := 0.0
	for i, c := range h.counts {
		out[i] = max(c-below, 0)
		below = c
	}
	out[len(h.counts)] = max(h.count-below, 0)
	return out
}

// sub returns h minus an earlier reading of the same histogram (h itself
// when the buckets differ or the counters restarted).
func (h hist) sub(o hist) hist {
	if len(o.bounds) != len(h.bounds) || o.count > h.count {
		return h
	}
	d := hist{bounds: h.bounds, counts: make([]float64, len(h.counts)), count: h.count - o.count, sum: h.sum - o.sum}
	for i := range h.counts {
		d.counts[i] = h.counts[i] - o.counts[i]
	}
	return d
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile
// does: linear within the bucket (from 0 in the first bucket when its bound
// is positive, else that bound), the highest finite bound for the +Inf
// bucket. ok is false without observations.
func (h hist) quantile(q float64) (v float64, ok bool) {
	if h.count <= 0 || len(h.bounds) == 0 {
		return 0, false
	}
	rank := q * h.count
	i := sort.Search(len(h.counts), func(i int) bool { return h.counts[i] >= rank })
	if i == len(h.counts) {
		return h.bounds[len(h.bounds)-1], true
	}
	if i == 0 && h.bounds[0] <= 0 {
		return h.bounds[0], true
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = h.bounds[i-1], h.counts[i-1]
	}
	in := h.counts[i] - below
	if in <= 0 {
		return h.bounds[i], true
	}
	return lo + (h.bounds[i]-lo)*(rank-below)/in, true
}

// sample is one reading of the counters the page shows over time.
type sample struct {
	at        time.Time
	decisions map[string]float64 // by reason
	predicted float64
	reported  float64
	prompt    float64
	requests  float64
	ttft      map[string]hist // by target
	predErr   hist            // predicted minus reported blocks, per response
	forgotten float64
	// deltaBytes and deltaEntries: summary deltas queued to peers.
	deltaBytes, deltaEntries float64
}

// total is a figure that only grows while the counters live.
func (s sample) total() float64 {
	t := s.requests + s.prompt
	for _, v := range s.decisions {
		t += v
	}
	return t
}

func (s sample) decisionsTotal() float64 {
	t := 0.0
	for _, v := range s.decisions {
		t += v
	}
	return t
}

// readSample reads a sample from gathered families.
func readSample(fams []*dto.MetricFamily, at time.Time) sample {
	s := sample{at: at, decisions: map[string]float64{}, ttft: map[string]hist{}}
	for _, f := range fams {
		switch f.GetName() {
		case metricDecisions:
			for _, m := range f.GetMetric() {
				s.decisions[label(m, "reason")] += value(m)
			}
		case metricPredicted:
			s.predicted = sum(f)
		case metricReported:
			s.reported = sum(f)
		case metricPrompt:
			s.prompt = sum(f)
		case metricRequests:
			s.requests = sum(f)
		case metricTTFT:
			for _, m := range f.GetMetric() {
				if x, ok := readHist(m); ok {
					s.ttft[label(m, "target")] = x
				}
			}
		case metricPredErr:
			if ms := f.GetMetric(); len(ms) > 0 {
				s.predErr, _ = readHist(ms[0])
			}
		case metricForgotten:
			s.forgotten = sum(f)
		case metricDeltaBytes:
			s.deltaBytes = sum(f)
		case metricDeltaEntries:
			s.deltaEntries = sum(f)
		}
	}
	return s
}

// family returns the named family, or nil.
func family(fams []*dto.MetricFamily, name string) *dto.MetricFamily {
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

// byLabel sums a family's values by one label.
func byLabel(f *dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		out[label(m, name)] += value(m)
	}
	return out
}

func sum(f *dto.MetricFamily) float64 {
	t := 0.0
	for _, m := range f.GetMetric() {
		t += value(m)
	}
	return t
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
