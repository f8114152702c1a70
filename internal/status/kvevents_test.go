package status

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestKVEventsSection: a router subscribed to engines' KV events shows
// each subscription's state, gaps, resyncs and lag; one that is not shows
// no such section.
func TestKVEventsSection(t *testing.T) {
	f := newFakeMetrics()
	p, _ := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: f.reg})
	if _, body := get(t, p, http.MethodGet, "/"); strings.Contains(body, `id="kv-events"`) {
		t.Fatal("a KV-events section without subscriptions")
	}
	gauge := func(name string, vals map[string]float64) {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "h"}, []string{"replica"})
		f.reg.MustRegister(g)
		for id, v := range vals {
			g.WithLabelValues(id).Set(v)
		}
	}
	gauge("kvmesh_kv_events_connected", map[string]float64{"http://a:8000": 1, "http://b:8000": 0})
	gauge("kvmesh_kv_event_gaps_total", map[string]float64{"http://a:8000": 3})
	gauge("kvmesh_kv_event_resyncs_total", map[string]float64{"http://a:8000": 1})
	gauge("kvmesh_kv_event_lag_seconds", map[string]float64{"http://a:8000": 0.012})
	_, body := get(t, p, http.MethodGet, "/")
	i := strings.Index(body, `id="kv-events"`)
	if i < 0 {
		t.Fatal("no KV-events section")
	}
	sec := body[i:]
	for _, want := range []string{`<tr class="warn"><td>http://a:8000</td><td>connected</td>`, `<td class="num">3</td>`, "12 ms",
		`<tr class="down"><td>http://b:8000</td><td>reconnecting</td>`} {
		if !strings.Contains(sec, want) {
			t.Errorf("section lacks %q:\n%s", want, sec[:min(len(sec), 2000)])
		}
	}
}
