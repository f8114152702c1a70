// Package status serves a router's status page: one plain HTML page for a
// person (what HAProxy's stats page or the Consul UI are to theirs) with
// the mesh members, the replicas and their owners, recent routing
// decisions and how well the router predicts cached tokens. It reads the
// mesh through Mesh and the kvmesh_* metrics through a
// prometheus.Gatherer, so it needs no plumbing of its own; the page has no
// external assets (inline CSS and SVG) and refreshes itself.
package status

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/prometheus/client_golang/prometheus"
)

// Mesh is what the page reads from the router's mesh; *mesh.Mesh
// implements it.
type Mesh interface {
	// Members lists the routers this router knows.
	Members() []mesh.MemberInfo
	// Debug returns the mesh's picture of members and replicas.
	Debug() mesh.DebugInfo
}

// Defaults of Config.
const (
	DefaultRefresh = 5 * time.Second
	// historyLen bounds the samples kept for rates and sparklines.
	historyLen = 120
	// recentWindow is how far back "recent" figures reach.
	recentWindow = 5 * time.Minute
	// maxRefresh bounds the ?refresh= query parameter.
	maxRefresh = time.Hour
)

// Config configures a Page.
type Config struct {
	// Router is this router's name, shown in the title.
	Router string
	// Mesh is the router's mesh (required).
	Mesh Mesh
	// Gatherer is the router's metrics registry (nil: the page shows
	// members and replicas only).
	Gatherer prometheus.Gatherer
	// Refresh is how often the page reloads itself (default
	// DefaultRefresh); ?refresh=SECONDS overrides it per view, 0 stops it.
	Refresh time.Duration
	// Logger logs render failures (default: null logger).
	Logger hclog.Logger
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
	// Tenants reports the tenants' token budgets (quota.Ledger.Status;
	// nil: the router has none).
	Tenants func(n int) quota.Status
}

// Page is the status page handler. Counter history (for recent rates and
// sparklines) is sampled when the page is served, so it grows while
// someone watches; no goroutine runs in between. Safe for concurrent use.
type Page struct {
	cfg Config

	mu   sync.Mutex
	hist []sample // oldest first, at most historyLen
}

// New returns a Page.
func New(cfg Config) (*Page, error) {
	if cfg.Mesh == nil {
		return nil, fmt.Errorf("status: Config.Mesh is required")
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Page{cfg: cfg}, nil
}

// securityPolicy allows nothing but the page's own inline styles: no
// scripts, no external assets.
const securityPolicy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page on GET and HEAD.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method "+r.Method+" not allowed on the status page", http.StatusMethodNotAllowed)
		return
	}
	refresh := p.cfg.Refresh
	if s := r.URL.Query().Get("refresh"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || time.Duration(n)*time.Second > maxRefresh {
			http.Error(w, fmt.Sprintf("refresh %q: want whole seconds from 0 (off) to %d", s, int(maxRefresh/time.Second)), http.StatusBadRequest)
			return
		}
		refresh = time.Duration(n) * time.Second
	}
	v := p.build(refresh)
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, v); err != nil {
		p.cfg.Logger.Error("status page render failed", "error", err)
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", securityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(buf.Bytes())
	}
}

// build reads the sources, records a history sample and returns what the
// template renders.
func (p *Page) build(refresh time.Duration) *view {
	now := p.cfg.Now()
	v := &view{Router: p.cfg.Router, Generated: now.UTC().Format("2006-01-02 15:04:05 MST"), RefreshSeconds: int(refresh / time.Second)}

	v.addMembers(p.cfg.Mesh.Members())
	v.addTenants(p.cfg.Tenants)
	v.addReplicas(p.cfg.Mesh.Debug(), now)

	if p.cfg.Gatherer == nil {
		v.Problems = append(v.Problems, "no metrics registry: decisions and cached tokens not shown")
		return v
	}
	fams, err := p.cfg.Gatherer.Gather()
	if err != nil {
		// Gather returns what it could collect alongside the error.
		v.Problems = append(v.Problems, "gathering metrics: "+err.Error())
	}
	cur := readSample(fams, now)
	hist := p.record(cur, refresh)
	v.addMetrics(cur, hist, fams)
	return v
}

// record appends cur to the history unless the last sample is too recent
// (several viewers, or quick reloads), and returns the samples older than
// cur, oldest first. A restart of the counters (a new registry) clears it.
func (p *Page) record(cur sample, refresh time.Duration) []sample {
	gap := max(refresh/2, time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.hist); n > 0 && cur.total() < p.hist[n-1].total() {
		p.hist = p.hist[:0]
	}
	older := make([]sample, len(p.hist))
	copy(older, p.hist)
	if n := len(p.hist); n == 0 || cur.at.Sub(p.hist[n-1].at) >= gap {
		if n == historyLen {
			copy(p.hist, p.hist[1:])
			p.hist = p.hist[:n-1]
		}
		p.hist = append(p.hist, cur)
	}
	return older
}
