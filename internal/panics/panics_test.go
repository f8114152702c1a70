package panics

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestGuard: a panic in f is recovered, counted under its where and
// logged with its stack; f without one runs as is.
func TestGuard(t *testing.T) {
	var log strings.Builder
	reg := prometheus.NewPedanticRegistry()
	r := New(reg, hclog.New(&hclog.LoggerOptions{Output: &log}))
	ran := false
	if r.Guard(HealthCheck, func() { ran = true }) || !ran {
		t.Fatal("f without a panic: reported as panicked, or not run")
	}
	if !r.Guard(HealthCheck, func() { panic("test: a bug") }) {
		t.Fatal("the panic was not reported")
	}
	if n := testutil.ToFloat64(r.Counter(HealthCheck)); n != 1 {
		t.Errorf("%v counted, want 1", n)
	}
	if n, err := testutil.GatherAndCount(reg, "kvmesh_recovered_panics_total"); err != nil || n != 5 {
		t.Errorf("%d series (%v), want one per where, zeros included", n, err)
	}
	if s := log.String(); !strings.Contains(s, "test: a bug") || !strings.Contains(s, "where=health_check") || !strings.Contains(s, "goroutine") {
		t.Errorf("log: %s", s)
	}
}
