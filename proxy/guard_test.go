package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kvmesh/kvmesh/route"
)

// A routing policy that panics or chooses no candidate costs the request
// its placement, not its answer: it goes to the least loaded candidate,
// and the fault is logged.
func TestGuardedPickSurvivesAPolicyFault(t *testing.T) {
	cands := []route.Candidate{
		{Detail: &route.Detail{ID: "a"}, InFlight: 5},
		{Detail: &route.Detail{ID: "b"}, InFlight: 1},
		{Detail: &route.Detail{ID: "c"}, InFlight: 3},
	}
	for _, tc := range []struct {
		name  string
		pick  func(route.Request, []route.Candidate) route.Decision
		fault string
	}{
		{"panic", func(route.Request, []route.Candidate) route.Decision { panic("index out of range [-1]") }, "panic: index out of range"},
		{"no candidate", func(route.Request, []route.Candidate) route.Decision { return route.Decision{Index: -1} }, "index -1 of 3"},
		{"past the end", func(route.Request, []route.Candidate) route.Decision { return route.Decision{Index: 3} }, "index 3 of 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			p, _, _ := newTestProxy(t, newFakeView([]string{"m"}), func(c *Config) {
				c.Logger = hclog.New(&hclog.LoggerOptions{Output: &logs})
			})
			d := p.guardedPick(tc.pick, route.Request{}, cands)
			if d.Index != 1 || d.Reason != ReasonPolicyFault {
				t.Errorf("decision %+v, want the least loaded (1) by %s", d, ReasonPolicyFault)
			}
			if !strings.Contains(logs.String(), tc.fault) {
				t.Errorf("log %q lacks %q", logs.String(), tc.fault)
			}
		})
	}
	p, _, _ := newTestProxy(t, newFakeView([]string{"m"}), nil)
	ok := func(route.Request, []route.Candidate) route.Decision {
		return route.Decision{Index: 2, Reason: route.ReasonPrefix}
	}
	if d := p.guardedPick(ok, route.Request{}, cands); d.Index != 2 || d.Reason != route.ReasonPrefix {
		t.Errorf("a sound decision was changed: %+v", d)
	}
}
