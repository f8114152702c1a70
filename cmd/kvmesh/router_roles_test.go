package main

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseReplicaSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want replicaSpec
	}{
		{"http://10.0.0.5:8000/", replicaSpec{id: "http://10.0.0.5:8000"}},
		{"http://10.0.0.5:8000/#prefill", replicaSpec{id: "http://10.0.0.5:8000", declared: true, role: route.RolePrefill}},
		{" https://p:30000#Prefill:8998 ", replicaSpec{id: "https://p:30000", declared: true, role: route.RolePrefill, bootstrap: 8998}},
		{"http://d:1#decode", replicaSpec{id: "http://d:1", declared: true, role: route.RoleDecode}},
		{"http://w:1#both", replicaSpec{id: "http://w:1", declared: true, role: route.RoleBoth}},
	} {
		got, err := parseReplicaSpec(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"10.0.0.5:8000#prefill", "http://h:1#prefil", "http://h:1#decode:8998",
		"http://h:1#prefill:0", "http://h:1#prefill:70000", "http://h:1#prefill:1:2",
		"http://h:1#:8998", "http://h:1#prefill:x", "http://h:1#", "http://h:1#both:1"} {
		if got, err := parseReplicaSpec(bad); err == nil {
			t.Errorf("%q parses: %+v", bad, got)
		}
	}
}

// TestRouterReplicaRoleFlags: --replica takes a role, --pd-protocol a
// protocol; bad ones are refused with the flag's name.
func TestRouterReplicaRoleFlags(t *testing.T) {
	env := func(string) (string, bool) { return "", false }
	cfg, err := parseRouterFlags([]string{"--name", "a", "--replica", "http://p:1/#prefill:9", "--replica", "http://d:2", "--pd-protocol", "sglang"}, env, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.replicas, " ") != "http://p:1#prefill:9 http://d:2" || cfg.pd.String() != "sglang" {
		t.Fatalf("replicas %q, protocol %v", cfg.replicas, cfg.pd)
	}
	for _, args := range [][]string{{"--replica", "http://p:1#prefil"}, {"--pd-protocol", "nixl"}} {
		_, err := parseRouterFlags(append([]string{"--name", "a"}, args...), env, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestRoleGauge(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	g := newRoleGauge(reg)
	g.show("http://a", route.RolePrefill)
	g.show("http://a", route.RoleDecode)
	g.show("http://b", route.RoleBoth)
	if n := testutil.CollectAndCount(reg); n != 2 {
		t.Fatalf("%d series, want one per replica", n)
	}
	if v := testutil.ToFloat64(g.g.WithLabelValues("http://a", "decode")); v != 1 {
		t.Fatalf("a's decode series %v", v)
	}
	g.drop("http://a")
	if n := testutil.CollectAndCount(reg); n != 1 {
		t.Fatalf("%d series after a drop", n)
	}
}
