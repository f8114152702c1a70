package status

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/quota"
)

// TestTenantsSection: the page lists the heaviest tenants' mesh-wide
// usage against their budgets, marks one near its budget, and names a
// tenant without an override by a hash prefix, never by its key; a
// router without budgets shows no such section.
func TestTenantsSection(t *testing.T) {
	st := quota.Status{Window: time.Minute, Buckets: 12, Default: quota.Limit{Input: 1000}, Peers: 2, Tenants: []quota.TenantUsage{
		{Tenant: 0xabcdef0123456789, Name: "other", Limit: quota.Limit{Input: 1000}, Input: 950, OwnInput: 300},
		{Tenant: 7, Name: "team-a", Limit: quota.Limit{Input: 5000, Output: 100}, Input: 10, Output: 5, OwnInput: 10, OwnOutput: 5},
	}}
	p, err := New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: newFakeMetrics().withNewFamilies().reg,
		Tenants: func(int) quota.Status { return st }})
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, p, http.MethodGet, "/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, want := range []string{`id="tenants"`, `data-tenants-peers="2"`, `data-tenant="abcdef01"><span class="badge warn">input 950 of 1000`,
		`data-tenant="team-a">input 10 of 5000 · output 5 of 100`, `data-tenants-default="input 1000 · output no limit"`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	p, _ = New(Config{Router: "r1", Mesh: &fakeMesh{threeRouters(), replicas()}, Gatherer: newFakeMetrics().withNewFamilies().reg})
	if _, body := get(t, p, http.MethodGet, "/"); strings.Contains(body, `id="tenants"`) {
		t.Error("a router without budgets shows a tenants section")
	}
}
