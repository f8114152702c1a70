package mesh

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slowStates is TestTiming with states and push/pulls a minute apart
// (and copies that count meanwhile): between the join's push/pull and
// the first tick, only beacons can carry a load change.
func slowStates(c *Config) {
	c.Timing = TestTiming()
	c.Timing.StateInterval, c.Timing.PushPullInterval, c.Timing.StaleAfter = time.Minute, time.Minute, 10*time.Minute
}

// loadAt is router m's candidate id's load, as a decision reads it.
func loadAt(m *Mesh, id string) (int32, float64, error) {
	c, ok := candidate(m, "m", id)
	if !ok {
		return 0, 0, fmt.Errorf("%s: %s is not a candidate", m.cfg.Name, id)
	}
	return c.InFlight, c.PendingPrefillBlocks, nil
}

// TestLoadBeaconReachesPeers: with states a minute apart, a request
// begun at an owner reaches a peer's candidates (in flight and pending
// prefill) and its end too, through beacons alone; LoadHeard moves on
// with them. A router of an older wire version in the same mesh is sent
// none (it would refuse them, a decode drop). Without beacons
// (LoadInterval 0) the peer still reads the load of the join.
func TestLoadBeaconReachesPeers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{
		{"beacons", TestTiming().LoadInterval},
		{"no beacons", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timing := func(c *Config) { slowStates(c); c.Timing.LoadInterval = tc.interval }
			old := wireRole
			a := newRouter(t, "a", timing)
			const id = "http://a-only:8000"
			a.DeclareReplica(id)
			a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 256})
			a.Record(id, chain(1, 4)) // a owns it: its push/pull carries the state
			b := newRouter(t, "b", func(c *Config) { timing(c); joining(a)(c) })
			c := newRouter(t, "c", func(c *Config) { timing(c); joining(a)(c); c.wire = &old })
			for _, r := range []*testRouter{a, b, c} {
				eventually(t, wait, "three members at "+r.cfg.Name, func() error {
					if n := members(r.Mesh); n != 3 {
						return fmt.Errorf("%d members", n)
					}
					return nil
				})
			}
			eventually(t, wait, "b knows a's replica, idle", func() error {
				f, p, err := loadAt(b.Mesh, id)
				if err == nil && (f != 0 || p != 0) {
					err = fmt.Errorf("load %d, %v", f, p)
				}
				return err
			})
			heard, _ := b.LoadHeard(id)
			firstByte, done := a.Begin(id, 4)
			// Bounded well under the minute a state would take.
			within := 5 * time.Second
			reached := func(what string, f0 int32, p0 float64) error {
				deadline := time.Now().Add(within)
				for {
					f, p, err := loadAt(b.Mesh, id)
					if err == nil && f == f0 && p == p0 {
						return nil
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("%s: b reads %d in flight, %v pending (%v)", what, f, p, err)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			err := reached("begun", 1, 4)
			if tc.interval == 0 {
				if err == nil {
					t.Fatal("the load reached b without beacons: the test shows nothing")
				}
				done()
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if at, ok := b.LoadHeard(id); !ok || !at.After(heard) {
				t.Fatalf("LoadHeard %v (%v), not after the join's %v", at, ok, heard)
			}
			firstByte()
			if err := reached("first byte", 1, 0); err != nil {
				t.Fatal(err)
			}
			done()
			if err := reached("done", 0, 0); err != nil {
				t.Fatal(err)
			}
			// c, at wireRole, knows the replica from the join but is sent
			// no beacon: nothing to refuse, nothing read.
			if f, p, err := loadAt(c.Mesh, id); err != nil || f != 0 || p != 0 {
				t.Fatalf("c reads %d, %v (%v)", f, p, err)
			}
			if n := testutil.ToFloat64(c.met.dropped.WithLabelValues(dropDecode)); n != 0 {
				t.Fatalf("c refused %v messages", n)
			}
			if n := testutil.ToFloat64(c.met.messages.WithLabelValues(kindName(kindLoad), "in")); n != 0 {
				t.Fatalf("c took %v beacons", n)
			}
			if n := testutil.ToFloat64(b.met.messages.WithLabelValues(kindName(kindLoad), "in")); n < 3 {
				t.Fatalf("b took %v beacons", n)
			}
		})
	}
}

// TestBeaconLoopIdle: an owner whose loads do not change runs no beacon
// tick at all (the ticker this loop replaced ran one every interval,
// reading the peers and the table each time), and a change wakes it.
// One router alone: no membership change can wake it either.
func TestBeaconLoopIdle(t *testing.T) {
	a := newRouter(t, "a", slowStates)
	const id = "http://a-only:8000"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 256})
	a.Record(id, chain(1, 4))
	interval := a.cfg.Timing.LoadInterval
	// The setup's wakes (ownership, summary) are taken within a tick or
	// two; a ticker never stops.
	n0, quiet := a.dis.beaconTicks.Load(), false
	for k := 0; k < 100 && !quiet; k++ {
		time.Sleep(10 * interval)
		n := a.dis.beaconTicks.Load()
		quiet, n0 = n == n0, n
	}
	if !quiet {
		t.Fatalf("beacon ticks still running after 1,000 intervals with no load change: %d", n0)
	}
	time.Sleep(100 * interval)
	if n := a.dis.beaconTicks.Load(); n != n0 {
		t.Fatalf("%d beacon ticks with no load change", n-n0)
	}
	_, done := a.Begin(id, 1)
	eventually(t, wait, "a tick after a load change", func() error {
		if n := a.dis.beaconTicks.Load(); n == n0 {
			return fmt.Errorf("%d ticks", n)
		}
		return nil
	})
	done()
}

// TestBeaconChangeDuringPause: a change that comes while the loop waits
// out the rest of an interval goes in the tick that ends the wait: with
// the loop held in its next wait, the peer reads it. (A loop that read
// the loads before waiting, or dropped the wakes that came meanwhile,
// would leave it unsent.)
func TestBeaconChangeDuringPause(t *testing.T) {
	var armed atomic.Bool
	paused, release, stop := make(chan time.Duration), make(chan struct{}), make(chan struct{})
	hold := func(d time.Duration) bool {
		if !armed.Load() {
			return true
		}
		select {
		case paused <- d:
		case <-stop:
			return false
		}
		select {
		case <-release:
			return true
		case <-stop:
			return false
		}
	}
	a := newRouter(t, "a", func(c *Config) {
		slowStates(c)
		c.Timing.LoadInterval = time.Hour // every wake after the first waits
		c.beaconPause = hold
	})
	const id = "http://a-only:8000"
	a.DeclareReplica(id)
	a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 256})
	a.Record(id, chain(1, 4))
	b := newRouter(t, "b", func(c *Config) { slowStates(c); joining(a)(c) })
	t.Cleanup(func() { close(stop) }) // before the routers close: a held loop lets go
	reads := func(f0 int32, p0 float64) func() error {
		return func() error {
			f, p, err := loadAt(b.Mesh, id)
			if err == nil && (f != f0 || p != p0) {
				err = fmt.Errorf("b reads %d in flight, %v pending", f, p)
			}
			return err
		}
	}
	eventually(t, wait, "b knows a's replica, idle", reads(0, 0))
	firstByte, done := a.Begin(id, 4)
	eventually(t, wait, "b reads the request", reads(1, 4)) // the loop not held yet
	armed.Store(true)
	firstByte()
	var d time.Duration
	select {
	case d = <-paused:
	case <-time.After(wait):
		t.Fatal("the beacon loop never waited out an interval")
	}
	if d <= 0 || d > time.Hour {
		t.Fatalf("waits %v of a one-hour interval", d)
	}
	done() // while the loop waits
	release <- struct{}{}
	// The loop may be held again (done's own wake): the tick that ended
	// the wait must have carried the change.
	eventually(t, wait, "b reads the end sent after the wait", reads(0, 0))
}

// TestBeaconPeers: beacons go to the live peers of wireLoad or later
// only, and a router below it sends none.
func TestBeaconPeers(t *testing.T) {
	m := bareMesh(t, "a")
	mem := m.mem
	for name, w := range map[string]wireVersion{"a": wireLatest, "new": wireLoad, "newer": wireLatest + 2, "old": wireRole, "base": wireBase} {
		mem.members[name] = &member{node: memberlist.Node{Name: name}, wire: w, alive: true}
	}
	mem.members["gone"] = &member{node: memberlist.Node{Name: "gone"}, wire: wireLatest}
	names := func(self wireVersion) map[string]bool {
		out := map[string]bool{}
		for _, n := range beaconPeers(mem, self, nil) {
			out[n.Name] = true
		}
		return out
	}
	if got, want := names(wireLatest), map[string]bool{"new": true, "newer": true}; !reflect.DeepEqual(got, want) {
		t.Fatalf("peers %v, want %v", got, want)
	}
	if got := names(wireRole); len(got) != 0 {
		t.Fatalf("a router of wire %d sends beacons to %v", wireRole, got)
	}
}

// TestBeaconOrdering drives a copy's load through states and beacons
// from its owner b: a beacon applies when b numbered it after the copy's
// last state and beacon, never otherwise; a state b numbered before an
// applied beacon does not set the load back, and is not refused as old
// for it (the states' own numbers are not the beacons'); a slim state
// after a beacon says the load is the last full state's. Beacons of
// another origin or boot, of unknown replicas or of replicas this router
// owns change nothing and create nothing. No beacon rebuilds the view.
func TestBeaconOrdering(t *testing.T) {
	m := bareMesh(t, "a")
	const x, own = "http://x:8000", "http://own:8000"
	m.tab.setRouter("a", true, nodeMeta{Region: "r1"})
	m.tab.setRouter("b", true, nodeMeta{Region: "r1"})
	m.tab.setRouter("c", true, nodeMeta{Region: "r1"})
	m.DeclareReplica(own)
	m.UpdateReplica(own, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 64})
	m.Record(own, chain(1, 2))
	full := func(seq uint64, inFlight uint32, pending float64) func() {
		return func() {
			st := stateMsg{header: header{Origin: "b", Boot: 1, Seq: seq}, Replica: x, Owned: true, Healthy: true,
				Epoch: 1, Version: 1, InFlight: inFlight, Pending: pending, Models: []string{"m"}}
			m.tab.mu.Lock()
			m.rep.handleStateLocked(&st, time.Now())
			m.tab.unlock()
		}
	}
	slim := func(seq uint64) func() {
		return func() {
			st := stateMsg{header: header{Origin: "b", Boot: 1, Seq: seq}, Replica: x, Owned: true, Healthy: true,
				Slim: true, Epoch: 1, Version: 1}
			m.tab.mu.Lock()
			m.rep.handleStateLocked(&st, time.Now())
			m.tab.unlock()
		}
	}
	beacon := func(origin string, boot, seq uint64, id string, inFlight uint32, milli uint64) func() {
		return func() {
			msg := loadMsg{header: header{Origin: origin, Boot: boot, Seq: seq},
				Entries: []loadEntry{{Replica: []byte(id), InFlight: inFlight, PendingMilli: milli}}}
			m.rep.handleMsg(msg.append(nil)) // through the decoder, as the inbox does
		}
	}
	m.tab.mu.RLock()
	ownLoad := m.tab.replicas[own].load
	m.tab.mu.RUnlock()
	ownLoad.inFlight.Store(3)
	steps := []struct {
		name     string
		do       func()
		inFlight int32
		pending  float64
		seq      uint64 // the copy's last state's number
	}{
		{"b's state", full(10, 1, 1), 1, 1, 10},
		{"a beacon before b's state", beacon("b", 1, 9, x, 7, 7000), 1, 1, 10},
		{"a beacon after it", beacon("b", 1, 20, x, 5, 2500), 5, 2.5, 10},
		{"an older beacon", beacon("b", 1, 15, x, 3, 0), 5, 2.5, 10},
		{"the same beacon again", beacon("b", 1, 20, x, 4, 0), 5, 2.5, 10},
		{"a state b sent before the beacon", full(12, 1, 1), 5, 2.5, 12},
		{"a slim state after the beacon", slim(25), 1, 1, 25},
		{"a beacon before the slim state", beacon("b", 1, 22, x, 6, 0), 1, 1, 25},
		{"a beacon after it", beacon("b", 1, 26, x, 6, 0), 6, 0, 25},
		{"a newer full state", full(30, 2, 0), 2, 0, 30},
		{"a beacon older than it", beacon("b", 1, 28, x, 9, 0), 2, 0, 30},
		{"a beacon of another boot", beacon("b", 2, 40, x, 9, 0), 2, 0, 30},
		{"a beacon of another origin", beacon("c", 1, 41, x, 9, 0), 2, 0, 30},
		{"a beacon of an unknown replica", beacon("b", 1, 42, "http://unknown:8000", 9, 0), 2, 0, 30},
		{"a beacon of a replica this router owns", beacon("b", 1, 43, own, 9, 0), 2, 0, 30},
		{"this router's own beacon", beacon("a", 1, 44, x, 9, 0), 2, 0, 30},
	}
	var views map[string]*modelView
	for i, s := range steps {
		s.do()
		f, p, err := loadAt(m, x)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if f != s.inFlight || p != s.pending {
			t.Fatalf("%s: load %d, %v, want %d, %v", s.name, f, p, s.inFlight, s.pending)
		}
		m.tab.mu.RLock()
		seq, n := m.tab.replicas[x].st.Seq, len(m.tab.replicas)
		_, unknown := m.tab.replicas["http://unknown:8000"]
		m.tab.mu.RUnlock()
		if seq != s.seq || n != 2 || unknown {
			t.Fatalf("%s: the copy's state is number %d (want %d), %d replicas", s.name, seq, s.seq, n)
		}
		if f, _, _ := loadAt(m, own); f != 3 {
			t.Fatalf("%s: the owned replica reads %d in flight", s.name, f)
		}
		if err := viewMismatch(m); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		m.view.mu.RLock()
		v := m.view.models
		m.view.mu.RUnlock()
		if i > 0 && reflect.ValueOf(v).Pointer() != reflect.ValueOf(views).Pointer() {
			t.Fatalf("%s: the view was rebuilt", s.name)
		}
		views = v
	}
	for o, want := range map[string]float64{beaconApplied: 2, beaconOld: 5, beaconIgnored: 4} {
		if got := testutil.ToFloat64(m.met.beacons.WithLabelValues(o)); got != want {
			t.Errorf("%s entries: %v, want %v", o, got, want)
		}
	}
}

// TestBeaconLoadHeard: LoadHeard is when the load the view reads came,
// a beacon's while it is the newer word.
func TestBeaconLoadHeard(t *testing.T) {
	m := bareMesh(t, "a")
	const x = "http://x:8000"
	m.tab.setRouter("b", true, nodeMeta{})
	st := stateMsg{header: header{Origin: "b", Boot: 1, Seq: 5}, Replica: x, Owned: true, Healthy: true, Epoch: 1, Models: []string{"m"}}
	m.tab.mu.Lock()
	m.rep.handleStateLocked(&st, time.Now())
	m.tab.unlock()
	stateAt, _ := m.LoadHeard(x)
	time.Sleep(2 * time.Millisecond) // two distinct clock readings
	msg := loadMsg{header: header{Origin: "b", Boot: 1, Seq: 11}, Entries: []loadEntry{{Replica: []byte(x), InFlight: 1}}}
	m.rep.handleLoad(&msg)
	if at, ok := m.LoadHeard(x); !ok || !at.After(stateAt) {
		t.Fatalf("after the beacon: %v (%v), the state's %v", at, ok, stateAt)
	}
	beaconAt, _ := m.LoadHeard(x)
	st.Seq = 8 // a state b sent before the beacon keeps the beacon's time
	m.tab.mu.Lock()
	m.rep.handleStateLocked(&st, time.Now())
	seq := m.tab.replicas[x].st.Seq
	m.tab.unlock()
	if at, _ := m.LoadHeard(x); seq != 8 || !at.Equal(beaconAt) {
		t.Fatalf("after an older state (taken: %v): %v, the beacon's %v", seq == 8, at, beaconAt)
	}
}

// TestBeaconPackets: an owner of 300 replicas of long IDs (about five to
// a packet) whose loads all changed
// sends at most maxBeaconPackets packets of at most maxBeaconBytes a
// tick, each decoding to loads that match the owner's, the rest in the
// next ticks until every replica went once; then nothing until a load
// moves, and then only that one.
func TestBeaconPackets(t *testing.T) {
	m := bareMesh(t, "a")
	m.tab.setRouter("a", true, nodeMeta{})
	const n = 300
	domain := strings.Repeat("d", 180)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://replica-%04d.%s:8000", i, domain)
		m.DeclareReplica(ids[i])
		m.UpdateReplica(ids[i], ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 16})
		m.Record(ids[i], chain(uint64(i), 1))
		_, _ = m.Begin(ids[i], float64(i%5)+0.5)
	}
	var s beaconSender
	var more bool // the last tick left loads out
	tick := func() map[string]loadEntry {
		var h header
		h, more = m.dis.collectLoads(&s)
		msgs := encodeBeacons(nil, h, s.outs, s.ends)
		if len(msgs) > maxBeaconPackets {
			t.Fatalf("%d packets", len(msgs))
		}
		got := map[string]loadEntry{}
		for _, b := range msgs {
			if len(b) > maxBeaconBytes {
				t.Fatalf("a packet of %d bytes", len(b))
			}
			v, err := decodeMsg(b, wireLatest)
			if err != nil {
				t.Fatal(err)
			}
			lm := v.(loadMsg)
			if lm.header != h {
				t.Fatalf("header %+v, want %+v", lm.header, h)
			}
			for _, e := range lm.Entries {
				if _, dup := got[string(e.Replica)]; dup {
					t.Fatalf("%s twice in a tick", e.Replica)
				}
				got[string(e.Replica)] = e
			}
		}
		return got
	}
	seen := map[string]bool{}
	ticks := 0
	for len(seen) < n {
		got := tick()
		if len(got) == 0 {
			t.Fatalf("tick %d sent nothing with %d replicas left", ticks, n-len(seen))
		}
		for id, e := range got {
			if seen[id] {
				t.Fatalf("%s sent again with no change", id)
			}
			seen[id] = true
			var i int
			if _, err := fmt.Sscanf(id, "http://replica-%04d.", &i); err != nil {
				t.Fatal(err)
			}
			if e.InFlight != 1 || e.PendingMilli != uint64(i%5)*1000+500 {
				t.Fatalf("%s: %+v", id, e)
			}
		}
		if more != (len(seen) < n) {
			// The loop wakes itself again on this (beaconLoop).
			t.Fatalf("tick %d says it left loads out: %v, with %d of %d sent", ticks, more, len(seen), n)
		}
		ticks++
	}
	if ticks < 2 {
		t.Fatalf("%d replicas in %d tick: the bound is not exercised", n, ticks)
	}
	if got := tick(); len(got) != 0 {
		t.Fatalf("%d loads sent with none changed", len(got))
	}
	_, done := m.Begin(ids[123], 0)
	got := tick()
	if e, ok := got[ids[123]]; len(got) != 1 || !ok || e.InFlight != 2 {
		t.Fatalf("after one change: %v", got)
	}
	done()
	if got := testutil.ToFloat64(m.met.beacons.WithLabelValues(beaconDeferred)); got == 0 {
		t.Fatal("no entry deferred")
	}
}

// TestBeaconDropsRatherThanWait: NotifyMsg drops a beacon at once when
// the inbox is full (it holds memberlist's packet handler), and counts it.
func TestBeaconDropsRatherThanWait(t *testing.T) {
	m := bareMesh(t, "a")
	d := &delegate{mem: m.mem, rep: m.rep}
	for range cap(m.rep.inbox) {
		m.rep.inbox <- []byte{kindLoad}
	}
	msg := loadMsg{header: header{Origin: "b", Boot: 1, Seq: 1}, Entries: []loadEntry{{Replica: []byte("http://x"), InFlight: 1}}}
	done := make(chan struct{})
	go func() {
		d.NotifyMsg(msg.append(nil))
		close(done)
	}()
	<-done // waits for ever (the test times out) if NotifyMsg holds on
	if got := testutil.ToFloat64(m.met.dropped.WithLabelValues(dropHandoffFull)); got != 1 {
		t.Fatalf("hand-off drops %v", got)
	}
}

// TestLoadIntervalValidated: a negative interval, or one under a
// millisecond, is refused; 0 turns beacons off.
func TestLoadIntervalValidated(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{{0, true}, {time.Millisecond, true}, {25 * time.Millisecond, true}, {-time.Millisecond, false}, {time.Microsecond, false}} {
		cfg := Config{Name: "a", Contract: summary.DefaultContract(), Timing: TestTiming()}
		cfg.Timing.LoadInterval = tc.d
		if err := cfg.validate(); (err == nil) != tc.ok {
			t.Errorf("LoadInterval %v: %v", tc.d, err)
		}
	}
	if LANTiming().LoadInterval <= 0 || LANTiming().LoadInterval >= LANTiming().StateInterval {
		t.Fatalf("the lan profile's load interval %v", LANTiming().LoadInterval)
	}
}

// TestWireLoad: a beacon round-trips; an older router refuses the kind;
// non-shortest varints, empty beacons, out-of-range counts and bad
// replica IDs are refused.
func TestWireLoad(t *testing.T) {
	msg := loadMsg{header: header{Origin: "a", Boot: 7, Seq: 9}, Entries: []loadEntry{
		{Replica: []byte("http://r:1"), InFlight: 3, PendingMilli: 1500},
		{Replica: []byte("http://r:2"), InFlight: 1 << 20, PendingMilli: maxPendingMilli},
	}}
	b := msg.append(nil)
	v, err := decodeMsg(b, wireLatest)
	if err != nil || !reflect.DeepEqual(v, msg) {
		t.Fatalf("decoded %+v, %v", v, err)
	}
	if _, err := decodeMsg(b, wireRole); err == nil {
		t.Fatal("a router of wireRole decodes a beacon")
	}
	hdr := msg.header.append(nil, kindLoad)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"no entries", append(append([]byte(nil), hdr...), 0)},
		{"a count padded", append(append([]byte(nil), hdr...), 0x81, 0x00, 1, 'x', 0, 0)},
		{"in flight padded", append(append([]byte(nil), hdr...), 1, 1, 'x', 0x80, 0x00, 0)},
		{"empty replica", append(append([]byte(nil), hdr...), 1, 0, 0, 0, 0)},
		{"in flight over 32 bits", append(append([]byte(nil), hdr...), 1, 1, 'x', 0x80, 0x80, 0x80, 0x80, 0x10, 0)},
		{"pending out of range", appendLoadEntry(append(append([]byte(nil), hdr...), 1), "x", 0, maxPendingMilli+1)},
		{"a count beyond the bytes", append(append([]byte(nil), hdr...), 100, 1, 'x', 0, 0)},
		{"truncated", b[:len(b)-1]},
		{"trailing", append(append([]byte(nil), b...), 0)},
		{"empty origin", (&loadMsg{Entries: msg.Entries}).append(nil)},
	} {
		if _, err := decodeMsg(tc.b, wireLatest); err == nil {
			t.Errorf("%s: decoded", tc.name)
		}
	}
	long := make([]byte, maxReplicaIDLen+1)
	if _, err := decodeMsg((&loadMsg{header: msg.header, Entries: []loadEntry{{Replica: long}}}).append(nil), wireLatest); err == nil {
		t.Error("a replica id over maxReplicaIDLen decoded")
	}
}

// FuzzDecodeLoad: a beacon decodes only from its one encoding, within
// its bounds, and applying what decodes to a router's table creates no
// replica.
func FuzzDecodeLoad(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	m := bareMesh(f, "a")
	m.tab.setRouter("b", true, nodeMeta{})
	st := stateMsg{header: header{Origin: "b", Boot: 7, Seq: 1}, Replica: "http://r:1", Owned: true, Healthy: true, Epoch: 1, Models: []string{"m"}}
	m.tab.mu.Lock()
	m.rep.handleStateLocked(&st, time.Now())
	m.tab.unlock()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeMsg(b, wireLatest)
		if err != nil {
			return
		}
		lm, ok := v.(loadMsg)
		if !ok {
			return
		}
		if out := lm.append(nil); string(out) != string(b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, out)
		}
		for _, e := range lm.Entries {
			if len(e.Replica) == 0 || len(e.Replica) > maxReplicaIDLen || e.PendingMilli > maxPendingMilli {
				t.Fatalf("entry out of bounds: %+v", e)
			}
		}
		m.rep.handleLoad(&lm)
		m.tab.mu.RLock()
		n := len(m.tab.replicas)
		m.tab.mu.RUnlock()
		if n != 1 {
			t.Fatalf("%d replicas after a beacon", n)
		}
	})
}

// BenchmarkApplyBeacon times a router applying one beacon of 64
// replicas' loads (each changed, so each entry is republished) to a
// table of 1,024 copies of one owner's replicas: "apply" is handleLoad
// on a decoded beacon, "decode+apply" the inbox's whole path from the
// packet's bytes.
func BenchmarkApplyBeacon(b *testing.B) {
	m := bareMesh(b, "a")
	m.tab.setRouter("b", true, nodeMeta{Region: "r1"})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://replica-%04d:8000", i)
		st := stateMsg{header: header{Origin: "b", Boot: 1, Seq: uint64(i + 1)}, Replica: ids[i], Owned: true, Healthy: true,
			Epoch: 1, Models: []string{"m"}}
		m.tab.mu.Lock()
		m.rep.handleStateLocked(&st, time.Now())
		m.tab.unlock()
	}
	if n := len(m.Candidates("m", nil)); n != 1024 {
		b.Fatalf("%d candidates", n)
	}
	beacon := func(seq uint64) *loadMsg {
		msg := &loadMsg{header: header{Origin: "b", Boot: 1, Seq: seq}}
		for k := range 64 {
			i := (int(seq)*64 + k) % len(ids)
			msg.Entries = append(msg.Entries, loadEntry{Replica: []byte(ids[i]), InFlight: uint32(seq % 7), PendingMilli: seq % 5 * 1000})
		}
		return msg
	}
	const pre = 1 << 12 // a cycle of beacons, each newer than the last
	b.Run("apply", func(b *testing.B) {
		msgs := make([]*loadMsg, pre)
		for i := range msgs {
			msgs[i] = beacon(uint64(2000 + i))
		}
		seq := uint64(1 << 20)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			msg := msgs[i%pre]
			seq++
			msg.Seq = seq
			m.rep.handleLoad(msg)
			i++
		}
	})
	b.Run("decode+apply", func(b *testing.B) {
		raw := make([][]byte, pre)
		for i := range raw {
			raw[i] = beacon(uint64(2000 + i)).append(nil)
		}
		at := 1 + 1 + len("b") + 8 // the sequence number's offset
		seq := uint64(1 << 30)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			p := raw[i%pre]
			seq++
			binary.BigEndian.PutUint64(p[at:], seq)
			m.rep.handleMsg(p)
			i++
		}
		if got := testutil.ToFloat64(m.met.beacons.WithLabelValues(beaconApplied)); got == 0 {
			b.Fatal("nothing applied")
		}
	})
}

// BenchmarkBeaconTick times an owner of 1,024 replicas reading their
// loads and encoding the beacon of the 64 that changed (sending aside).
func BenchmarkBeaconTick(b *testing.B) {
	m := bareMesh(b, "a")
	m.tab.setRouter("a", true, nodeMeta{})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://replica-%04d:8000", i)
		m.DeclareReplica(ids[i])
		m.UpdateReplica(ids[i], ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 16})
		m.Record(ids[i], chain(uint64(i), 1))
	}
	var s beaconSender
	for m.dis.collectLoads(&s); len(s.outs) > 0; m.dis.collectLoads(&s) {
	} // every load sent once
	loads := make([]*replicaLoad, len(ids))
	m.tab.mu.RLock()
	for i, id := range ids {
		loads[i] = m.tab.replicas[id].load
	}
	m.tab.mu.RUnlock()
	var msgs [][]byte
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		for k := range 64 {
			loads[(i*64+k)%len(ids)].inFlight.Add(1) // as Begin counts
		}
		h, _ := m.dis.collectLoads(&s)
		msgs = encodeBeacons(msgs[:0], h, s.outs, s.ends)
		if len(s.outs) != 64 {
			b.Fatalf("%d loads sent", len(s.outs))
		}
		i++
	}
}

// BenchmarkLoadVisibility times how long a request begun (and then
// ended) at an owner takes to show in a peer's candidates, with the lan
// profile's timings (states every 200 ms), with load beacons at the
// profile's interval and without; it reports the p50 and p99 in µs.
// Each change comes at a random point of the intervals. Run with
// -benchtime 100x or so: each iteration waits for two changes.
func BenchmarkLoadVisibility(b *testing.B) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"beacons", LANTiming().LoadInterval}, {"states only", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			timing := func(c *Config) { c.Timing = LANTiming(); c.Timing.LoadInterval = tc.interval }
			a := newRouter(b, "a", timing)
			const id = "http://a-only:8000"
			a.DeclareReplica(id)
			a.UpdateReplica(id, ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: 256})
			a.Record(id, chain(1, 4))
			p := newRouter(b, "b", func(c *Config) { timing(c); joining(a)(c) })
			eventually(b, wait, "b knows a's replica", func() error { _, _, err := loadAt(p.Mesh, id); return err })
			lat := newLatencies()
			until := func(want int32) {
				t0 := time.Now()
				for {
					if f, _, err := loadAt(p.Mesh, id); err == nil && f == want {
						lat.add(time.Since(t0))
						return
					}
					if time.Since(t0) > wait {
						b.Fatalf("b never read %d in flight", want)
					}
					time.Sleep(500 * time.Microsecond)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			phase := func() { time.Sleep(time.Duration(rng.Int64N(int64(LANTiming().StateInterval)))) }
			for b.Loop() {
				phase() // a change at any point of the intervals, not just after a tick
				_, done := a.Begin(id, 1)
				until(1)
				phase()
				done()
				until(0)
			}
			lat.reportAs(b, "")
		})
	}
}
