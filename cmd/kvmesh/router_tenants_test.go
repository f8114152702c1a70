package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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

// TestTenantBudgetsReload: SIGHUP's reload reads the budgets file again;
// a file that does not read keeps the budgets in force, with a logged
// error naming the file and the line.
func TestTenantBudgetsReload(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	file := writeFile(t, "# no budget yet\n")
	c, err := parseRouterFlags([]string{"--name", "r", "--tenant-budgets", file}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tenantLedger(&c, prometheus.NewRegistry())
	if err != nil || l == nil {
		t.Fatalf("a budgets file without budgets: no ledger to reload into: %v %v", l, err)
	}
	var logs strings.Builder
	r := &router{log: hclog.New(&hclog.LoggerOptions{Output: &logs}), budgets: l, tenants: c.tenants}
	a := proxy.TenantKeys("team-a")[1]
	if _, d := l.Reserve(a, 1e9, 1); !d.OK {
		t.Fatalf("budgeted before any: %+v", d)
	}
	if err := os.WriteFile(file, []byte("team-a 100 -\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload()
	if _, d := l.Reserve(a, 80, 1); !d.OK {
		t.Fatalf("refused within the reloaded budget: %+v\n%s", d, logs.String())
	}
	if _, d := l.Reserve(a, 30, 1); d.OK || d.Limit != 100 {
		t.Fatalf("the reloaded budget not applied: %+v\n%s", d, logs.String())
	}
	if !strings.Contains(logs.String(), "reloaded the tenant budgets") {
		t.Fatalf("no log of the reload:\n%s", logs.String())
	}
	if err := os.WriteFile(file, []byte("team-a 100 -\nteam-b lots -\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	r.reload()
	if _, d := l.Reserve(a, 30, 1); d.OK || d.Limit != 100 {
		t.Fatalf("a bad file changed the budgets: %+v", d)
	}
	if got := logs.String(); !strings.Contains(got, "keeping the previous tenant budgets") || !strings.Contains(got, "line 2") || !strings.Contains(got, file) {
		t.Fatalf("the bad file's error was not logged clearly:\n%s", got)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	r.reload()
	if _, d := l.Reserve(a, 30, 1); d.OK || d.Limit != 100 {
		t.Fatalf("a missing file changed the budgets: %+v", d)
	}
}
