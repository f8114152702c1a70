package mesh

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/summary"
)

// bareMesh is a router's mesh without memberlist or goroutines: the test
// drives its write sections itself, one at a time.
func bareMesh(t testing.TB, name string) *Mesh {
	t.Helper()
	cfg := Config{Name: name, Region: "r1", APIAddr: "http://" + name + ".test", Contract: summary.DefaultContract(),
		DefaultCapacityBlocks: 4096, Timing: TestTiming(), Logger: hclog.NewNullLogger()}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return compose(&env{cfg: cfg, log: cfg.Logger, fp: cfg.Contract.Fingerprint(), wire: wireLatest, boot: 1,
		t0: time.Now(), ctx: context.Background()})
}

// ownersMismatch compares every replica's owner, and the owner's record,
// with the ownership rule applied afresh; nil when they agree.
func ownersMismatch(m *Mesh) error {
	t := m.tab
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, r := range t.order {
		want := ownerOf(r.id, r.declarers, t.liveLocked)
		if r.owner != want || r.ownerMb != t.routers[want] || r.ownerDirty {
			return fmt.Errorf("%s: owner %q (record %p, dirty %v), the rule says %q (record %p)",
				r.id, r.owner, r.ownerMb, r.ownerDirty, want, t.routers[want])
		}
	}
	return nil
}

// TestSectionsRecomputeWhatChanged drives a router's write sections one
// by one: each recomputes the owners, and republishes view entries, of
// what it changed and of nothing else; and after each, every owner is
// the rule's and the published view the one built afresh.
func TestSectionsRecomputeWhatChanged(t *testing.T) {
	m := bareMesh(t, "a")
	const x, y, z = "http://x:8000", "http://y:8000", "http://z:8000"
	metaA := nodeMeta{Region: "r1", API: "http://a.test"}
	metaB := nodeMeta{Region: "r2", API: "http://b.test"}
	state := func(st stateMsg) func() {
		return func() {
			m.tab.mu.Lock()
			m.rep.handleStateLocked(&st, time.Now())
			m.tab.unlock()
		}
	}
	fromB := func(id string, seq uint64) func() {
		return state(stateMsg{header: header{Origin: "b", Boot: 1, Seq: seq}, Replica: id, Owned: true, Healthy: true,
			Epoch: 1, Models: []string{"m"}})
	}
	// loser is a router that declares y too but that b outranks.
	loser := ""
	for i := 0; loser == ""; i++ {
		if n := fmt.Sprint("c", i); ownerWeight(n, y) < ownerWeight("b", y) {
			loser = n
		}
	}
	metaL := nodeMeta{Region: "r1", API: "http://" + loser + ".test"}
	candidates := func(want ...string) func() error {
		return func() error {
			var got []string
			for _, c := range m.Candidates("m", nil) {
				got = append(got, c.ID())
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("candidates %v, want %v", got, want)
			}
			return nil
		}
	}
	steps := []struct {
		name    string
		do      func()
		owners  int  // owners recomputed
		publish bool // view entries queued
		check   func() error
	}{
		{name: "this router joins", do: func() { m.tab.setRouter("a", true, metaA) }},
		{name: "declare x", do: func() { m.DeclareReplica(x) }, owners: 1, publish: true, check: func() error {
			if _, local, ok := m.Locate(x); !local || !ok {
				return fmt.Errorf("x is not local: %v %v", local, ok)
			}
			return nil
		}},
		{name: "x healthy, serving m", do: func() {
			m.UpdateReplica(x, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 64})
		}, publish: true, check: candidates(x)},
		{name: "an unknown replica's health", do: func() {
			m.UpdateReplica(z, ReplicaStatus{Models: []string{"m"}, Healthy: true})
		}, check: candidates(x)},
		{name: "the first record takes x over", do: func() { m.Record(x, chain(1, 4)) }, publish: true},
		{name: "a record on owned x", do: func() { m.Record(x, chain(2, 4)) }},
		{name: "b joins, declaring nothing", do: func() { m.tab.setRouter("b", true, metaB) }},
		{name: "b joins again, unchanged", do: func() { m.tab.setRouter("b", true, metaB) }},
		{name: "b's state declares y", do: fromB(y, 1), owners: 1, publish: true, check: candidates(x, y)},
		{name: "b's state again", do: fromB(y, 1)},
		{name: "another router joins", do: func() { m.tab.setRouter(loser, true, metaL) }},
		{name: "it declares y, b keeps it", do: state(stateMsg{header: header{Origin: loser, Boot: 1, Seq: 1}, Replica: y}),
			owners: 1, check: candidates(x, y)},
		{name: "it fails, b keeps y", do: func() { m.tab.setRouter(loser, false, metaL) }, owners: 1, check: candidates(x, y)},
		{name: "b's RTT", do: func() { m.tab.setRTT("b", 5*time.Millisecond) }, publish: true, check: func() error {
			if c, ok := candidate(m, "m", y); !ok || c.NetworkMs != 5 || c.Tier != 1 {
				return fmt.Errorf("y: %+v", c)
			}
			return nil
		}},
		{name: "an unknown router's RTT", do: func() { m.tab.setRTT("c", time.Millisecond) }},
		{name: "b fails", do: func() { m.tab.setRouter("b", false, metaB) }, owners: 1, publish: true, check: candidates(x)},
		{name: "b fails again", do: func() { m.tab.setRouter("b", false, metaB) }},
		{name: "b back", do: func() { m.tab.setRouter("b", true, metaB) }, owners: 1, publish: true},
		{name: "b forgotten while alive", do: func() { m.tab.forgetRouter("b") }},
		{name: "b fails and is forgotten", do: func() {
			m.tab.setRouter("b", false, metaB)
			m.tab.forgetRouter("b")
		}, owners: 2, publish: true, check: func() error {
			if _, _, ok := m.Locate(y); ok {
				return fmt.Errorf("y located with no live declarer")
			}
			return nil
		}},
		{name: "x withdrawn", do: func() { m.WithdrawReplica(x) }, owners: 1, publish: true, check: candidates()},
		{name: "x withdrawn again", do: func() { m.WithdrawReplica(x) }, check: candidates()},
	}
	for _, s := range steps {
		before := m.tab.sections
		s.do()
		after := m.tab.sections
		if got := after.owners - before.owners; got != s.owners {
			t.Errorf("%s: %d owners recomputed, want %d", s.name, got, s.owners)
		}
		if got := after.publishes > before.publishes; got != s.publish {
			t.Errorf("%s: view republished %v, want %v", s.name, got, s.publish)
		}
		if err := ownersMismatch(m); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := viewMismatch(m); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.check != nil {
			if err := s.check(); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
	}
}
