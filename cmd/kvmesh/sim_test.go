package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
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
