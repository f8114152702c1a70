package status

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Metric names of the admission (package proxy/admit).
const (
	metricAdmQueue    = "kvmesh_admission_queue_depth"
	metricAdmAdmitted = "kvmesh_admission_admitted_total"
	metricAdmShed     = "kvmesh_admission_shed_total"
)

// admissionClasses are the admission's classes, highest first.
var admissionClasses = []string{"high", "normal", "low"}

// countRow is a count by reason.
type countRow struct {
	Reason, Count string
	Warn          bool
}

// admissionView is the admission's line: what waits in the queue now by
// class, how many started after a wait, and what was shed (class and
// reason). On says the router admits at all.
type admissionView struct {
	On             bool
	Queued, Waited string
	Shed           []countRow
}

// addAdmission reads the admission's families, when the router has them.
func (v *view) addAdmission(fams []*dto.MetricFamily) {
	q := family(fams, metricAdmQueue)
	if q == nil {
		return
	}
	a := admissionView{On: true}
	depth := byLabel(q, "class")
	var parts []string
	for _, c := range admissionClasses {
		parts = append(parts, fmt.Sprintf("%s %s", c, humanCount(depth[c])))
	}
	a.Queued = strings.Join(parts, " · ")
	waited := 0.0
	if f := family(fams, metricAdmAdmitted); f != nil {
		for _, m := range f.GetMetric() {
			if label(m, "path") == "queued" {
				waited += value(m)
			}
		}
	}
	a.Waited = humanCount(waited)
	if f := family(fams, metricAdmShed); f != nil {
		shed := map[string]float64{}
		for _, m := range f.GetMetric() {
			shed[label(m, "class")+" "+label(m, "reason")] += value(m)
		}
		for _, r := range nonzero(shed) {
			r.Warn = true
			a.Shed = append(a.Shed, r)
		}
	}
	v.Admission = a
}
