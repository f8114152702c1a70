package status

import (
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/mesh"
)

// Metric names of the replicas' lifecycle (proxy/health and proxy).
const (
	metricEjections   = "kvmesh_replica_ejections_total"
	metricStallChecks = "kvmesh_stall_checks_total"
	metricStallCuts   = "kvmesh_stalled_requests_total"
)

// lifecycleView is the replicas' comings and goings at this router:
// ejections by reason, the silences the stall detection looked at by
// outcome, and the requests a stall ended. On says the router counts
// them at all.
type lifecycleView struct {
	On              bool
	Ejections       []countRow
	Silences        []countRow
	StalledRequests string
}

// addLifecycle reads the lifecycle's families, when the router has them.
func (v *view) addLifecycle(fams []*dto.MetricFamily) {
	e := family(fams, metricEjections)
	if e == nil {
		return
	}
	l := lifecycleView{On: true, StalledRequests: "0"}
	for _, r := range nonzero(byLabel(e, "reason")) {
		r.Warn = true
		l.Ejections = append(l.Ejections, r)
	}
	for _, r := range nonzero(byLabel(family(fams, metricStallChecks), "outcome")) {
		r.Warn = r.Reason == "stalled"
		l.Silences = append(l.Silences, r)
	}
	if f := family(fams, metricStallCuts); f != nil {
		l.StalledRequests = humanCount(sum(f))
	}
	v.Lifecycle = l
}

// warming marks the replicas whose summary counts and holds under half
// the mean of those (route's warm-up rule, over all tiers): new or
// emptied replicas, which take a share of the cold requests.
func warming(rs []mesh.ReplicaDebug) map[string]bool {
	var total float64
	n := 0
	for _, r := range rs {
		if r.Counts && r.Healthy {
			total += float64(r.Held)
			n++
		}
	}
	out := map[string]bool{}
	for _, r := range rs {
		if r.Counts && r.Healthy && n >= 2 && 2*float64(r.Held)*float64(n) < total {
			out[r.ID] = true
		}
	}
	return out
}
