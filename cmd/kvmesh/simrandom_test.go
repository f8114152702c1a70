package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// Only --holdout runs the hold-out seeds.
func TestRandomCellsHoldout(t *testing.T) {
	for _, args := range [][]string{
		{"--random-seeds", "7,1005"},
		{"--random-cells", "3", "--random-seed", "998"},
		{"--holdout", "--random-cells", "2"},
		{"--random-cells", "2", "--check"},
	} {
		var out, errOut bytes.Buffer
		if err := runSim(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%v: no error", args)
		} else if strings.Contains(strings.Join(args, " "), "100") && !strings.Contains(err.Error(), "hold-out") {
			t.Errorf("%v: error %q does not name the hold-out set", args, err)
		}
	}
	var f randomFlags
	one, yes, no, empty := 1, true, false, ""
	seed := uint64(1)
	f = randomFlags{cells: &one, seed: &seed, seeds: &empty, holdout: &no, reportOnly: &no}
	if got, err := f.list(); err != nil || len(got) != 1 || got[0] != 1 {
		t.Fatalf("--random-cells 1: %v %v", got, err)
	}
	one = 0
	f.holdout = &yes
	got, err := f.list()
	if err != nil || len(got) != 20 || got[0] != 1000 || got[19] != 1019 {
		t.Fatalf("--holdout: %v %v", got, err)
	}
}

// Every cell prints one line; the run fails exactly when the summary counts
// a loss, unless --report-only.
func TestRandomCellsExitFollowsLosses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	args := []string{"--random-cells", "3", "--random-seed", "1"}
	var out, errOut bytes.Buffer
	err := runSim(context.Background(), args, &out, &errOut)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1+1+3+1 {
		t.Fatalf("%d lines, want a preamble, a header, 3 cells and a summary:\n%s", len(lines), out.String())
	}
	m := regexp.MustCompile(`random cells 3: lost (\d+)`).FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("summary %q", lines[len(lines)-1])
	}
	if lost := m[1] != "0"; lost != (err != nil) || lost != strings.Contains(out.String(), "LOSS-") {
		t.Fatalf("summary %q, error %v, output:\n%s", lines[len(lines)-1], err, out.String())
	}
	out.Reset()
	if err := runSim(context.Background(), append(args, "--report-only", "--json"), &out, &errOut); err != nil {
		t.Fatalf("--report-only: %v", err)
	}
	dec := json.NewDecoder(&out)
	for i := 0; i < 3; i++ {
		var r struct {
			Cell struct {
				Seed uint64 `json:"seed"`
			} `json:"cell"`
			Requests int `json:"requests"`
		}
		if err := dec.Decode(&r); err != nil || r.Cell.Seed != uint64(1+i) || r.Requests == 0 {
			t.Fatalf("cell %d: %+v %v", i, r, err)
		}
	}
}
