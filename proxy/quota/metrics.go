package quota

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// otherTenants labels the tenants without an override of their own: a
// tenant's identity (an API key, an address) is not a label, and their
// number is not bounded.
const otherTenants = "other"

type metrics struct {
	tokens, rejections *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, tenants map[uint64]Tenant) *metrics {
	m := &metrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_tenant_tokens_total",
			Help: "Tokens this router's requests used, by tenant (an override's name, else other) and kind (input, output): the engine's usage when it reported one, else the estimate."},
			[]string{"tenant", "kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_tenant_rejections_total",
			Help: "Requests this router answered 429 because their tenant's mesh-wide token budget was spent, by tenant and the budget's kind."},
			[]string{"tenant", "kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.tokens, m.rejections)
	}
	m.initTenants(map[uint64]Tenant{0: {Name: otherTenants}})
	m.initTenants(tenants)
	return m
}

// initTenants makes the series of tenants' names, zeros rather than
// gaps. A name a reloaded file no longer has keeps its series (its
// counts stay true).
func (m *metrics) initTenants(tenants map[uint64]Tenant) {
	for _, t := range tenants {
		for _, k := range []string{KindInput, KindOutput} {
			m.tokens.WithLabelValues(t.Name, k)
			m.rejections.WithLabelValues(t.Name, k)
		}
	}
}

func (m *metrics) charged(name string, in, out int64) {
	m.tokens.WithLabelValues(name, KindInput).Add(float64(in))
	m.tokens.WithLabelValues(name, KindOutput).Add(float64(out))
}

func (m *metrics) rejected(name, kind string) { m.rejections.WithLabelValues(name, kind).Inc() }

// TenantUsage is one tenant's line on the status page.
type TenantUsage struct {
	Tenant uint64 `json:"tenant"`
	Name   string `json:"name"`
	Limit  Limit  `json:"limit"`
	// Input and Output are the mesh-wide usage in the window; OwnInput
	// and OwnOutput this router's share of it.
	Input     int64 `json:"input"`
	Output    int64 `json:"output"`
	OwnInput  int64 `json:"own_input"`
	OwnOutput int64 `json:"own_output"`
}

// Status is what the status page shows of the budgets.
type Status struct {
	Window  time.Duration `json:"window"`
	Buckets int           `json:"buckets"`
	Default Limit         `json:"default"`
	// Peers is the routers heard within three intervals; Tenants the
	// heaviest tenants this router counts, by mesh-wide usage.
	Peers   int           `json:"peers"`
	Tenants []TenantUsage `json:"tenants"`
}

// Status reports the n heaviest tenants this router counts.
func (l *Ledger) Status(n int) Status {
	now := l.cfg.Now()
	cur := l.bucket(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Status{Window: l.cfg.Window, Buckets: l.cfg.Buckets, Default: l.budgets.Load().def, Peers: l.fresh(now) - 1}
	for t, s := range l.own {
		lim, name := l.limitOf(t)
		u := TenantUsage{Tenant: t, Name: name, Limit: lim,
			OwnInput: l.sumCells(s.cells, 0, cur), OwnOutput: l.sumCells(s.cells, 1, cur)}
		u.Input, u.Output = u.OwnInput, u.OwnOutput
		for _, p := range l.peers {
			if cells, ok := p.tenants[t]; ok {
				u.Input += l.sumCells(cells, 0, cur)
				u.Output += l.sumCells(cells, 1, cur)
			}
		}
		st.Tenants = append(st.Tenants, u)
	}
	slices.SortFunc(st.Tenants, func(a, b TenantUsage) int {
		switch x, y := a.Input+a.Output, b.Input+b.Output; {
		case x > y:
			return -1
		case x < y:
			return 1
		}
		return cmpU64(a.Tenant, b.Tenant)
	})
	st.Tenants = st.Tenants[:min(len(st.Tenants), n)]
	return st
}
