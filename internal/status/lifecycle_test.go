package status

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/mesh"
)

// TestLifecycleLine: the page shows ejections by reason, the stall
// detection's silences by outcome and the requests a stall ended, and
// marks the replicas that hold under half the mean of cached blocks as
// warming; a router without the families shows no such section.
func TestLifecycleLine(t *testing.T) {
	f := newFakeMetrics().withNewFamilies()
	ej := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricEjections, Help: "h"}, []string{"reason"})
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricStallChecks, Help: "h"}, []string{"outcome"})
	cuts := prometheus.NewCounter(prometheus.CounterOpts{Name: metricStallCuts, Help: "h"})
	f.reg.MustRegister(ej, checks, cuts)
	ej.WithLabelValues("failed_checks")
	ej.WithLabelValues("stalled").Add(2)
	checks.WithLabelValues("prefilling").Add(9)
	checks.WithLabelValues("progressing")
	checks.WithLabelValues("stalled").Add(2)
	cuts.Add(5)
	d := mesh.DebugInfo{Name: "r1", Replicas: []mesh.ReplicaDebug{
		{ID: "http://a:8000", Owner: "r1", Owned: true, Healthy: true, Counts: true, Bytes: 4096, Held: 900},
		{ID: "http://b:8000", Owner: "r1", Owned: true, Healthy: true, Counts: true, Bytes: 4096, Held: 1100},
		{ID: "http://new:8000", Owner: "r1", Owned: true, Healthy: true, Counts: true, Bytes: 4096, Held: 40},
	}}
	p, err := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), d}, Gatherer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, p, http.MethodGet, "/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, want := range []string{`id="lifecycle"`, `data-ejected="stalled"><span class="badge warn">2</span>`,
		`data-silence="prefilling">9`, `data-silence="stalled"><span class="badge warn">2</span>`, `data-stalled-requests="5"`,
		`40 blocks`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, `data-ejected="failed_checks"`) || strings.Contains(body, `data-silence="progressing"`) {
		t.Error("page lists a zero count")
	}
	if n := strings.Count(body, "data-warming"); n != 1 {
		t.Errorf("%d replicas marked warming, want the new one", n)
	}
	if i, j := strings.Index(body, `data-replica="http://new:8000"`), strings.Index(body, "data-warming"); i < 0 || j < i {
		t.Error("the warming mark is not on the new replica's row")
	}

	p, _ = New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: newFakeMetrics().withNewFamilies().reg})
	if _, body := get(t, p, http.MethodGet, "/"); strings.Contains(body, `id="lifecycle"`) || strings.Contains(body, "data-warming") {
		t.Error("a router without the lifecycle's families shows a lifecycle section, or a replica warming")
	}
}
