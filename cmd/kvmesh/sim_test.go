package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/route"
)

func TestRunSimJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"--policies", "round-robin,kvmesh-mesh", "--replicas", "4", "--json"}
	if err := runSim(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("runSim: %v (stderr %s)", err, errOut.String())
	}
	var got struct {
		Policies []map[string]any `json:"policies"`
		Config   map[string]any   `json:"config"`
	}
	dec := json.NewDecoder(&out)
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if dec.More() {
		t.Fatal("more than one JSON value on stdout")
	}
	if len(got.Policies) != 2 || got.Policies[0]["name"] != "round-robin" || got.Policies[1]["name"] != "kvmesh-mesh" {
		t.Fatalf("policies %v", got.Policies)
	}
	for _, k := range []string{"requests", "hit_ratio", "token_hit_ratio", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "prefill_max_over_mean", "mean_queue_ms", "reasons"} {
		if _, ok := got.Policies[1][k]; !ok {
			t.Errorf("policy lacks %q", k)
		}
	}
	if got.Config["replicas"] != float64(4) {
		t.Errorf("config %v", got.Config)
	}
}

func TestRunSimTableAndErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runSim(context.Background(), []string{"--policies", "consistent-hash"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "consistent-hash") || !strings.Contains(s, "config:") {
		t.Fatalf("table:\n%s", s)
	}
	for _, args := range [][]string{{"--policies", "bogus"}, {"--replicas", "0"}, {"--trace", "/nonexistent"}, {"extra"}} {
		if err := runSim(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("runSim(%v) succeeded", args)
		}
	}
}

func TestRunSimGridAndCheck(t *testing.T) {
	dir := t.TempDir()
	html := dir + "/grid.html"
	var out, errOut bytes.Buffer
	args := []string{"--grid", "--workloads", "trace", "--loads", "0.6", "--max-num-seqs-list", "32",
		"--cache-fractions", "0.25", "--policies", "round-robin,least-loaded,consistent-hash,kvmesh-mesh,llm-d-epp", "--html", html}
	if err := runSim(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("grid: %v (stderr %s)", err, errOut.String())
	}
	if s := out.String(); !strings.Contains(s, "trace") || !strings.Contains(s, "cells 1:") {
		t.Fatalf("grid output:\n%s", s)
	}
	b, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(b), "<svg") {
		t.Fatalf("heat-map: %v", err)
	}
	for _, bad := range [][]string{{"--grid", "--loads", "x"}, {"--grid", "--max-num-seqs-list", "0"}, {"--grid", "--workloads", "nope"}, {"--route-profile", "nope"}, {"--recompute-weight", "0.5"}} {
		if err := runSim(context.Background(), bad, &out, &errOut); err == nil {
			t.Errorf("runSim(%v) succeeded", bad)
		}
	}
}

func TestPolicyFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(route.Policy) bool
	}{
		{"defaults are the default profile", nil, nil, func(p route.Policy) bool { return p == route.DefaultPolicy() }},
		{"flag overrides a field", []string{"--recompute-weight", "8"}, nil, func(p route.Policy) bool { return p.RecomputeWeight == 8 && p.KeyBlocks == 2 }},
		{"environment fills a field", nil, map[string]string{"KVMESH_KEY_BLOCKS": "3"}, func(p route.Policy) bool { return p.KeyBlocks == 3 }},
		{"flag beats environment", []string{"--inflight-factor", "3"}, map[string]string{"KVMESH_INFLIGHT_FACTOR": "4"}, func(p route.Policy) bool { return p.InFlightFactor == 3 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			pf := bindPolicyFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := applyEnv(fs, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }); err != nil {
				t.Fatal(err)
			}
			p, err := pf.Policy()
			if err != nil || !tc.check(p) {
				t.Fatalf("policy %+v, err %v", p, err)
			}
			fs2 := flag.NewFlagSet("t2", flag.ContinueOnError)
			pf2 := bindPolicyFlags(fs2)
			if err := fs2.Parse(pf.args()); err != nil {
				t.Fatal(err)
			}
			if p2, err := pf2.Policy(); err != nil || p2 != p {
				t.Fatalf("args %v round trip: %+v, %v", pf.args(), p2, err)
			}
		})
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bindPolicyFlags(fs)
	if err := fs.Parse([]string{"--key-blocks", "1.5"}); err == nil {
		t.Fatal("accepted a fractional --key-blocks")
	}
}

// TestPolicyFlagsValidate: a tunable out of range (route.Policy.Validate)
// is reported by the flag that set it, and every flag maps to a field
// Validate knows or accepts.
func TestPolicyFlagsValidate(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--load-factor", "0.5"}, "--load-factor 0.5, want >= 1"},
		{[]string{"--inflight-factor", "0"}, "--inflight-factor 0, want >= 1"},
		{[]string{"--key-blocks", "0"}, "--key-blocks 0, want >= 1"},
		{[]string{"--default-block-ms", "0"}, "--default-block-ms 0, want > 0"},
		{[]string{"--recompute-weight", "0.9"}, "--recompute-weight 0.9, want >= 1"},
		{[]string{"--default-seq-ms", "0"}, "--default-seq-ms 0, want > 0"},
		{[]string{"--min-excess-blocks", "0"}, ""},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		pf := bindPolicyFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		_, err := pf.Policy()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%v: error %q, want %q", tc.args, got, tc.want)
		}
	}
}
