package metricsum

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCounter(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "things_total", Help: "h"}, []string{"kind", "reason"})
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "other_total", Help: "h"})
	reg.MustRegister(c, other)
	c.WithLabelValues("a", "x").Add(1)
	c.WithLabelValues("b", "x").Add(2)
	c.WithLabelValues("b", "y").Add(4)
	other.Add(100)
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"all", Counter(t, reg, "things_total", nil), 7},
		{"any value b", Counter(t, reg, "things_total", AnyValue("b")), 6},
		{"any value empty", Counter(t, reg, "things_total", AnyValue("")), 7},
		{"label reason=x", Counter(t, reg, "things_total", Label("reason", "x")), 3},
		{"label kind=x (no such series)", Counter(t, reg, "things_total", Label("kind", "x")), 0},
		{"label empty", Counter(t, reg, "things_total", Label("reason", "")), 7},
		{"absent family", Counter(t, reg, "none_total", nil), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}
