package mesh

import (
	"fmt"
	"io"
	"log"
	"net"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEngineLoadReachesEveryRouter: the engine's load, every field of
// route.EngineLoad set (by reflection, so that a field added there is
// checked here too), reaches the owner's candidate and a peer's as is.
func TestEngineLoadReachesEveryRouter(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	load := route.EngineLoad{Running: 3, Waiting: 2, Slots: 8}
	v := reflect.ValueOf(&load).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int32, reflect.Int64:
			if f.Int() == 0 {
				f.SetInt(int64(10 + i))
			}
		case reflect.Uint8, reflect.Uint16, reflect.Uint32:
			f.SetUint(uint64(10 + i))
		default:
			t.Fatalf("EngineLoad.%s of kind %s: teach this test about it", v.Type().Field(i).Name, f.Kind())
		}
	}
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048, Load: load})
	for _, r := range []*testRouter{a, b} {
		eventually(t, wait, r.cfg.Name+" sees the engine's load", func() error {
			c, ok := candidate(r.Mesh, "m", id)
			if !ok || c.EngineLoad != load {
				return fmt.Errorf("ok=%v load %+v, want %+v", ok, c.EngineLoad, load)
			}
			// The status page shows it from the debug view, at the owner and elsewhere.
			for _, d := range r.Debug().Replicas {
				if d.ID == id && (d.EngineRunning != 3 || d.EngineWaiting != 2 || d.EngineSlots != 8) {
					return fmt.Errorf("debug view: running %d waiting %d slots %d", d.EngineRunning, d.EngineWaiting, d.EngineSlots)
				}
			}
			return nil
		})
	}
}

// TestEngineWithoutLoadNeverSpreads: whether an engine publishes its
// running and waiting counts (ReplicaStatus.HasLoad) reaches every
// router's candidates and debug view, and only a cluster whose every
// engine publishes them, all at 0, makes a busy first choice spread by
// this router's own requests (route's burst rule): an engine that
// publishes none reports 0 and 0 for ever, and would otherwise make the
// rule fire whenever a key's first choice is busy.
func TestEngineWithoutLoadNeverSpreads(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	own, b1, b2 := "http://a-rep", "http://b-rep1", "http://b-rep2"
	declare(a, own)
	declare(b, b1)
	declare(b, b2)
	status := func(hasLoad bool) ReplicaStatus {
		return ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048, Load: route.EngineLoad{Slots: 8, HasLoad: hasLoad}}
	}
	req := route.Request{Hashes: chain(77, 4)}
	req.Probes = probes(req.Hashes)
	for _, tc := range []struct {
		name    string
		noLoad  string // the replica whose engine publishes no counts
		spreads bool
	}{
		{"every engine publishes its counts", "", true},
		{"this router's engine publishes none", own, false},
		{"another router's engine publishes none", b1, false},
		{"every engine publishes its counts again", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.UpdateReplica(own, status(tc.noLoad != own))
			b.UpdateReplica(b1, status(tc.noLoad != b1))
			b.UpdateReplica(b2, status(tc.noLoad != b2))
			var cands []route.Candidate
			for _, r := range []*testRouter{b, a} {
				eventually(t, wait, r.cfg.Name+" sees whose counts are known", func() error {
					cands = r.Candidates("m", nil)
					if len(cands) != 3 {
						return fmt.Errorf("%d candidates", len(cands))
					}
					for _, c := range cands {
						if c.Summary == nil || c.HasLoad != (c.ID() != tc.noLoad) {
							return fmt.Errorf("%s: summary %v, has load %v", c.ID(), c.Summary != nil, c.HasLoad)
						}
					}
					for _, d := range r.Debug().Replicas {
						if d.EngineHasLoad != (d.ID != tc.noLoad) {
							return fmt.Errorf("debug view: %s has load %v", d.ID, d.EngineHasLoad)
						}
					}
					return nil
				})
			}
			// At a, in a burst every engine reported idle from: its own
			// replica holds two requests the other routers sent (none of
			// a's own), b's replicas one of a's each. The key's first
			// choice is busy whichever it is: the burst rule takes a's
			// replica (the fewest of a's own), the shortest wait one of
			// b's.
			for i := range cands {
				c := &cands[i]
				if c.ID() == own {
					c.InFlight, c.PendingPrefillBlocks, c.Detail.Own = 2, 8, 0
				} else {
					c.InFlight, c.PendingPrefillBlocks, c.Detail.Own = 1, 4, 1
				}
			}
			d := route.DefaultPolicy().Pick(req, cands)
			if d.Reason != route.ReasonFallbackCold || (cands[d.Index].ID() == own) != tc.spreads {
				t.Fatalf("decision %+v (%s), want spread to a's replica %v", d, cands[d.Index].ID(), tc.spreads)
			}
		})
	}
}

func TestForgetReachesCopies(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	h := chain(40, 20)
	a.Record(id, h)
	eventually(t, wait, "b matches", func() error { return matches(b.Mesh, id, h) })
	b.Forget(id, h[5:]) // not the owner: no-op
	a.Forget(id, h[10:])
	matchLen := func(r *testRouter) int {
		c, _ := candidate(r.Mesh, "m", id)
		if c.Summary == nil {
			return -1
		}
		return c.Summary.Match(probes(h))
	}
	for _, r := range []*testRouter{a, b} {
		eventually(t, wait, r.cfg.Name+" stops at the forgotten block", func() error {
			if got := matchLen(r); got != 10 {
				return fmt.Errorf("match %d, want 10", got)
			}
			return nil
		})
	}
	a.Record(id, h[10:]) // the engine caches them again
	eventually(t, wait, "b matches all again", func() error { return matches(b.Mesh, id, h) })
}

func TestWithdrawReachesPeers(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	shared, alone := "http://shared", "http://alone"
	declare(a, shared)
	declare(b, shared)
	declare(a, alone)
	eventually(t, wait, "b sees both replicas", func() error {
		for _, id := range []string{shared, alone} {
			if _, _, ok := b.Locate(id); !ok {
				return fmt.Errorf("%s not located", id)
			}
		}
		return nil
	})
	a.WithdrawReplica(shared)
	a.WithdrawReplica(alone)
	eventually(t, wait, "b owns the shared replica and drops the other", func() error {
		if _, local, ok := b.Locate(shared); !ok || !local {
			return fmt.Errorf("shared: local=%v ok=%v", local, ok)
		}
		if _, _, ok := b.Locate(alone); ok {
			return fmt.Errorf("withdrawn replica still located")
		}
		return nil
	})
	// b's own declarations, which name a from before, do not bring a back.
	time.Sleep(10 * a.cfg.Timing.StateInterval)
	if _, local, ok := a.Locate(shared); !ok || local {
		t.Fatalf("a after withdrawing: local=%v ok=%v, want b's", local, ok)
	}
}

// slowTransport delays every stream dial while slow is set: a peer that
// cannot keep up.
type slowTransport struct {
	*memberlist.NetTransport
	slow atomic.Bool
}

func (s *slowTransport) DialAddressTimeout(a memberlist.Address, to time.Duration) (net.Conn, error) {
	if s.slow.Load() {
		time.Sleep(300 * time.Millisecond)
	}
	return s.NetTransport.DialAddressTimeout(a, to)
}

func (s *slowTransport) DialTimeout(addr string, to time.Duration) (net.Conn, error) {
	return s.DialAddressTimeout(memberlist.Address{Addr: addr}, to)
}

func TestSlowPeerGetsFullCopiesNeverGaps(t *testing.T) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	st := &slowTransport{NetTransport: nt}
	a := newRouter(t, "a", func(c *Config) { c.Transport = st })
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	eventually(t, wait, "b sees a's replica", func() error { return matches(b.Mesh, id, nil) })
	st.slow.Store(true)
	overflow := func() float64 { return testutil.ToFloat64(a.met.fullCopies.WithLabelValues(fullOverflow)) }
	var last []uint64
	for i := 0; overflow() == 0; i++ {
		if i > 2000 {
			t.Fatal("the queue to a slow peer never overflowed")
		}
		last = chain(uint64(100+i), 8)
		a.Record(id, last)
		time.Sleep(5 * time.Millisecond)
	}
	st.slow.Store(false)
	eventually(t, wait, "b catches up with the latest record", func() error { return matches(b.Mesh, id, last) })
	eventually(t, wait, "b's copy is the owner's", func() error {
		sa, sb := a.sumOf(id), b.sumOf(id)
		if string(sa.AppendEncode(nil, 1)) != string(sb.AppendEncode(nil, 1)) {
			return fmt.Errorf("copy differs: owner v%d, copy v%d", sa.Version(), sb.Version())
		}
		return nil
	})
	if n := a.dis.queued.Load(); n > int64(a.dis.maxPeerMsgs()) {
		t.Fatalf("%d batches queued, over the bound %d", n, a.dis.maxPeerMsgs())
	}
}

func probes(h []uint64) []summary.Probe { return summary.MakeProbes(nil, h) }

// TestLoRAReachesEveryRouter: a replica's LoRA adapters (limit, in use,
// base models) reach the owner's and a peer's candidates, reduced per
// model, and their debug views by name; a change follows.
func TestLoRAReachesEveryRouter(t *testing.T) {
	a := newRouter(t, "a", nil)
	id := "http://a-rep"
	declare(a, id)
	b := newRouter(t, "b", joining(a))
	models := []string{"base", "chat", "legal", "sql"}
	status := func(l route.LoRAs) ReplicaStatus {
		return ReplicaStatus{Models: models, Healthy: true, CapacityBlocks: 2048, Load: route.EngineLoad{Slots: 8}, LoRA: l}
	}
	for _, step := range []struct {
		lora   route.LoRAs
		fits   map[string]route.LoRAFit
		loaded []string
	}{
		{route.MakeLoRAs(2, []string{"base"}, nil, []string{"sql"}, []string{"chat"}),
			map[string]route.LoRAFit{"base": 0, "sql": route.LoRAAdapter | route.LoRAResident | route.LoRAFree, "chat": route.LoRAAdapter | route.LoRAWaiting | route.LoRAFree,
				"legal": route.LoRAAdapter | route.LoRAFree},
			[]string{"sql"}},
		{route.MakeLoRAs(2, []string{"base"}, []string{"sql"}, []string{"legal"}, nil),
			map[string]route.LoRAFit{"base": 0, "sql": route.LoRAAdapter | route.LoRAResident | route.LoRARoom, "legal": route.LoRAAdapter | route.LoRAResident | route.LoRARoom,
				"chat": route.LoRAAdapter | route.LoRARoom},
			[]string{"legal", "sql"}},
	} {
		a.UpdateReplica(id, status(step.lora))
		for _, r := range []*testRouter{a, b} {
			eventually(t, wait, r.cfg.Name+" sees the replica's adapters", func() error {
				for m, want := range step.fits {
					c, ok := candidate(r.Mesh, m, id)
					if !ok || c.LoRA != want {
						return fmt.Errorf("%s: ok=%v fit %04b, want %04b", m, ok, c.LoRA, want)
					}
				}
				for _, d := range r.Debug().Replicas {
					if d.ID == id && (d.LoRAMax != 2 || !slices.Equal(d.LoRALoaded, step.loaded)) {
						return fmt.Errorf("debug view: max %d loaded %v", d.LoRAMax, d.LoRALoaded)
					}
				}
				return nil
			})
		}
	}
}
