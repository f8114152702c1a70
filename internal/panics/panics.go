// Package panics contains panics in the router's own code where one
// would otherwise end the process: a request's handler, a stream loop, a
// replica's health poller, a replica discovery listing, the admin
// server. A Recorder counts every panic it recovers in one metric,
// kvmesh_recovered_panics_total{where}, and logs it a few times a second
// at most (a panic a stranger can trigger must not flood the log), with
// the first lines of its stack.
//
// Containing a panic is only sound where the code that panicked holds no
// lock and leaves no state half-written that the next call trusts: the
// callers recover at such boundaries (one request, one poll, one listing,
// one admin request), never around a loop that keeps state across turns.
package panics

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Where a panic was recovered: the label values of
// kvmesh_recovered_panics_total.
const (
	// Handler: in a request's handler (the client got a 500, or its
	// stream was aborted).
	Handler = "handler"
	// StreamLoop: on a stream loop (that stream was aborted; the loop
	// served on).
	StreamLoop = "stream_loop"
	// HealthCheck: in one poll of a replica's health, load or info (its
	// poller polls again at its next tick).
	HealthCheck = "health_check"
	// Discovery: in one listing of replicas (DNS, file); the last list
	// stays and the next listing runs at its time.
	Discovery = "discovery"
	// Admin: in a request to the admin server (/metrics, /debug/mesh,
	// the status page), which answered 500.
	Admin = "admin"
)

// stackLines is how many lines of a recovered panic's stack are logged:
// the panic, the goroutine's header and the innermost frames.
const stackLines = 24

// Recorder counts and logs recovered panics. Its methods are safe for
// concurrent use.
type Recorder struct {
	count *prometheus.CounterVec
	log   hclog.Logger
	lim   *ratelog.Limiter
}

// New returns a Recorder whose counter is registered with reg (nil: not
// registered, as for a component running without the router's registry)
// and which logs to log (nil: nowhere). A router makes one and gives it
// to every component that recovers, so the metric is registered once.
func New(reg prometheus.Registerer, log hclog.Logger) *Recorder {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	c := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_recovered_panics_total",
		Help: "Panics the router recovered from, by where: in a request's handler (the client got a 500, or its stream was aborted), on a stream loop (that stream was aborted; the loop served on), in a replica's health poll (it polls again at its next tick), in a replica discovery listing (the last list stays), or in the admin server (answered 500).",
	}, []string{"where"})
	for _, w := range []string{Handler, StreamLoop, HealthCheck, Discovery, Admin} {
		c.WithLabelValues(w) // dashboards see zeros, not gaps
	}
	return &Recorder{count: c, log: log, lim: ratelog.New(5, time.Second)}
}

// Recovered counts and logs (rate-limited) a panic v recovered where.
func (r *Recorder) Recovered(where string, v any) {
	r.count.WithLabelValues(where).Inc()
	if ok, suppressed := r.lim.Allow(); ok {
		r.log.Error("recovered from a panic", "where", where, "panic", fmt.Sprint(v),
			"suppressed_since_last", suppressed, "stack", headOfStack(debug.Stack(), stackLines))
	}
}

// Guard runs f, recovering a panic in it (counted and logged as where),
// and reports whether f panicked. It is for one turn of a long-lived
// loop: the loop goes on to its next turn.
func (r *Recorder) Guard(where string, f func()) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			r.Recovered(where, v)
			panicked = true
		}
	}()
	f()
	return false
}

// Counter is the count of panics recovered where.
func (r *Recorder) Counter(where string) prometheus.Counter { return r.count.WithLabelValues(where) }

// headOfStack returns the first n lines of stack.
func headOfStack(stack []byte, n int) string {
	i := 0
	for range n {
		j := bytes.IndexByte(stack[i:], '\n')
		if j < 0 {
			return string(stack)
		}
		i += j + 1
	}
	return string(stack[:i])
}
