package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// TestTenantFlags: budgets are off by default, on with a default budget
// or a budgets file (whose names stand for a key, a header value or an
// address), and refused when out of range.
func TestTenantFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	c, err := parseRouterFlags([]string{"--name", "r"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := tenantLedger(&c, nil); l != nil || err != nil {
		t.Fatalf("budgets on by default: %v %v", l, err)
	}
	file := writeFile(t, "* 100 -\nteam-a 5000 70\n")
	c, err = parseRouterFlags([]string{"--name", "r", "--tenant-budgets", file, "--tenant-window", "30s"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tenantLedger(&c, prometheus.NewRegistry())
	if err != nil || l == nil || l.Window() != 30*time.Second {
		t.Fatalf("budgets file: %v %v", l, err)
	}
	if _, d := l.Reserve(proxy.TenantKeys("team-a")[1], 4000, 1); !d.OK {
		t.Fatalf("team-a's own budget not applied: %+v", d)
	}
	l.Reserve(proxy.TenantKeys("someone")[1], 90, 1)
	if _, d := l.Reserve(proxy.TenantKeys("someone")[1], 20, 1); d.OK || d.Limit != 100 {
		t.Fatalf("the file's default not applied: %+v", d)
	}
	for _, args := range [][]string{{"--tenant-input-tokens", "-1"}, {"--tenant-window", "10ms"}} {
		if _, err := parseRouterFlags(append([]string{"--name", "r"}, args...), none, io.Discard); err == nil || !strings.Contains(err.Error(), "--tenant") {
			t.Errorf("%v: error %v", args, err)
		}
	}
	c, _ = parseRouterFlags([]string{"--name", "r", "--tenant-budgets", writeFile(t, "a 1\n")}, none, io.Discard)
	if _, err := tenantLedger(&c, nil); err == nil {
		t.Error("a bad budgets file was taken")
	}
}
