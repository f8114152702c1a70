package mesh

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A miss on a prefix the owner's summary holds in its newer generation
// shows the engine holds less than the summary remembers: the owner drops
// the older generation, and the copy at the other router follows (the
// cut is a rotation in the ordered deltas).
func TestMissCutsTheOlderGenerationEverywhere(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id) // 2048 blocks: generations of 1536, 384 recent adds
	b := newRouter(t, "b", joining(a))
	old, early := chain(1, 40), chain(2, 40)
	a.Record(id, old)
	for i := range 40 {
		a.Record(id, chain(uint64(100+i), 40)) // 1600 blocks: one rotation
	}
	a.Record(id, early)
	for i := range 40 {
		a.Record(id, chain(uint64(200+i), 10)) // early leaves the recent adds
	}
	for _, h := range [][]uint64{old, early} {
		eventually(t, wait, "b matches", func() error { return matches(b.Mesh, id, h) })
	}
	b.Forget(id, early[10:]) // not the owner: no-op
	a.Forget(id, early[10:]) // the engine had 10 blocks of early
	match := func(r *testRouter, h []uint64) int {
		c, _ := candidate(r.Mesh, "m", id)
		if c.Summary == nil {
			return -1
		}
		return c.Summary.Match(summary.MakeProbes(nil, h))
	}
	for _, r := range []*testRouter{a, b} {
		eventually(t, wait, r.cfg.Name+" drops the older generation", func() error {
			if o, e := match(r, old), match(r, early); o != 0 || e != 10 {
				return fmt.Errorf("matches old %d (want 0), early %d (want 10)", o, e)
			}
			return nil
		})
	}
	if got := testutil.ToFloat64(a.met.cuts.WithLabelValues("older")); got != 1 {
		t.Fatalf("cuts of the older generation: %v", got)
	}
	a.Record(id, early) // the engine computed it again
	eventually(t, wait, "b matches early again", func() error { return matches(b.Mesh, id, early) })
}

// A restart of a replica's engine, as its health checks report it, cuts
// the owner's summary of it whole, in the same epoch, and the copy at the
// other router follows; a status that reports no new restart cuts
// nothing, and what is recorded after the restart is kept.
func TestRestartCutsTheSummaryEverywhere(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	before, after := chain(1, 40), chain(2, 40)
	a.Record(id, before)
	eventually(t, wait, "b matches", func() error { return matches(b.Mesh, id, before) })
	epoch := a.sumOf(id).Epoch()
	up := ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048}
	a.UpdateReplica(id, up) // no restart
	if err := matches(a.Mesh, id, before); err != nil {
		t.Fatalf("a status without a restart cut the summary: %v", err)
	}
	up.Restarts = 1
	a.UpdateReplica(id, up)
	a.UpdateReplica(id, up) // the same restart, reported again
	a.Record(id, after)     // the restarted engine computed it
	match := func(r *testRouter, h []uint64) int {
		c, _ := candidate(r.Mesh, "m", id)
		if c.Summary == nil {
			return -1
		}
		return c.Summary.Match(summary.MakeProbes(nil, h))
	}
	for _, r := range []*testRouter{a, b} {
		eventually(t, wait, r.cfg.Name+" drops what the engine held before its restart", func() error {
			if o, n := match(r, before), match(r, after); o != 0 || n != len(after) {
				return fmt.Errorf("matches before %d (want 0), after %d (want %d)", o, n, len(after))
			}
			return nil
		})
	}
	if got := a.sumOf(id).Epoch(); got != epoch {
		t.Errorf("epoch %d after the restart, want %d (a cut, not a new summary)", got, epoch)
	}
	if got := testutil.ToFloat64(a.met.cuts.WithLabelValues("both")); got != 1 {
		t.Errorf("cuts of both generations: %v, want 1", got)
	}
}

// A new capacity (the engine's cache counted in blocks at a newly learnt
// bytes per token) resizes the owner's summary into a new epoch that
// still holds what the replica held, and the copy at the other router
// takes it (a full copy) and matches it too.
func TestResizeKeepsWhatTheReplicaHolds(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	held := chain(6, 41)
	a.Record(id, held)
	eventually(t, wait, "b matches", func() error { return matches(b.Mesh, id, held) })
	epoch := a.sumOf(id).Epoch()
	for _, capacity := range []int{2600, 1500} {
		a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: capacity})
		s := a.sumOf(id)
		if s.Epoch() == epoch || s.Params().CapacityBlocks != capacity {
			t.Fatalf("capacity %d: summary of epoch %d (was %d), capacity %d", capacity, s.Epoch(), epoch, s.Params().CapacityBlocks)
		}
		epoch = s.Epoch()
		if err := matches(a.Mesh, id, held); err != nil {
			t.Fatalf("capacity %d: the owner forgot what the replica held: %v", capacity, err)
		}
		eventually(t, wait, "b matches in the new epoch", func() error {
			if s := b.sumOf(id); s == nil || s.Epoch() != epoch {
				return fmt.Errorf("b's copy is not of epoch %d", epoch)
			}
			return matches(b.Mesh, id, held)
		})
	}
}

// Between an owner's state naming a new epoch (a resize) and the full
// copy of it, a peer's copy of the old epoch still counts: the replica
// holds what it said, and reading it as stale would place the follow-ups
// due there as cold. A copy of the owner's own epoch that waits for a full
// copy (it diverged) does not count.
func TestCopyOfTheOldEpochCountsUntilTheNewLands(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	held := chain(6, 43)
	a.Record(id, held)
	eventually(t, wait, "b matches", func() error { return matches(b.Mesh, id, held) })

	b.tab.mu.Lock()
	defer b.tab.mu.Unlock()
	r := b.tab.replicas[id]
	old := r.sum.Epoch()
	for _, tc := range []struct {
		name     string
		epoch    uint64
		wantFull bool
		counts   bool
	}{
		{"in step", old, false, true},
		{"the owner's state names a new epoch, its full copy on its way", old + 1, true, true},
		{"the same epoch, diverged", old, true, false},
	} {
		r.st.Epoch, r.wantFull = tc.epoch, tc.wantFull
		e, models := b.view.entryLocked(r)
		if got := b.tab.countsLocked(r, time.Now()); got != tc.counts || e.counts != tc.counts || (e.sum != nil) != tc.counts || len(models) == 0 {
			t.Errorf("%s: counts %v, entry counts %v with summary %v (models %v), want %v", tc.name, got, e.counts, e.sum != nil, models, tc.counts)
		}
	}
	r.st.Epoch, r.wantFull = old, false
}
