package quota

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// clock is a test's shared wall clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1_700_000_000, 0)} }
func ledger(t *testing.T, c *clock, cfg Config) *Ledger {
	t.Helper()
	cfg.Now = c.now
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestReserveUpToTheBudget: one router admits a tenant's requests while
// they fit, refuses the next with the time until the oldest bucket
// leaves the window, and admits again then; other tenants are apart.
func TestReserveUpToTheBudget(t *testing.T) {
	c := newClock()
	reg := prometheus.NewRegistry()
	l := ledger(t, c, Config{Default: Limit{Input: 1000}, Registerer: reg})
	t0 := c.now() // a bucket's start
	admitted := 0
	for range 20 {
		if tk, d := l.Reserve(1, 100, 0); d.OK {
			admitted++
			if !tk.Held() {
				t.Fatal("admitted without a ticket")
			}
		} else {
			if d.Kind != KindInput || d.Limit != 1000 || d.Used != 1000 {
				t.Fatalf("decision %+v", d)
			}
			// The window is 12 buckets of 5 s, plus the current one: the
			// first bucket leaves it 65 s after it began.
			if want := 65*time.Second - c.now().Sub(t0); d.RetryAfter != want {
				t.Fatalf("retry after %v, want %v", d.RetryAfter, want)
			}
		}
		c.add(100 * time.Millisecond)
	}
	if admitted != 10 {
		t.Fatalf("admitted %d requests of 100 tokens under a budget of 1000", admitted)
	}
	if _, d := l.Reserve(2, 100, 0); !d.OK {
		t.Fatal("another tenant was refused")
	}
	if got := testutil.ToFloat64(l.m.rejections.WithLabelValues(otherTenants, KindInput)); got != 10 {
		t.Fatalf("%v rejections counted", got)
	}
	c.add(65*time.Second - 2*time.Second)
	if _, d := l.Reserve(1, 100, 0); !d.OK {
		t.Fatalf("refused once the first bucket left the window: %+v", d)
	}
}

// TestSettleCorrects: a reservation larger than the use is given back,
// a use beyond it charged, in the bucket the request was charged to.
func TestSettleCorrects(t *testing.T) {
	c := newClock()
	l := ledger(t, c, Config{Default: Limit{Input: 1000, Output: 1000}})
	tk, d := l.Reserve(1, 500, 900)
	if !d.OK {
		t.Fatal(d)
	}
	if _, d := l.Reserve(1, 100, 200); d.OK || d.Kind != KindOutput {
		t.Fatalf("the output reservation did not hold: %+v", d)
	}
	c.add(10 * time.Second)
	l.Settle(tk, 600, 100)
	st := l.Status(10)
	if u := st.Tenants[0]; u.Input != 600 || u.Output != 100 {
		t.Fatalf("after settling: %+v", u)
	}
	if _, d := l.Reserve(1, 100, 200); !d.OK {
		t.Fatalf("the given back output was not free: %+v", d)
	}
	// Without max_tokens, the reservation is the tenant's mean output.
	if got := l.own[1].meanOut; got <= 0 {
		t.Fatalf("mean output %v", got)
	}
}

// TestUnlimitedTenantNotCounted: a tenant without a budget holds
// nothing.
func TestUnlimitedTenantNotCounted(t *testing.T) {
	c := newClock()
	l := ledger(t, c, Config{Tenants: map[uint64]Tenant{7: {Name: "seven", Limit: Limit{Output: 10}}}})
	if tk, d := l.Reserve(1, 1e9, 1e9); !d.OK || tk.Held() || len(l.own) != 0 {
		t.Fatal("an unlimited tenant was counted")
	}
	if _, d := l.Reserve(7, 1e9, 10); !d.OK {
		t.Fatal("input is unlimited for seven")
	}
	if _, d := l.Reserve(7, 0, 1); d.OK {
		t.Fatal("seven's output budget did not hold")
	}
}

// mesh is n ledgers that gossip to each other every interval, except
// across a partition.
type mesh struct {
	c    *clock
	ls   []*Ledger
	side []int // partition side of each ledger
	log  []admission
	sum  int64 // tenant 1's tokens in log
}

type admission struct {
	t time.Time
	n int64
}

func newMesh(t *testing.T, n int, cfg Config) *mesh {
	m := &mesh{c: newClock(), side: make([]int, n)}
	for range n {
		m.ls = append(m.ls, ledger(t, m.c, cfg))
	}
	return m
}

func (m *mesh) gossip(t *testing.T) {
	for i, l := range m.ls {
		b := l.AppendGossip(nil, m.c.now())
		for j, o := range m.ls {
			if i != j && m.side[i] == m.side[j] {
				if err := o.MergeGossip(string(rune('a'+i)), 1, b, m.c.now()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// run sends, every 100 ms for d, one request of size tokens of tenant 1
// to each router in turn at rate per second, and light ones of tenant 2,
// gossiping every second; it returns the most tenant 1 had admitted in
// any window and tenant 2's refusals.
func (m *mesh) run(t *testing.T, d time.Duration, rate float64, size int64, window time.Duration) (peak int64, refused2 int) {
	next, acc := 0, 0.0
	steps := int(d / (100 * time.Millisecond))
	for s := range steps {
		acc += rate / 10
		for ; acc >= 1; acc-- {
			if _, dec := m.ls[next%len(m.ls)].Reserve(1, size, 0); dec.OK {
				m.log = append(m.log, admission{m.c.now(), size})
				m.sum += size
			}
			next++
		}
		if s%10 == 0 {
			if _, dec := m.ls[s/10%len(m.ls)].Reserve(2, size, 0); !dec.OK {
				refused2++
			}
		}
		for len(m.log) > 0 && m.c.now().Sub(m.log[0].t) >= window {
			m.sum -= m.log[0].n
			m.log = m.log[1:]
		}
		peak = max(peak, m.sum)
		m.c.add(100 * time.Millisecond)
		if s%10 == 9 {
			m.gossip(t)
		}
	}
	return peak, refused2
}

// TestMeshHoldsTheBudget: three routers, a tenant sending three times its
// budget spread over all of them: what the mesh admits in any window
// stays within 1.1 budgets; a tenant within its budget is never refused.
func TestMeshHoldsTheBudget(t *testing.T) {
	const budget = 60000
	m := newMesh(t, 3, Config{Default: Limit{Input: budget}})
	// 3 budgets a minute in requests of 500 tokens: 6 a second.
	peak, refused := m.run(t, 5*time.Minute, 3*budget/60.0/500, 500, time.Minute)
	t.Logf("peak %d tokens in a window, budget %d", peak, budget)
	if peak > budget*11/10 {
		t.Fatalf("admitted %d tokens in a window, budget %d", peak, budget)
	}
	if peak < budget*8/10 {
		t.Fatalf("admitted only %d tokens in a window of a budget of %d", peak, budget)
	}
	if refused > 0 {
		t.Fatalf("the tenant within its budget was refused %d times", refused)
	}
}

// TestPartitionBound: a 30 s partition into two sides, each admitting on
// what it last heard of the other, started at every 10 s of the
// admissions' cycle: the window never holds more than two budgets
// (doc.go, Bounds); with StaleShare, about one.
func TestPartitionBound(t *testing.T) {
	const budget = 60000
	rate := 3 * budget / 60.0 / 500
	for _, stale := range []bool{false, true} {
		var worst int64
		for off := time.Duration(0); off < time.Minute; off += 10 * time.Second {
			m := newMesh(t, 3, Config{Default: Limit{Input: budget}, StaleShare: stale})
			m.run(t, 2*time.Minute+off, rate, 500, time.Minute)
			m.side = []int{0, 1, 1}
			p2, _ := m.run(t, 30*time.Second, rate, 500, time.Minute)
			m.side = []int{0, 0, 0}
			p3, _ := m.run(t, 90*time.Second, rate, 500, time.Minute)
			worst = max(worst, p2, p3)
		}
		t.Logf("stale share %v: at most %d tokens in a window over or after the partition; budget %d", stale, worst, budget)
		limit := int64(2 * budget * 11 / 10)
		if stale {
			limit = budget * 11 / 10
		}
		if worst > limit {
			t.Fatalf("stale share %v: %d tokens in a window, bound %d", stale, worst, limit)
		}
	}
}

// TestMergeCommutes: merging one router's usage twice, or an older
// message after a newer, changes nothing.
func TestMergeCommutes(t *testing.T) {
	c := newClock()
	a := ledger(t, c, Config{Default: Limit{Input: 1e6}})
	tk, _ := a.Reserve(1, 300, 0)
	old := a.AppendGossip(nil, c.now())
	a.Settle(tk, 100, 0)
	a.Reserve(1, 50, 0)
	a.Reserve(2, 70, 0)
	newer := a.AppendGossip(nil, c.now())
	want := usageSeen(t, c, newer)
	for _, order := range [][][]byte{{newer, newer}, {old, newer}, {newer, old}, {newer, old, newer}} {
		if got := usageSeen(t, c, order...); got != want {
			t.Fatalf("usage %v after merging in another order, want %v", got, want)
		}
	}
	if want != [2]int64{150, 70} {
		t.Fatalf("usage %v, want 150 and 70", want)
	}
}

func usageSeen(t *testing.T, c *clock, msgs ...[]byte) [2]int64 {
	b := ledger(t, c, Config{Default: Limit{Input: 1e6}})
	for _, m := range msgs {
		if err := b.MergeGossip("a", 1, m, c.now()); err != nil {
			t.Fatal(err)
		}
	}
	cur := b.bucket(c.now())
	var out [2]int64
	for _, p := range b.peers {
		out[0] = b.sumCells(p.tenants[1], 0, cur)
		out[1] = b.sumCells(p.tenants[2], 0, cur)
	}
	return out
}

// TestWireTenantsBounded: a gossip lists the heaviest tenants and sums
// the rest; the receiver holds only those.
func TestWireTenantsBounded(t *testing.T) {
	c := newClock()
	a := ledger(t, c, Config{Default: Limit{Input: 1e6}, WireTenants: 2})
	for i := uint64(1); i <= 10; i++ {
		a.Reserve(i, int64(i*10), 0)
	}
	b := ledger(t, c, Config{Default: Limit{Input: 1e6}})
	if err := b.MergeGossip("a", 1, a.AppendGossip(nil, c.now()), c.now()); err != nil {
		t.Fatal(err)
	}
	p := b.peers[peerID{"a", 1}]
	if len(p.tenants) != 2 || p.tenants[10] == nil || p.tenants[9] == nil {
		t.Fatalf("tenants on the wire: %v", p.tenants)
	}
	if got := b.sumCells(p.rest, 0, b.bucket(c.now())); got != 360 {
		t.Fatalf("rest %d, want 360", got)
	}
}

// TestMaxTenantsOverflow: beyond MaxTenants new tenants share one entry
// under the default budget.
func TestMaxTenantsOverflow(t *testing.T) {
	c := newClock()
	l := ledger(t, c, Config{Default: Limit{Input: 100}, MaxTenants: 2})
	l.Reserve(1, 10, 0)
	l.Reserve(2, 10, 0)
	if _, d := l.Reserve(3, 60, 0); !d.OK {
		t.Fatal(d)
	}
	if _, d := l.Reserve(4, 60, 0); d.OK {
		t.Fatal("the overflow tenants did not share a budget")
	}
	if len(l.own) != 2 {
		t.Fatalf("%d tenants held", len(l.own))
	}
	c.add(2 * time.Minute) // every count leaves the ring: swept
	if _, d := l.Reserve(4, 60, 0); !d.OK || l.own[4] == nil {
		t.Fatal("tenant 4 did not get its own entry once the old ones left")
	}
}

// TestMergeRefuses: another window, a far clock, garbage.
func TestMergeRefuses(t *testing.T) {
	c := newClock()
	a := ledger(t, c, Config{Default: Limit{Input: 1e6}, Window: 30 * time.Second})
	b := ledger(t, c, Config{Default: Limit{Input: 1e6}})
	if err := b.MergeGossip("a", 1, a.AppendGossip(nil, c.now()), c.now()); err == nil || !strings.Contains(err.Error(), "buckets") {
		t.Fatalf("another window: %v", err)
	}
	b2 := ledger(t, c, Config{Default: Limit{Input: 1e6}})
	msg := b2.AppendGossip(nil, c.now().Add(-time.Hour))
	if err := b.MergeGossip("c", 1, msg, c.now()); err == nil {
		t.Fatal("a clock an hour off was merged")
	}
	for _, bad := range []string{"", "\x02", "\x01\x88", "\x01\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"} {
		if err := b.MergeGossip("d", 1, []byte(bad), c.now()); err == nil {
			t.Fatalf("%q merged", bad)
		}
	}
}

// TestParseFile reads defaults and overrides, and refuses what is not a
// budget.
func TestParseFile(t *testing.T) {
	def, ts, err := ParseFile(strings.NewReader("# budgets\n* 100 50\nteam-a 1000 - # comment\n\nkey-b 0 7\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *def != (Limit{100, 50}) || len(ts) != 2 || ts["team-a"] != (Limit{Input: 1000}) || ts["key-b"] != (Limit{Output: 7}) {
		t.Fatalf("%v %v", def, ts)
	}
	for _, bad := range []string{"a 1", "a 1 2 3", "a -1 2", "a x 2", "a 1 2\na 3 4", "* 1 1\n* 2 2", "a 1 99999999999999999999"} {
		if _, _, err := ParseFile(strings.NewReader(bad)); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// TestConfigRefused: windows and counts that cannot be kept.
func TestConfigRefused(t *testing.T) {
	for _, cfg := range []Config{{Window: time.Millisecond}, {Buckets: 300}, {WireTenants: 5000}, {Default: Limit{Input: -1}}} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("%+v accepted", cfg)
		}
	}
	if (Config{}).Enabled() || !(Config{Tenants: map[uint64]Tenant{1: {Limit: Limit{Input: 1}}}}).Enabled() {
		t.Fatal("Enabled")
	}
}

// TestSetBudgets: new budgets hold the requests admitted after them,
// against the usage counted before; a refused set changes nothing.
func TestSetBudgets(t *testing.T) {
	c := newClock()
	reg := prometheus.NewRegistry()
	l := ledger(t, c, Config{Default: Limit{Input: 1000}, Registerer: reg})
	if _, d := l.Reserve(1, 600, 0); !d.OK {
		t.Fatal(d)
	}
	if err := l.SetBudgets(Limit{Input: 500}, map[uint64]Tenant{2: {Name: "big", Limit: Limit{Input: 5000}}}); err != nil {
		t.Fatal(err)
	}
	if _, d := l.Reserve(1, 100, 0); d.OK || d.Limit != 500 || d.Used != 600 {
		t.Fatalf("the lowered default: %+v", d)
	}
	if _, d := l.Reserve(2, 4000, 0); !d.OK {
		t.Fatalf("the new override: %+v", d)
	}
	if got := testutil.ToFloat64(l.m.tokens.WithLabelValues("big", KindOutput)); got != 0 {
		t.Fatalf("the new tenant's series: %v", got)
	}
	if n := testutil.CollectAndCount(reg, "kvmesh_tenant_tokens_total"); n != 4 {
		t.Fatalf("%d token series, want other and big, input and output", n)
	}
	for _, bad := range []struct {
		def     Limit
		tenants map[uint64]Tenant
	}{{Limit{Input: -1}, nil}, {Limit{}, map[uint64]Tenant{3: {Name: "neg", Limit: Limit{Output: -5}}}}} {
		if err := l.SetBudgets(bad.def, bad.tenants); err == nil {
			t.Fatalf("%+v taken", bad)
		}
	}
	if st := l.Status(10); st.Default.Input != 500 {
		t.Fatalf("a refused set changed the default: %+v", st.Default)
	}
	if _, d := l.Reserve(2, 900, 0); !d.OK {
		t.Fatalf("a refused set changed the override: %+v", d)
	}
}
