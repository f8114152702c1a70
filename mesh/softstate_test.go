package mesh

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/summary"
)

func TestDeclarationHolds(t *testing.T) {
	now := time.Unix(1000, 0)
	ttl := 3 * time.Second
	tests := []struct {
		name         string
		router       string
		selfDeclares bool
		heard        time.Time
		want         bool
	}{
		{"own, declared", "me", true, time.Time{}, true},
		{"own, not declared, though a peer lists it", "me", false, now, false},
		{"peer, just asserted", "p", false, now, true},
		{"peer, asserted ttl ago", "p", false, now.Add(-ttl), true},
		{"peer, silent longer than ttl", "p", false, now.Add(-ttl - time.Millisecond), false},
		{"peer, never asserted itself", "p", true, time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := declarationHolds(tc.router, "me", tc.selfDeclares, tc.heard, now, ttl); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMissingSeeds(t *testing.T) {
	dns := map[string][]string{"routers.svc": {"10.0.0.1", "10.0.0.2"}, "one.svc": {"10.0.0.3"}}
	resolve := func(h string) ([]string, error) {
		if ips, ok := dns[h]; ok {
			return ips, nil
		}
		return nil, errors.New("no such host")
	}
	alive := func(addrs ...string) map[string]bool {
		m := map[string]bool{}
		for _, a := range addrs {
			m[a] = true
		}
		return m
	}
	tests := []struct {
		name  string
		seeds []string
		alive map[string]bool
		want  []string
	}{
		{"all present", []string{"10.0.0.1:7946", "routers.svc:7946"}, alive("10.0.0.1:7946", "10.0.0.2:7946"), nil},
		{"an IP seed missing", []string{"10.0.0.1:7946", "10.0.0.9:7946"}, alive("10.0.0.1:7946"), []string{"10.0.0.9:7946"}},
		{"a DNS seed with one of its routers missing", []string{"routers.svc:7946"}, alive("10.0.0.1:7946"), []string{"routers.svc:7946"}},
		{"a DNS seed that does not resolve now", []string{"gone.svc:7946"}, alive(), []string{"gone.svc:7946"}},
		{"no port: the default", []string{"one.svc"}, alive("10.0.0.3:7946"), nil},
		{"same IP, another port", []string{"10.0.0.1:7000"}, alive("10.0.0.1:7946"), []string{"10.0.0.1:7000"}},
		{"no seeds", nil, alive(), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := missingSeeds(tc.seeds, 7946, resolve, tc.alive); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// debugOf returns router m's debug line of replica id.
func debugOf(m *Mesh, id string) (ReplicaDebug, bool) {
	for _, r := range m.Debug().Replicas {
		if r.ID == id {
			return r, true
		}
	}
	return ReplicaDebug{}, false
}

func TestRestartedWithoutReplicaStopsClaimingIt(t *testing.T) {
	id := "http://shared:8000"
	a := newRouter(t, "a", nil)
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	declare(b, id)
	eventually(t, wait, "both know both declarations", func() error {
		for _, m := range []*Mesh{a.Mesh, b.Mesh} {
			if d, _ := debugOf(m, id); strings.Join(d.DeclaredBy, ",") != "a,b" {
				return fmt.Errorf("%s: declared by %v", m.cfg.Name, d.DeclaredBy)
			}
		}
		return nil
	})
	if err := a.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	// a comes back without the replica; b's states still list a.
	a2 := newRouter(t, "a", joining(b))
	eventually(t, wait, "only b declares and owns the replica, everywhere", func() error {
		for _, m := range []*Mesh{a2.Mesh, b.Mesh} {
			d, ok := debugOf(m, id)
			if !ok || strings.Join(d.DeclaredBy, ",") != "b" || d.Owner != "b" {
				return fmt.Errorf("%s: %+v", m.cfg.Name, d)
			}
		}
		if _, local, ok := a2.Locate(id); !ok || local {
			return fmt.Errorf("a2 Locate local=%v ok=%v", local, ok)
		}
		return nil
	})
}

func TestSoleDeclarerGoneLeavesCandidates(t *testing.T) {
	id := "http://only-a:8000"
	a := newRouter(t, "a", nil)
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	eventually(t, wait, "b routes to a's replica", func() error {
		if _, ok := candidate(b.Mesh, "m", id); !ok {
			return errors.New("not a candidate")
		}
		return nil
	})
	if err := a.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	eventually(t, wait, "no candidate, no owner, not listed healthy, no declarer once the TTL passed", func() error {
		if _, ok := candidate(b.Mesh, "m", id); ok {
			return errors.New("still a candidate")
		}
		if d, ok := debugOf(b.Mesh, id); ok && (d.Owner != "" || d.Healthy || len(d.DeclaredBy) > 0) {
			return fmt.Errorf("%+v", d)
		}
		return nil
	})
}

func TestPartitionLongerThanFailedPeerTimeoutHeals(t *testing.T) {
	p := &partitioner{}
	var rs []*testRouter
	for i := range 4 {
		tr, _ := p.transport(t, i/2)
		var join func(*Config)
		if i > 0 {
			join = joining(rs[0]) // the only seed is on one side
		}
		rs = append(rs, newRouter(t, fmt.Sprintf("p%d", i), func(c *Config) {
			c.Transport = tr
			c.Timing.FailedPeerTimeout = 300 * time.Millisecond
			if join != nil {
				join(c)
			}
		}))
	}
	all := func(n int) func() error {
		return func() error {
			for _, r := range rs {
				if got := members(r.Mesh); got != n {
					return fmt.Errorf("%s sees %d alive", r.cfg.Name, got)
				}
			}
			return nil
		}
	}
	eventually(t, wait, "mesh of 4", all(4))
	p.set(true)
	eventually(t, wait, "two sides of 2", all(2))
	// Past the failed-peer timeout and memberlist's own gossip to the dead
	// (30 probe intervals): only the seeds can heal it now.
	eventually(t, wait, "failed peers forgotten", func() error {
		for _, r := range rs {
			if n := len(r.Members()); n != 2 {
				return fmt.Errorf("%s remembers %d routers", r.cfg.Name, n)
			}
		}
		return nil
	})
	time.Sleep(30 * TestTiming().ProbeInterval)
	p.set(false)
	eventually(t, wait, "healed into one mesh of 4", all(4))
}

func TestRestartedOwnerTakesItsSummaryBack(t *testing.T) {
	id := "http://shared:8000"
	owner, other := sharedPair(t, id)
	hashes := chain(7, 400)
	owner.Record(id, hashes)
	eventually(t, wait, "the other's copy matches", func() error { return matches(other.Mesh, id, hashes) })
	name := owner.cfg.Name
	if err := owner.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	eventually(t, wait, "the other takes over", func() error {
		if _, local, ok := other.Locate(id); !ok || !local {
			return fmt.Errorf("local=%v ok=%v", local, ok)
		}
		return nil
	})
	back := newRouter(t, name, joining(other))
	declare(back, id)
	eventually(t, wait, "the restarted owner owns the replica again, warm", func() error {
		if _, local, ok := back.Locate(id); !ok || !local {
			return fmt.Errorf("local=%v ok=%v", local, ok)
		}
		if err := matches(back.Mesh, id, hashes); err != nil {
			return err
		}
		return matches(other.Mesh, id, hashes)
	})
}

// TestRestartedOwnerTakesBackFromTheInterimOwner: the router that owned
// the replica while its owner was down (continuing its epoch, recording
// more) hands its summary back when the owner restarts, though it still
// counts itself the owner when the restarted one's first state comes; the
// restarted owner keeps what it recorded before that.
func TestRestartedOwnerTakesBackFromTheInterimOwner(t *testing.T) {
	id := "http://shared-interim:8000"
	owner, other := sharedPair(t, id)
	before := chain(11, 300)
	owner.Record(id, before)
	eventually(t, wait, "the other's copy matches", func() error { return matches(other.Mesh, id, before) })
	name := owner.cfg.Name
	if err := owner.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	// The other owns it for real: what it records now takes.
	meanwhile := chain(12, 100)
	eventually(t, wait, "the other owns it and records", func() error {
		other.Record(id, meanwhile)
		return matches(other.Mesh, id, meanwhile)
	})
	back := newRouter(t, name, joining(other))
	declare(back, id)
	fresh := chain(13, 20)
	back.Record(id, fresh)
	eventually(t, wait, "the restarted owner is warm and kept its own", func() error {
		if _, local, ok := back.Locate(id); !ok || !local {
			return fmt.Errorf("local=%v ok=%v", local, ok)
		}
		for _, hs := range [][]uint64{before, meanwhile, fresh} {
			if err := matches(back.Mesh, id, hs); err != nil {
				return err
			}
		}
		return matches(other.Mesh, id, fresh)
	})
}

func TestRestartedSoleOwnerTakesItsSummaryBackFromACopy(t *testing.T) {
	id := "http://only-a:8000"
	a := newRouter(t, "a", nil)
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	hashes := chain(8, 400)
	a.Record(id, hashes)
	eventually(t, wait, "b's copy matches", func() error { return matches(b.Mesh, id, hashes) })
	if err := a.Close(t.Context()); err != nil {
		t.Logf("close: %v", err)
	}
	eventually(t, wait, "b sees a gone", func() error {
		if members(b.Mesh) != 1 {
			return errors.New("a still alive")
		}
		return nil
	})
	// Nobody owned the replica meanwhile: only b's copy has its history.
	back := newRouter(t, "a", joining(b))
	declare(back, id)
	// Requests keep coming while it rejoins: what it records meanwhile
	// must survive the adoption.
	fresh := chain(9, 50)
	eventually(t, wait, "the restarted owner owns it", func() error {
		if _, local, ok := back.Locate(id); !ok || !local {
			return fmt.Errorf("local=%v ok=%v", local, ok)
		}
		return nil
	})
	back.Record(id, fresh)
	all := append(slices.Clone(hashes), fresh...)
	eventually(t, wait, "the restarted owner is warm, and so is b's copy", func() error {
		if err := matches(back.Mesh, id, all); err != nil {
			return err
		}
		return matches(b.Mesh, id, all)
	})
}

func TestAdoptSummary(t *testing.T) {
	params := summary.Params{CapacityBlocks: 4096, FalsePositiveRate: summary.DefaultFalsePositiveRate}
	sum := func(epoch uint64, hashes []uint64) *summary.Summary {
		s, err := summary.New(params, epoch)
		if err != nil {
			t.Fatal(err)
		}
		s.Add(hashes)
		return s
	}
	old, mine := chain(1, 40), chain(2, 5)
	tests := []struct {
		name   string
		owner  string
		ours   *summary.Summary
		origin string
		boot   uint64
		theirs *summary.Summary
		adopt  bool
	}{
		{"restarted: ours young, a copy of our previous boot", "a", sum(2, mine), "a", 1, sum(1, old), true},
		{"no summary yet, the previous owner's", "a", nil, "b", 9, sum(1, old), true},
		{"same epoch already", "a", sum(1, mine), "b", 9, sum(1, old), false},
		{"not the owner", "b", sum(2, mine), "b", 9, sum(1, old), false},
		{"our own current boot", "a", sum(2, mine), "a", 7, sum(1, old), false},
		{"an empty one", "a", sum(2, mine), "b", 9, sum(1, nil), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &replication{env: &env{cfg: Config{Name: "a"}, log: hclog.NewNullLogger(), boot: 7}, tab: &table{}}
			r := &replica{id: "r", sum: tc.ours, owned: tc.ours != nil}
			st := &stateMsg{header: header{Origin: tc.origin, Boot: tc.boot}}
			before := tc.theirs.Version()
			got := m.adoptSummaryLocked(r, tc.owner, st, tc.theirs)
			if got != tc.adopt {
				t.Fatalf("adopted %v, want %v", got, tc.adopt)
			}
			if !got {
				if r.sum != tc.ours {
					t.Fatal("the summary changed though not adopted")
				}
				return
			}
			want := old
			if tc.ours != nil {
				want = append(slices.Clone(old), mine...)
				if r.lastSent != before {
					t.Fatalf("lastSent %d, want %d (the re-added inserts go out as deltas)", r.lastSent, before)
				}
			}
			if n := r.sum.Match(summary.MakeProbes(nil, want)); n != len(want) || r.sum.Epoch() != 1 {
				t.Fatalf("adopted summary epoch %d matches %d of %d", r.sum.Epoch(), n, len(want))
			}
		})
	}
}
