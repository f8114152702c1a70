package mesh

import (
	"bytes"
	"fmt"
	"github.com/kvmesh/kvmesh/route"
	"net"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWireVersionChoice is the pure part of a rolling upgrade: which
// version a router encodes at for the peers it knows, and that every
// peer decodes what it is sent at its own version, flagNoLoad and the
// engine section (flagEngine) included exactly when every receiver knows
// them.
func TestWireVersionChoice(t *testing.T) {
	noLoad := sampleState()
	noLoad.Engine, noLoad.EngineWire = route.EngineLoad{Slots: 8}, true
	future := wireLatest + 3 // a router newer than this build
	for _, tc := range []struct {
		name string
		self wireVersion
		join bool
		live []wireVersion
		want wireVersion // the push/pull state's version
	}{
		{"every peer upgraded", wireLatest, false, []wireVersion{wireLatest, wireLatest}, wireLatest},
		{"one peer from before versioning", wireLatest, false, []wireVersion{wireLatest, wireBase, wireLatest}, wireBase},
		{"one peer from before flagEngine", wireLatest, false, []wireVersion{wireLatest, wireNoLoad}, wireNoLoad},
		{"a peer newer than this router", wireLatest, false, []wireVersion{future, wireLatest}, wireLatest},
		{"no peer yet", wireLatest, false, nil, wireLatest},
		{"a join: the peer may be unknown", wireLatest, true, []wireVersion{wireLatest}, wireBase},
		{"this router from before versioning", wireBase, false, []wireVersion{wireLatest}, wireBase},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := pushPullWire(tc.self, tc.join, tc.live)
			if v != tc.want {
				t.Fatalf("push/pull at version %d, want %d", v, tc.want)
			}
			st := noLoad.at(v)
			b := st.append(nil)
			for _, p := range tc.live {
				// A peer decodes what it knows: this build's decoder
				// at the peer's version (a newer one knows all of it).
				got, err := decodeMsg(b, min(p, wireLatest))
				if err != nil {
					t.Fatalf("a peer of version %d refuses the push/pull state: %v", p, err)
				}
				if s := got.(stateMsg); s.Engine.HasLoad == (v >= wireNoLoad) || s.EngineWire != (v >= wireEngine) || s.Engine.Slots != 8 {
					t.Fatalf("a peer of version %d reads %+v", p, s)
				}
				// A batch goes to each peer at its own version.
				pv := peerWire(tc.self, p)
				ps := noLoad.at(pv)
				got, err = decodeMsg(ps.append(nil), min(p, wireLatest))
				if err != nil || got.(stateMsg).Engine.HasLoad == (min(tc.self, p) >= wireNoLoad) ||
					got.(stateMsg).EngineWire != (min(tc.self, p) >= wireEngine) {
					t.Fatalf("a peer of version %d: batch state at %d: %+v %v", p, pv, got, err)
				}
			}
		})
	}
}

// TestEntryStateForOldPeer: an owner's tick encodes a no-load state
// whole once, and for a peer from before flagNoLoad once more without
// it: the bytes such a peer always read (the golden state's, when the
// counts are the sample's), shared by every peer of its version; a peer
// from before flagEngine gets the counts and flagNoLoad; a state that
// needs no newer version is the one encoding for everyone.
func TestEntryStateForOldPeer(t *testing.T) {
	m := &dissemination{env: &env{log: hclog.NewNullLogger()}}
	st := sampleState()
	st.Engine.HasLoad, st.EngineWire = false, true
	c := cut{st: st}
	e := entryEnc{c: &c}
	e.stFull, e.need = m.encodeState(nil, &c.st), c.st.needs()
	known := sampleState()
	if got := e.stateFor(m, wireBase); !bytes.Equal(got, known.append(nil)) {
		t.Fatalf("an old peer's state\n%x\nwant the state without the flag\n%x", got, known.append(nil))
	}
	if v, err := decodeMsg(e.stateFor(m, wireBase), wireBase); err != nil || !v.(stateMsg).Engine.HasLoad {
		t.Fatalf("an old decoder reads %+v %v", v, err)
	}
	noLoad := sampleState()
	noLoad.Engine.HasLoad = false
	if got := e.stateFor(m, wireNoLoad); !bytes.Equal(got, noLoad.append(nil)) {
		t.Fatalf("a peer before flagEngine gets\n%x\nwant the counts with flagNoLoad\n%x", got, noLoad.append(nil))
	}
	if _, err := decodeMsg(e.stFull, wireNoLoad); err == nil {
		t.Fatal("a decoder before flagEngine reads it: the test tests nothing")
	}
	if &e.stateFor(m, wireBase)[0] != &e.stOld[wireBase][0] {
		t.Fatal("the old peers' encoding is not shared")
	}
	if got := e.stateFor(m, wireLatest); !bytes.Equal(got, e.stFull) {
		t.Fatal("a new peer does not get the whole state")
	}
	if _, err := decodeMsg(e.stFull, wireBase); err == nil {
		t.Fatal("an old decoder reads flagNoLoad: the test tests nothing")
	}

	k := cut{st: sampleState()}
	ke := entryEnc{c: &k}
	ke.stFull, ke.need = m.encodeState(nil, &k.st), k.st.needs()
	if got := ke.stateFor(m, wireBase); &got[0] != &ke.stFull[0] || ke.stOld[wireBase] != nil {
		t.Fatal("a state with known load is encoded twice")
	}
}

// TestRollingUpgradeNoLoad: a router from before flagNoLoad (b,
// advertising and decoding wireBase), or from before flagEngine
// (wireNoLoad), in a mesh with newer ones keeps a fresh copy of a newer
// owner's replica whose engine publishes no load counts, across batches
// and push/pulls, and refuses nothing; a newer router (c) still learns
// that the engine publishes none, and the section's other fields (its
// LoRA adapters among them). Without
// the version, the owner's batches and push/pull states carry the flag, b
// refuses them all, and its copy never counts.
func TestRollingUpgradeNoLoad(t *testing.T) {
	for _, old := range []wireVersion{wireBase, wireNoLoad} {
		t.Run(fmt.Sprint("wire ", old), func(t *testing.T) { rollingUpgradeNoLoad(t, old) })
	}
}

func rollingUpgradeNoLoad(t *testing.T, old wireVersion) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", func(c *Config) { joining(a)(c); c.wire = &old })
	c := newRouter(t, "c", joining(a))
	for _, r := range []*testRouter{a, b, c} {
		eventually(t, wait, "three members at "+r.cfg.Name, func() error {
			if n := members(r.Mesh); n != 3 {
				return fmt.Errorf("%d members", n)
			}
			return nil
		})
	}
	for _, mb := range a.Members() {
		if want := map[string]int{"a": int(wireLatest), "b": int(old), "c": int(wireLatest)}[mb.Name]; mb.Wire != want {
			t.Fatalf("a lists %s at wire version %d, want %d", mb.Name, mb.Wire, want)
		}
	}
	id := "http://a-rep"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m", "sql"}, Healthy: true, CapacityBlocks: 2048, Load: route.EngineLoad{Slots: 8, KVUsage: 5000}, // no HasLoad
		LoRA: route.MakeLoRAs(2, []string{"m"}, nil, []string{"sql"}, nil)})
	eventually(t, wait, "c learns the engine publishes no counts, and its adapters", func() error {
		if c, ok := candidate(c.Mesh, "m", id); !ok || c.Summary == nil || c.HasLoad || c.KVUsage != 5000 {
			return fmt.Errorf("ok=%v summary %v has load %v, KV usage %d", ok, c.Summary != nil, c.HasLoad, c.KVUsage)
		}
		if c, ok := candidate(c.Mesh, "sql", id); !ok || c.LoRA&route.LoRAResident == 0 {
			return fmt.Errorf("ok=%v sql's fit %05b", ok, c.LoRA)
		}
		return nil
	})
	pushPulls := func() float64 {
		return testutil.ToFloat64(b.met.messages.WithLabelValues(kindName(kindPushPull), "in"))
	}
	// Rounds of new blocks, until b has merged push/pulls past its join
	// (a join's is at wireBase whatever the peers) and the copy has
	// outlived StaleAfter: every round reaches b's copy.
	start := pushPulls()
	for i := uint64(0); pushPulls() < start+3; i++ {
		hashes := chain(100+i, 20)
		a.Record(id, hashes)
		eventually(t, wait, fmt.Sprintf("round %d: b's copy matches", i), func() error { return matches(b.Mesh, id, hashes) })
	}
	// b reads the state as its version always did: before flagNoLoad as
	// load known, and without the section's other fields.
	if c, _ := candidate(b.Mesh, "m", id); c.HasLoad != (old < wireNoLoad) || c.Slots != 8 || c.KVUsage != 0 {
		t.Fatalf("b at wire %d reads %+v", old, c.EngineLoad)
	}
	if c, _ := candidate(b.Mesh, "sql", id); c.LoRA != 0 {
		t.Fatalf("b at wire %d reads the adapters the engine section carries: %05b", old, c.LoRA)
	}
	if n := testutil.ToFloat64(b.met.dropped.WithLabelValues(dropDecode)); n != 0 {
		t.Fatalf("b refused %v messages", n)
	}
}

// BenchmarkOfferOldPeer is BenchmarkOffer when every replica's engine
// publishes no load and one of the 8 peers is from before flagNoLoad:
// each state is encoded twice, once whole and once for the old peer.
func BenchmarkOfferOldPeer(b *testing.B) {
	benchOffer(b, func(cuts []cut, peers []*peer) {
		for i := range cuts {
			cuts[i].st.Engine.HasLoad = false
		}
		for _, p := range peers[1:] {
			p.wire = wireLatest
		}
	})
}

// TestHeardWire: a router's wire version comes from memberlist's events
// and from every alive message about it, which is how a router that
// restarted into another build before its failure was noticed (no event:
// its metadata did not change) is known by its new version; an alive
// message about a router not known yet, or about another node by a known
// name, changes nothing.
func TestHeardWire(t *testing.T) {
	a := newRouter(t, "a", nil)
	d := &delegate{mem: a.mem, rep: a.rep}
	meta := nodeMeta{Region: "r1", API: "http://b.test", Contract: a.mem.contractID}.encode()
	node := func(addr string, dmax wireVersion) *memberlist.Node {
		return &memberlist.Node{Name: "b", Addr: net.ParseIP(addr), Port: 7946, Meta: meta, DMax: uint8(dmax)}
	}
	wireOf := func() (wireVersion, bool) {
		a.mem.mu.RLock()
		defer a.mem.mu.RUnlock()
		mb := a.mem.members["b"]
		if mb == nil {
			return 0, false
		}
		return mb.wire, true
	}
	if err := d.NotifyAlive(node("10.0.0.2", wireLatest)); err != nil {
		t.Fatal(err)
	}
	if _, known := wireOf(); known {
		t.Fatal("an alive message made a member; the join event does")
	}
	d.NotifyJoin(node("10.0.0.2", wireBase))
	for _, step := range []struct {
		name string
		n    *memberlist.Node
		want wireVersion
	}{
		{"restarted into a newer build", node("10.0.0.2", wireLatest), wireLatest},
		{"another node by its name", node("10.0.0.9", wireBase), wireLatest},
		{"restarted into an older build", node("10.0.0.2", wireBase), wireBase},
	} {
		if err := d.NotifyAlive(step.n); err != nil {
			t.Fatal(err)
		}
		if got, _ := wireOf(); got != step.want {
			t.Fatalf("%s: wire %d, want %d", step.name, got, step.want)
		}
	}
	d.NotifyUpdate(node("10.0.0.2", wireLatest))
	if got, _ := wireOf(); got != wireLatest {
		t.Fatalf("after an update event: wire %d", got)
	}
}

// TestJoinPushPullKeepsNoLoad: a join's push/pull is encoded at wireBase,
// which cannot say an engine publishes no load. A router that re-joins
// its seed (as routers do after a failure) must not make the seed read a
// no-load replica's zero counts as known ones.
func TestJoinPushPullKeepsNoLoad(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	id := "http://b-rep"
	b.DeclareReplica(id)
	b.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048, Load: route.EngineLoad{Slots: 8}}) // no HasLoad
	b.Record(id, chain(1, 20))
	eventually(t, wait, "a learns b's engine publishes no counts", func() error {
		if c, ok := candidate(a.Mesh, "m", id); !ok || c.Summary == nil || c.HasLoad {
			return fmt.Errorf("ok=%v summary %v has load %v", ok, c.Summary != nil, c.HasLoad)
		}
		return nil
	})
	da, db := &delegate{mem: a.mem, rep: a.rep}, &delegate{mem: b.mem, rep: b.rep}
	for _, join := range []bool{true, false} {
		da.MergeRemoteState(db.LocalState(join), join)
		if c, ok := candidate(a.Mesh, "m", id); !ok || c.HasLoad {
			t.Fatalf("after b's push/pull (join %v): candidate ok=%v, has load %v, want no load", join, ok, c.HasLoad)
		}
	}
}

// TestRollingUpgradeRole: a router from before roles (b, wireUsage) in
// a mesh with newer ones reads a newer owner's prefill replica as a
// whole one, keeps a fresh copy of it across batches and push/pulls, and
// refuses nothing; a newer router (c) learns the role and the bootstrap
// port, and keeps them across the push/pulls, which are encoded at b's
// version while b is alive and so say nothing of roles.
func TestRollingUpgradeRole(t *testing.T) {
	old := wireUsage
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", func(c *Config) { joining(a)(c); c.wire = &old })
	c := newRouter(t, "c", joining(a))
	for _, r := range []*testRouter{a, b, c} {
		eventually(t, wait, "three members at "+r.cfg.Name, func() error {
			if n := members(r.Mesh); n != 3 {
				return fmt.Errorf("%d members", n)
			}
			return nil
		})
	}
	id := "http://a-prefill"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048,
		Load: route.EngineLoad{Slots: 8, HasLoad: true}, Role: route.RolePrefill, Bootstrap: 8998})
	roleAt := func(m *Mesh) (route.Role, uint16, bool) {
		cand, ok := candidate(m, "m", id)
		if !ok || cand.Detail == nil {
			return 0, 0, false
		}
		return cand.Role, cand.Detail.Bootstrap, cand.Summary != nil
	}
	eventually(t, wait, "c learns the role", func() error {
		if r, port, ok := roleAt(c.Mesh); !ok || r != route.RolePrefill || port != 8998 {
			return fmt.Errorf("role %v port %d summary %v", r, port, ok)
		}
		return nil
	})
	pushPulls := func(r *testRouter) float64 {
		return testutil.ToFloat64(r.met.messages.WithLabelValues(kindName(kindPushPull), "in"))
	}
	startB, startC := pushPulls(b), pushPulls(c)
	for i := uint64(0); pushPulls(b) < startB+3 || pushPulls(c) < startC+3; i++ {
		hashes := chain(200+i, 20)
		a.Record(id, hashes)
		eventually(t, wait, fmt.Sprintf("round %d: b's copy matches", i), func() error { return matches(b.Mesh, id, hashes) })
		if r, port, ok := roleAt(c.Mesh); !ok || r != route.RolePrefill || port != 8998 {
			t.Fatalf("round %d: c reads role %v port %d (summary %v)", i, r, port, ok)
		}
	}
	if r, port, ok := roleAt(b.Mesh); !ok || r != route.RoleBoth || port != 0 {
		t.Fatalf("b at wire %d reads role %v port %d (summary %v)", old, r, port, ok)
	}
	if n := testutil.ToFloat64(b.met.dropped.WithLabelValues(dropDecode)); n != 0 {
		t.Fatalf("b refused %v messages", n)
	}
	// Made whole again, the replica is whole at c from the next batch.
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048, Load: route.EngineLoad{Slots: 8, HasLoad: true}})
	eventually(t, wait, "c learns the replica is whole", func() error {
		if r, port, _ := roleAt(c.Mesh); r != route.RoleBoth || port != 0 {
			return fmt.Errorf("role %v port %d", r, port)
		}
		return nil
	})
}

// TestPushPullKeepsRole: a join's push/pull is encoded at wireBase, which
// cannot carry a role; merging one must not make a prefill replica read
// as a whole one.
func TestPushPullKeepsRole(t *testing.T) {
	a := newRouter(t, "a", nil)
	b := newRouter(t, "b", joining(a))
	id := "http://b-decode"
	b.DeclareReplica(id)
	b.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 2048, Role: route.RoleDecode})
	b.Record(id, chain(1, 20))
	eventually(t, wait, "a learns the role", func() error {
		if c, ok := candidate(a.Mesh, "m", id); !ok || c.Role != route.RoleDecode {
			return fmt.Errorf("ok=%v role %v", ok, c.Role)
		}
		return nil
	})
	da, db := &delegate{mem: a.mem, rep: a.rep}, &delegate{mem: b.mem, rep: b.rep}
	for _, join := range []bool{true, false} {
		da.MergeRemoteState(db.LocalState(join), join)
		if c, ok := candidate(a.Mesh, "m", id); !ok || c.Role != route.RoleDecode {
			t.Fatalf("after b's push/pull (join %v): candidate ok=%v, role %v", join, ok, c.Role)
		}
	}
}
