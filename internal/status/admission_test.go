package status

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAdmissionLine: the page shows what the admission queues by class,
// what started after a wait, and what it shed by class and reason; a
// router without admission shows no such section.
func TestAdmissionLine(t *testing.T) {
	f := newFakeMetrics().withNewFamilies()
	depth := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricAdmQueue, Help: "h"}, []string{"class"})
	admitted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricAdmAdmitted, Help: "h"}, []string{"class", "path"})
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricAdmShed, Help: "h"}, []string{"class", "reason"})
	f.reg.MustRegister(depth, admitted, shed)
	for _, c := range admissionClasses {
		depth.WithLabelValues(c)
		shed.WithLabelValues(c, "queue_full")
	}
	depth.WithLabelValues("low").Set(12)
	admitted.WithLabelValues("high", "queued").Add(3)
	admitted.WithLabelValues("low", "queued").Add(4)
	admitted.WithLabelValues("low", "direct").Add(100)
	shed.WithLabelValues("low", "deadline").Add(5)
	p, err := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, p, http.MethodGet, "/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, want := range []string{`id="admission"`, `data-admission-queued="high 0 · normal 0 · low 12"`, `data-admission-waited="7"`,
		`data-admission-shed="low deadline"><span class="badge warn">5</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, `data-admission-shed="high queue_full"`) || strings.Contains(body, `data-admission-shed="none"`) {
		t.Error("page lists a zero count or none beside a count")
	}

	p, _ = New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: newFakeMetrics().withNewFamilies().reg})
	if _, body := get(t, p, http.MethodGet, "/"); strings.Contains(body, `id="admission"`) {
		t.Error("a router without admission shows an admission section")
	}
}
