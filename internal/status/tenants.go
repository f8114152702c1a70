package status

import (
	"fmt"

	"github.com/kvmesh/kvmesh/proxy/quota"
)

// maxTenantRows bounds the tenants the page lists (the heaviest).
const maxTenantRows = 10

// tenantsView is the tenants' token budgets: the heaviest tenants'
// mesh-wide usage in the window against their budgets. On says the
// router enforces budgets.
type tenantsView struct {
	On            bool
	Window, Peers string
	Default       string
	Rows          []tenantRow
}

type tenantRow struct {
	Name, Input, Output, Own string
	Warn                     bool // at 90 % of a budget or more
}

// addTenants reads the budgets' status, when the router has budgets.
func (v *view) addTenants(st func(n int) quota.Status) {
	if st == nil {
		return
	}
	s := st(maxTenantRows)
	t := tenantsView{On: true, Window: s.Window.String(), Peers: fmt.Sprint(s.Peers), Default: limitText(s.Default)}
	for _, u := range s.Tenants {
		name := u.Name
		if name == "other" {
			name = fmt.Sprintf("%016x", u.Tenant)[:8] // a hash's prefix, not the key
		}
		t.Rows = append(t.Rows, tenantRow{Name: name,
			Input:  usedText(u.Input, u.Limit.Input),
			Output: usedText(u.Output, u.Limit.Output),
			Own:    humanCount(float64(u.OwnInput)) + " / " + humanCount(float64(u.OwnOutput)),
			Warn:   over(u.Input, u.Limit.Input) || over(u.Output, u.Limit.Output)})
	}
	v.Tenants = t
}

func over(used, limit int64) bool { return limit > 0 && used*10 >= limit*9 }

func usedText(used, limit int64) string {
	if limit <= 0 {
		return humanCount(float64(used)) + " (no limit)"
	}
	return fmt.Sprintf("%s of %s", humanCount(float64(used)), humanCount(float64(limit)))
}

func limitText(l quota.Limit) string {
	text := func(n int64) string {
		if n <= 0 {
			return "no limit"
		}
		return humanCount(float64(n))
	}
	return "input " + text(l.Input) + " · output " + text(l.Output)
}
