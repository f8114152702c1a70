package quota

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultWindow      = time.Minute
	DefaultBuckets     = 12
	DefaultMaxTenants  = 16384
	DefaultWireTenants = 64
	DefaultInterval    = time.Second
)

// Limits on what a router holds of its peers' gossip, whatever they send.
const (
	maxPeers       = 1024
	maxPeerTenants = 4096
	maxWireTenants = 1024
	maxBuckets     = 250 // a ring must fit a byte of age on the wire
)

// Kinds of tokens, the metrics' kind label.
const (
	KindInput  = "input"
	KindOutput = "output"
)

// Limit is a tenant's budget per window; 0 leaves that kind unlimited.
type Limit struct {
	Input, Output int64
}

func (l Limit) none() bool { return l.Input <= 0 && l.Output <= 0 }

// Tenant is an override of the default budget: its name (the metrics'
// tenant label) and its limit.
type Tenant struct {
	Name  string
	Limit Limit
}

// Config configures a Ledger.
type Config struct {
	// Window is the budget's period (default DefaultWindow); every router
	// of the mesh must use the same Window and Buckets (MergeGossip
	// refuses a peer's usage counted otherwise).
	Window time.Duration
	// Buckets cuts the window (default DefaultBuckets): more is a
	// finer slide and more bytes of gossip per tenant.
	Buckets int
	// Default is every tenant's budget unless Tenants names it
	// (both replaced by Ledger.SetBudgets).
	Default Limit
	// Tenants overrides the default by tenant (the proxy's tenant hash).
	Tenants map[uint64]Tenant
	// MaxTenants bounds the tenants this router counts (default
	// DefaultMaxTenants); beyond them, new tenants share one entry under
	// the default budget until old ones leave the window.
	MaxTenants int
	// WireTenants bounds the tenants one gossip lists (default
	// DefaultWireTenants, at most 1024).
	WireTenants int
	// Interval is how often the mesh gossips the usage (default
	// DefaultInterval): a router's share of the headroom is per interval,
	// and a peer unheard for three is stale.
	Interval time.Duration
	// StaleShare counts a stale peer (unheard for three intervals, heard
	// within the window) as using at least its share of each budget
	// (doc.go, Bounds).
	StaleShare bool
	// Registerer registers the metrics (nil: none).
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) defaults() error {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Buckets == 0 {
		c.Buckets = DefaultBuckets
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = DefaultMaxTenants
	}
	if c.WireTenants == 0 {
		c.WireTenants = DefaultWireTenants
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.Window < time.Second || c.Window%time.Millisecond != 0:
		return fmt.Errorf("quota: window %v must be at least a second, in whole milliseconds", c.Window)
	case c.Buckets < 1 || c.Buckets > maxBuckets || c.Window/time.Duration(c.Buckets) < time.Millisecond:
		return fmt.Errorf("quota: %d buckets: from 1 to %d, each at least a millisecond", c.Buckets, maxBuckets)
	case c.MaxTenants < 1 || c.WireTenants < 1 || c.WireTenants > maxWireTenants:
		return fmt.Errorf("quota: max tenants %d must be positive, wire tenants %d from 1 to %d", c.MaxTenants, c.WireTenants, maxWireTenants)
	case c.Interval <= 0 || c.Default.Input < 0 || c.Default.Output < 0:
		return errors.New("quota: the interval must be positive and the default limits not negative")
	}
	return nil
}

// Ledger counts the tenants' tokens and decides whether a request fits
// its tenant's budget. It is safe for concurrent use.
type Ledger struct {
	cfg  Config
	bw   int64 // bucket width, ns
	ring int   // cells per series: the window's Buckets+1 and one older
	m    *metrics

	// budgets is the default budget and the overrides, replaced whole
	// by SetBudgets (a reloaded budgets file) while requests read it.
	budgets atomic.Pointer[budgets]

	mu       sync.Mutex
	own      map[uint64]*series
	overflow *series // the tenants beyond MaxTenants, together
	peers    map[peerID]*peer
}

// pn is a PN-counter's two halves: tokens charged, tokens given back.
type pn struct{ add, sub uint64 }

func (p pn) net() int64 {
	if p.sub >= p.add {
		return 0
	}
	return int64(min(p.add-p.sub, math.MaxInt64))
}

// cell is one bucket's counts; b is its absolute bucket number (0: empty).
type cell struct {
	b       int64
	in, out pn
}

// series is one tenant's cells on this router.
type series struct {
	cells  []cell
	unseen [2]int64 // admitted since the last gossip: input, output
	// meanOut is the tenant's mean output per request here, the
	// reservation of a request without max_tokens.
	meanOut float64
}

// peerID is a peer's incarnation: a restarted router's new counts start
// from zero, and its old ones still count until they leave the window.
type peerID struct {
	name string
	boot uint64
}

type peer struct {
	heard   time.Time
	tenants map[uint64][]cell
	rest    []cell
}

// New returns a Ledger, or nil when no tenant has a budget (every
// request passes; the proxy then reads nothing).
func New(cfg Config) (*Ledger, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	l := &Ledger{cfg: cfg, bw: int64(cfg.Window) / int64(cfg.Buckets), ring: cfg.Buckets + 2,
		own: map[uint64]*series{}, peers: map[peerID]*peer{}}
	l.overflow = l.newSeries()
	l.m = newMetrics(cfg.Registerer, cfg.Tenants)
	l.budgets.Store(&budgets{def: cfg.Default, tenants: cfg.Tenants})
	return l, nil
}

// budgets is what SetBudgets replaces: Config's Default and Tenants.
type budgets struct {
	def     Limit
	tenants map[uint64]Tenant
}

// SetBudgets replaces the default budget and the overrides (Config's
// Default and Tenants), as a reloaded budgets file does: the requests
// admitted from then on are held to them, against the usage counted so
// far. A negative limit is refused, and the budgets stay as they were.
// The ledger keeps the rest of its Config (window, buckets, bounds).
func (l *Ledger) SetBudgets(def Limit, tenants map[uint64]Tenant) error {
	if def.Input < 0 || def.Output < 0 {
		return errors.New("quota: the default limits must not be negative")
	}
	for _, t := range tenants {
		if t.Limit.Input < 0 || t.Limit.Output < 0 {
			return fmt.Errorf("quota: tenant %q: limits must not be negative", t.Name)
		}
	}
	l.m.initTenants(tenants)
	l.budgets.Store(&budgets{def: def, tenants: tenants})
	return nil
}

// Enabled reports whether any tenant has a budget.
func (c Config) Enabled() bool {
	if !c.Default.none() {
		return true
	}
	for _, t := range c.Tenants {
		if !t.Limit.none() {
			return true
		}
	}
	return false
}

// Window is the budgets' period.
func (l *Ledger) Window() time.Duration { return l.cfg.Window }

func (l *Ledger) newSeries() *series { return &series{cells: make([]cell, l.ring)} }

// bucket is the absolute bucket of t.
func (l *Ledger) bucket(t time.Time) int64 { return t.UnixNano() / l.bw }

// limitOf is tenant's budget and the name its metrics carry.
func (l *Ledger) limitOf(tenant uint64) (Limit, string) {
	b := l.budgets.Load()
	if t, ok := b.tenants[tenant]; ok {
		return t.Limit, t.Name
	}
	return b.def, otherTenants
}

// Ticket is what a request holds of its tenant's budget until Settle.
// The zero Ticket holds nothing.
type Ticket struct {
	tenant  uint64
	b       int64
	in, out int64
	s       *series
	name    string
}

// Held reports whether the ticket holds a charge to settle.
func (t Ticket) Held() bool { return t.s != nil }

// Decision is Reserve's answer.
type Decision struct {
	// OK: the request fits; otherwise Kind is the budget it does not
	// fit, Limit that budget, Used the tenant's mesh-wide usage in the
	// window, and RetryAfter when enough of the window frees.
	OK         bool
	Kind       string
	Limit      int64
	Used       int64
	RetryAfter time.Duration
}

// Reserve charges a request of tenant, of in estimated input tokens and
// out reserved output tokens (0: the tenant's mean here), when it fits
// the tenant's budget (doc.go, Admitting). A tenant without a budget is
// not counted.
func (l *Ledger) Reserve(tenant uint64, in, out int64) (Ticket, Decision) {
	lim, name := l.limitOf(tenant)
	if lim.none() {
		return Ticket{}, Decision{OK: true}
	}
	now := l.cfg.Now()
	cur := l.bucket(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.seriesOf(tenant, cur)
	if s == l.overflow {
		lim, name = l.budgets.Load().def, otherTenants
	}
	in, out = max(in, 0), max(out, 0)
	if out == 0 {
		out = int64(math.Ceil(s.meanOut))
	}
	n := l.fresh(now)
	for k, want := range [2]int64{in, out} {
		limit := [2]int64{lim.Input, lim.Output}[k]
		if limit <= 0 {
			continue
		}
		want = min(want, limit)
		used := l.used(tenant, s, k, cur, now, limit)
		u := s.unseen[k]
		fits := used+want <= limit
		share := u == 0 || int64(n)*(u+want) <= limit-used+u
		if fits && share {
			continue
		}
		d := Decision{Kind: kindName(k), Limit: limit, Used: used, RetryAfter: l.cfg.Interval}
		if !fits {
			d.RetryAfter = l.retryAfter(tenant, s, k, cur, now, used+want-limit)
		}
		l.m.rejected(name, d.Kind)
		return Ticket{}, d
	}
	c := l.cellOf(s, cur)
	c.in.add += uint64(in)
	c.out.add += uint64(out)
	s.unseen[0] += in
	s.unseen[1] += out
	return Ticket{tenant: tenant, b: cur, in: in, out: out, s: s, name: name}, Decision{OK: true}
}

// Settle corrects t's charge to what the request used: in and out
// tokens (the engine's usage, or the caller's estimate; negative keeps
// what was charged). A request that never reached an engine settles at
// 0 and 0.
func (l *Ledger) Settle(t Ticket, in, out int64) {
	if t.s == nil {
		return
	}
	if in < 0 {
		in = t.in
	}
	if out < 0 {
		out = t.out
	}
	l.m.charged(t.name, in, out)
	cur := l.bucket(l.cfg.Now())
	l.mu.Lock()
	defer l.mu.Unlock()
	s := t.s
	s.meanOut += (float64(out) - s.meanOut) * meanOutWeight
	for k, d := range [2]int64{in - t.in, out - t.out} {
		if d == 0 {
			continue
		}
		c := &s.cells[t.b%int64(l.ring)]
		if c.b != t.b {
			if d < 0 {
				continue // the charge has left the window already
			}
			c = l.cellOf(s, cur)
		}
		p := &c.in
		if k == 1 {
			p = &c.out
		}
		if d > 0 {
			p.add += uint64(d)
			s.unseen[k] += d
		} else {
			p.sub += uint64(-d)
		}
	}
}

// meanOutWeight is each request's weight in a tenant's mean output: about
// the last twenty requests.
const meanOutWeight = 1.0 / 20

// seriesOf is tenant's own series, made when there is room (sweeping
// the tenants whose counts all left first), else the overflow.
func (l *Ledger) seriesOf(tenant uint64, cur int64) *series {
	if s := l.own[tenant]; s != nil {
		return s
	}
	if len(l.own) >= l.cfg.MaxTenants {
		l.sweep(cur)
		if len(l.own) >= l.cfg.MaxTenants {
			return l.overflow
		}
	}
	s := l.newSeries()
	l.own[tenant] = s
	return s
}

// sweep drops the own series with nothing in the ring any more.
func (l *Ledger) sweep(cur int64) {
	for t, s := range l.own {
		if !l.live(s.cells, cur) {
			delete(l.own, t)
		}
	}
}

// live reports whether cells hold a bucket still in the ring.
func (l *Ledger) live(cells []cell, cur int64) bool {
	for i := range cells {
		if cells[i].b > cur-int64(l.ring) {
			return true
		}
	}
	return false
}

// cellOf is s's cell of bucket b, cleared when it held an older bucket.
func (l *Ledger) cellOf(s *series, b int64) *cell {
	c := &s.cells[b%int64(l.ring)]
	if c.b != b {
		*c = cell{b: b}
	}
	return c
}

// inWindow reports whether bucket b overlaps the window ending in cur.
func (l *Ledger) inWindow(b, cur int64) bool {
	return b != 0 && b >= cur-int64(l.cfg.Buckets) && b <= cur
}

// sumCells is the window's net tokens of kind k in cells.
func (l *Ledger) sumCells(cells []cell, k int, cur int64) int64 {
	var n int64
	for i := range cells {
		if c := &cells[i]; l.inWindow(c.b, cur) {
			n += c.kind(k).net()
		}
	}
	return n
}

func (c *cell) kind(k int) pn {
	if k == 0 {
		return c.in
	}
	return c.out
}

// fresh is the routers that admit for the mesh now: this one and the
// peers heard within three intervals.
func (l *Ledger) fresh(now time.Time) int {
	n := 1
	for _, p := range l.peers {
		if now.Sub(p.heard) <= 3*l.cfg.Interval {
			n++
		}
	}
	return n
}

// used is tenant's mesh-wide usage of kind k in the window: its own
// series s, and every peer's last word (at least a stale peer's share of
// limit, with StaleShare).
func (l *Ledger) used(tenant uint64, s *series, k int, cur int64, now time.Time, limit int64) int64 {
	n := l.sumCells(s.cells, k, cur)
	var share int64
	if l.cfg.StaleShare {
		routers := int64(1)
		for _, p := range l.peers {
			if now.Sub(p.heard) <= l.cfg.Window {
				routers++
			}
		}
		share = limit / routers
	}
	for _, p := range l.peers {
		var u int64
		if cells, ok := p.tenants[tenant]; ok {
			u = l.sumCells(cells, k, cur)
		}
		if age := now.Sub(p.heard); share > 0 && age > 3*l.cfg.Interval && age <= l.cfg.Window {
			u = max(u, share)
		}
		n += u
	}
	return n
}

// retryAfter is the time until the window's oldest buckets, leaving it,
// free over tokens of kind k; the whole window when they never would.
func (l *Ledger) retryAfter(tenant uint64, s *series, k int, cur int64, now time.Time, over int64) time.Duration {
	var freed int64
	for b := cur - int64(l.cfg.Buckets); b <= cur; b++ {
		freed += l.bucketNet(tenant, s, k, b)
		if freed >= over {
			// Bucket b leaves the window when bucket b+Buckets+1 begins.
			return time.Duration((b+int64(l.cfg.Buckets)+1)*l.bw - now.UnixNano())
		}
	}
	return l.cfg.Window
}

// bucketNet is tenant's mesh-wide net tokens of kind k in bucket b.
func (l *Ledger) bucketNet(tenant uint64, s *series, k int, b int64) int64 {
	i := b % int64(l.ring)
	var n int64
	if c := &s.cells[i]; c.b == b {
		n += c.kind(k).net()
	}
	for _, p := range l.peers {
		if cells, ok := p.tenants[tenant]; ok && cells[i].b == b {
			n += cells[i].kind(k).net()
		}
	}
	return n
}

func kindName(k int) string {
	if k == 0 {
		return KindInput
	}
	return KindOutput
}
