package admit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the admission's Prometheus metrics, by class; the series
// the request path touches are resolved once (by class index).
type metrics struct {
	queued    *prometheus.GaugeVec
	admitted  *prometheus.CounterVec
	shedding  *prometheus.CounterVec
	gone      *prometheus.CounterVec
	queueWait *prometheus.HistogramVec

	depthOf        [NumClasses]prometheus.Gauge
	direct, afterQ [NumClasses]prometheus.Counter
	waitOf         [NumClasses]prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		queued: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_admission_queue_depth",
			Help: "Requests waiting in the router's admission queue, by priority class.",
		}, []string{"class"}),
		admitted: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_admission_admitted_total",
			Help: "Requests admitted, by priority class and path (direct: the model had room; queued: after a wait).",
		}, []string{"class", "path"}),
		shedding: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_admission_shed_total",
			Help: "Requests shed with 429 or 503 and Retry-After, by priority class and reason.",
		}, []string{"class", "reason"}),
		gone: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_admission_cancelled_total",
			Help: "Queued requests whose client went away before they could start, by priority class.",
		}, []string{"class"}),
		queueWait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvmesh_admission_queue_wait_seconds",
			Help:    "Time admitted requests waited in the admission queue, by priority class.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"class"}),
	}
	for i := range NumClasses {
		s := classAt(i).String()
		m.depthOf[i] = m.queued.WithLabelValues(s)
		m.direct[i] = m.admitted.WithLabelValues(s, "direct")
		m.afterQ[i] = m.admitted.WithLabelValues(s, "queued")
		m.gone.WithLabelValues(s)
		m.waitOf[i] = m.queueWait.WithLabelValues(s)
		for _, r := range []string{ReasonQueueFull, ReasonTenantShare, ReasonPreempted, ReasonDeadline, ReasonClosed} {
			m.shedding.WithLabelValues(s, r)
		}
	}
	return m
}

func (m *metrics) depth(c Class, d float64) { m.depthOf[c.idx()].Add(d) }

func (m *metrics) admit(c Class, queued bool, wait time.Duration) {
	if !queued {
		m.direct[c.idx()].Inc()
		return
	}
	m.afterQ[c.idx()].Inc()
	m.waitOf[c.idx()].Observe(wait.Seconds())
}

func (m *metrics) shed(c Class, reason string) {
	m.shedding.WithLabelValues(c.String(), reason).Inc()
}

func (m *metrics) cancelled(c Class) { m.gone.WithLabelValues(c.String()).Inc() }
