package mesh

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const wait = 15 * time.Second

func declare(r *testRouter, id string) {
	r.DeclareReplica(id)
	r.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048})
}

func TestThreeRoutersGossipSummaries(t *testing.T) {
	a := newRouter(t, "a", nil)
	declare(a, "http://a-replica:8000")
	b := newRouter(t, "b", joining(a))
	c := newRouter(t, "c", func(cfg *Config) { joining(b)(cfg); cfg.Region = "r2" })
	for _, r := range []*testRouter{a, b, c} {
		eventually(t, wait, "three members at "+r.cfg.Name, func() error {
			if n := members(r.Mesh); n != 3 {
				return fmt.Errorf("%d members", n)
			}
			return nil
		})
	}
	id := "http://a-replica:8000"
	eventually(t, wait, "b sees a's replica with a counting copy", func() error { return matches(b.Mesh, id, nil) })
	if api, local, ok := b.Locate(id); !ok || local || api != "http://a.test" {
		t.Fatalf("b.Locate = %q %v %v, want a's API, remote", api, local, ok)
	}
	if api, local, ok := a.Locate(id); !ok || !local || api != "http://a.test" {
		t.Fatalf("a.Locate = %q %v %v, want local", api, local, ok)
	}
	eventually(t, wait, "b measures its RTT to a", func() error {
		if c, _ := candidate(b.Mesh, "m", id); c.NetworkMs <= 0 || c.Tier != 0 {
			return fmt.Errorf("network %vms tier %d", c.NetworkMs, c.Tier)
		}
		return nil
	})
	eventually(t, wait, "c (another region) sees a's replica in tier 1", func() error {
		if c, ok := candidate(c.Mesh, "m", id); !ok || c.Tier != 1 {
			return fmt.Errorf("ok=%v tier %d", ok, c.Tier)
		}
		return nil
	})
	if got := b.Models(); len(got) != 1 || got[0] != "m" {
		t.Fatalf("b.Models = %v", got)
	}

	// 400 blocks take three delta messages (about 160 hashes each).
	hashes := chain(1, 400)
	start := time.Now()
	a.Record(id, hashes)
	eventually(t, wait, "b matches a's recorded prefix", func() error { return matches(b.Mesh, id, hashes) })
	tb := time.Since(start)
	eventually(t, wait, "c matches a's recorded prefix", func() error { return matches(c.Mesh, id, hashes) })
	t.Logf("time to visibility of 400 recorded blocks: b (direct) %v, c %v (StateInterval %v, GossipInterval %v)",
		tb, time.Since(start), a.cfg.Timing.StateInterval, a.cfg.Timing.GossipInterval)

	// Record at a non-owner is a no-op.
	other := chain(2, 10)
	b.Record(id, other)
	if got := a.sumOf(id).Match(summary.MakeProbes(nil, other)); got != 0 {
		t.Fatalf("non-owner Record reached the owner: match %d", got)
	}

	// Load accounting at the owner reaches the copies.
	firstByte, done := a.Begin(id, 12)
	eventually(t, wait, "b sees a's load", func() error {
		c, _ := candidate(b.Mesh, "m", id)
		if c.InFlight != 1 || c.PendingPrefillBlocks != 12 {
			return fmt.Errorf("in-flight %d pending %v", c.InFlight, c.PendingPrefillBlocks)
		}
		return nil
	})
	firstByte()
	done()
	done()
	if c, _ := candidate(a.Mesh, "m", id); c.InFlight != 0 || c.PendingPrefillBlocks != 0 {
		t.Fatalf("after done: %+v", c)
	}
	if _, ok := candidate(b.Mesh, "other-model", id); ok {
		t.Fatal("replica is a candidate for a model it does not serve")
	}
}

func (m *Mesh) sumOf(id string) *summary.Summary {
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	return m.tab.replicas[id].sum
}

func TestSharedReplicaOwnershipAndTakeover(t *testing.T) {
	id := "http://shared:8000"
	owner, other := sharedPair(t, id)
	if api, _, _ := other.Locate(id); api != owner.cfg.APIAddr {
		t.Fatalf("non-owner forwards to %q", api)
	}
	hashes := chain(3, 300)
	owner.Record(id, hashes)
	other.Record(id, chain(4, 5)) // no-op: not the owner
	eventually(t, wait, "non-owner's copy matches", func() error { return matches(other.Mesh, id, hashes) })

	if err := owner.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	eventually(t, wait, "the other router takes over", func() error {
		if _, local, ok := other.Locate(id); !ok || !local {
			return fmt.Errorf("local=%v ok=%v", local, ok)
		}
		return matches(other.Mesh, id, hashes)
	})
	if got := other.sumOf(id).Match(summary.MakeProbes(nil, chain(4, 5))); got != 0 {
		t.Fatalf("the no-op Record reached the summary: %d", got)
	}
	// The new owner is the writer now and continues the epoch.
	other.Record(id, chain(5, 20))
	for _, h := range [][]uint64{hashes, chain(5, 20)} {
		if err := matches(other.Mesh, id, h); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWrongKeyCannotJoin(t *testing.T) {
	key1 := []byte("0123456789abcdef0123456789abcdef")
	key2 := []byte("fedcba9876543210fedcba9876543210")
	a := newRouter(t, "a", func(c *Config) { c.SecretKey = key1 })
	tests := []struct {
		name string
		key  []byte
		ok   bool
	}{
		{"other-key", key2, false},
		{"no-key", nil, false},
		{"same-key", key1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t, tc.name, func(c *Config) { c.SecretKey = tc.key })
			n, err := r.ml.Join([]string{a.GossipAddr()})
			if got := err == nil && n == 1; got != tc.ok {
				t.Fatalf("join: n=%d err=%v, want ok=%v", n, err, tc.ok)
			}
		})
	}
}

func TestOtherContractRefused(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", func(c *Config) { c.Contract.BlockBytes = 512 })
	if n, err := b.ml.Join([]string{a.GossipAddr()}); err == nil {
		t.Fatalf("join with another contract succeeded (n=%d)", n)
	}
	idA, idB := a.mem.contractID, b.mem.contractID
	eventually(t, wait, "refusal logged and counted", func() error {
		if testutil.ToFloat64(a.met.refusals) == 0 && testutil.ToFloat64(b.met.refusals) == 0 {
			return fmt.Errorf("no refusal counted")
		}
		if !hasLine(a.logs, idA, idB) && !hasLine(b.logs, idA, idB) {
			return fmt.Errorf("no log line names both contracts")
		}
		return nil
	})
	if members(a.Mesh) != 1 || members(b.Mesh) != 1 {
		t.Fatalf("members a=%d b=%d, want 1 each", members(a.Mesh), members(b.Mesh))
	}
}

func TestPartitionGoesStaleThenRepairs(t *testing.T) {
	p := &partitioner{}
	var rs []*testRouter
	for i := range 4 {
		tr, _ := p.transport(t, i/2)
		var join func(*Config)
		if i > 0 {
			join = joining(rs[0])
		}
		rs = append(rs, newRouter(t, fmt.Sprintf("p%d", i), func(c *Config) {
			c.Transport = tr
			if join != nil {
				join(c)
			}
		}))
	}
	r0, r2 := "http://rep0", "http://rep2"
	declare(rs[0], r0)
	declare(rs[2], r2)
	h0 := chain(10, 100)
	rs[0].Record(r0, h0)
	rs[2].Record(r2, chain(11, 100))
	eventually(t, wait, "copies count across the mesh", func() error {
		if err := matches(rs[3].Mesh, r0, h0); err != nil {
			return err
		}
		return matches(rs[1].Mesh, r2, chain(11, 100))
	})

	p.set(true)
	notCounting := func(m *Mesh, id string) error {
		if c, ok := candidate(m, "m", id); ok && c.Summary != nil {
			return fmt.Errorf("%s: copy of %s still counts", m.cfg.Name, id)
		}
		return nil
	}
	eventually(t, wait, "copies stop counting on both sides", func() error {
		if err := notCounting(rs[3].Mesh, r0); err != nil {
			return err
		}
		return notCounting(rs[1].Mesh, r2)
	})
	// Blocks recorded during the partition never reach the other side as
	// deltas: after the heal the copy must be repaired by a full copy.
	h0more := append(append([]uint64(nil), h0...), chain(12, 50)...)
	rs[0].Record(r0, chain(12, 50))
	rs[0].Record(r0, chain(13, 50)) // a second, unrelated prefix

	p.set(false)
	eventually(t, 2*wait, "copies count again and are repaired after the heal", func() error {
		if err := matches(rs[3].Mesh, r0, h0more); err != nil {
			return err
		}
		if err := matches(rs[2].Mesh, r0, chain(13, 50)); err != nil {
			return err
		}
		return matches(rs[1].Mesh, r2, chain(11, 100))
	})
}

func TestLateJoinerWarmAfterPushPull(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	hashes := chain(20, 1500) // within capacity 2048: nothing aged out
	a.Record(id, hashes)
	b := newRouter(t, "b", nil) // joins by hand below, so the first push/pull is the join
	if n, err := b.ml.Join([]string{a.GossipAddr()}); err != nil || n != 1 {
		t.Fatalf("join: %d %v", n, err)
	}
	// The join's push/pull is synchronous: b's copy is warm when Join returns.
	if err := matches(b.Mesh, id, hashes); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(b.met.resyncs); got != 0 {
		t.Fatalf("late joiner needed %v full resyncs", got)
	}
}

func TestMetricsLint(t *testing.T) {
	a := newRouter(t, "a", nil)
	declare(a, "http://x")
	a.met.age.WithLabelValues("http://x").Set(1)
	a.met.messages.WithLabelValues("state", "out").Inc()
	problems, err := testutil.GatherAndLint(a.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"kvmesh_mesh_members", "kvmesh_gossip_bytes_total", "kvmesh_gossip_messages_total",
		"kvmesh_gossip_dropped_total", "kvmesh_summary_resyncs_total", "kvmesh_summary_age_seconds",
		"kvmesh_mesh_contract_refusals_total", "kvmesh_gossip_queue_depth"} {
		if n, err := testutil.GatherAndCount(a.reg, name); err != nil || n == 0 {
			t.Errorf("metric %s: n=%d err=%v", name, n, err)
		}
	}
}

func TestLargeRecordTravelsAsDeltas(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://rep-with-a-long-name/" + strings.Repeat("x", 400)
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	eventually(t, wait, "b sees a's replica", func() error { return matches(b.Mesh, id, nil) })
	// Rounds of 1000: under the summary's log of 1024 entries and its
	// memory of 1536 blocks (capacity 2048).
	for i := range 5 {
		h := chain(uint64(30+i), 1000)
		a.Record(id, h)
		eventually(t, wait, "b matches a's large record", func() error { return matches(b.Mesh, id, h) })
	}
	for _, why := range []string{fullOverflow, fullSendError, fullLog, fullCheaper} {
		if got := testutil.ToFloat64(a.met.fullCopies.WithLabelValues(why)); got != 0 {
			t.Errorf("full copies (%s) = %v, want 0", why, got)
		}
	}
}

// BenchmarkTimeToVisibility measures how long a prefix recorded at one
// router takes to be matched at another (ns/op is that time).
func BenchmarkTimeToVisibility(b *testing.B) {
	for _, tc := range []struct {
		name   string
		timing Timing
	}{{"test-timing", TestTiming()}, {"lan-timing", LANTiming()}} {
		b.Run(tc.name, func(b *testing.B) {
			timing := func(c *Config) { c.Timing = tc.timing }
			a := newRouter(b, "a", timing)
			id := "http://a-rep"
			declare(a, id)
			r := newRouter(b, "b", func(c *Config) { timing(c); joining(a)(c) })
			eventually(b, wait, "b sees a's replica", func() error { return matches(r.Mesh, id, nil) })
			var took []float64
			for i := 0; b.Loop(); i++ {
				h := chain(uint64(1000+i), 8)
				start := time.Now()
				a.Record(id, h)
				for matches(r.Mesh, id, h) != nil {
					if time.Since(start) > wait {
						b.Fatalf("record %d not visible within %v", i, wait)
					}
					time.Sleep(time.Millisecond)
				}
				took = append(took, float64(time.Since(start))/float64(time.Millisecond))
			}
			slices.Sort(took)
			b.ReportMetric(took[len(took)/2], "p50-ms")
			b.ReportMetric(took[len(took)*99/100], "p99-ms")
		})
	}
}

// sharedPair starts routers a and b, both declaring replica id, and
// returns them once both agree which one owns it.
func sharedPair(t *testing.T, id string) (owner, other *testRouter) {
	t.Helper()
	a := newRouter(t, "a", nil)
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	declare(b, id)
	eventually(t, wait, "both agree on one owner", func() error {
		_, la, oka := a.Locate(id)
		_, lb, okb := b.Locate(id)
		if !oka || !okb || la == lb {
			return fmt.Errorf("a local=%v ok=%v, b local=%v ok=%v", la, oka, lb, okb)
		}
		owner, other = a, b
		if lb {
			owner, other = b, a
		}
		return nil
	})
	return owner, other
}

// TestBeginTakesNoMeshLock: Begin books a request at a declared replica
// while a write section holds the mesh's lock (the proxy calls it under
// its placement lock, which must not wait for gossip), and books nothing
// at a replica not declared here or withdrawn.
func TestBeginTakesNoMeshLock(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	load := func(id string) int64 {
		a.tab.mu.RLock()
		defer a.tab.mu.RUnlock()
		return a.tab.replicas[id].load.inFlight.Load()
	}
	a.tab.mu.Lock()
	booked := make(chan func(), 1)
	go func() {
		_, done := a.Begin(id, 1)
		booked <- done
	}()
	var done func()
	select {
	case done = <-booked:
	case <-time.After(wait):
		a.tab.mu.Unlock()
		t.Fatal("Begin waited for the mesh's lock")
	}
	a.tab.mu.Unlock()
	if got := load(id); got != 1 {
		t.Fatalf("in flight %d after Begin, want 1", got)
	}
	done()
	a.WithdrawReplica(id)
	_, done = a.Begin(id, 1)
	if got := load(id); got != 0 {
		t.Fatalf("in flight %d after Begin at a withdrawn replica, want 0", got)
	}
	done()
	_, done = a.Begin("http://unknown", 1)
	done()
}

// TestModelParents: the LoRA adapters' base models, of an owned replica
// and, through gossip, of a peer's.
func TestModelParents(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	id := "http://a-lora:8000"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"base", "chat", "sql"}, Healthy: true, CapacityBlocks: 2048,
		LoRA: route.MakeLoRAs(2, []string{"base"}, []string{"sql"}, nil, nil)})
	plain := "http://a-plain:8000"
	declare(a, plain) // model "m", no LoRA
	want := map[string]string{"chat": "base", "sql": "base"}
	if got := a.ModelParents(); !maps.Equal(got, want) {
		t.Fatalf("a: %v, want %v", got, want)
	}
	eventually(t, wait, "b learns the adapters' parents", func() error {
		if got := b.ModelParents(); !maps.Equal(got, want) {
			return fmt.Errorf("%v", got)
		}
		return nil
	})
}
