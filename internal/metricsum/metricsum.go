// Package metricsum reads counters back from a Prometheus registry, for
// tests: the sum of a counter family's series, all of them or those with
// a given label. The tests of several packages check what their code
// counted this way; one reader keeps them alike.
package metricsum

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Counter sums the series of counter family name gathered from g whose
// labels match (nil: every series). A gather error fails the test.
func Counter(t testing.TB, g prometheus.Gatherer, name string, match func([]*dto.LabelPair) bool) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if match == nil || match(m.GetLabel()) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// AnyValue matches the series with a label of value v, whatever its
// name; "" matches every series.
func AnyValue(v string) func([]*dto.LabelPair) bool {
	return func(ls []*dto.LabelPair) bool {
		if v == "" {
			return true
		}
		for _, l := range ls {
			if l.GetValue() == v {
				return true
			}
		}
		return false
	}
}

// Label matches the series whose label name is v; v "" matches every
// series.
func Label(name, v string) func([]*dto.LabelPair) bool {
	return func(ls []*dto.LabelPair) bool {
		if v == "" {
			return true
		}
		for _, l := range ls {
			if l.GetName() == name && l.GetValue() == v {
				return true
			}
		}
		return false
	}
}
