package mesh

import (
	"encoding/hex"
	"fmt"
	"github.com/kvmesh/kvmesh/route"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func sampleMessages(t testing.TB) [][]byte {
	st := sampleState()
	s, err := summary.New(summary.Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 3)
	if err != nil {
		t.Fatal(err)
	}
	s.Add([]uint64{1, 2, 3, 4})
	delta, _, _ := s.AppendDelta(nil, 0)
	sum := s.AppendEncode(nil, summary.DefaultContract().Fingerprint())
	withdrawn := stateMsg{header: header{Origin: "a", Boot: 7, Seq: 11}, Replica: "http://r:2", Withdrawn: true}
	b := batchMsg{header: header{Origin: "a", Boot: 7, Seq: 10}, Entries: []batchEntry{
		{State: st, Kind: payloadDelta, Payload: delta},
		{State: st, Kind: payloadFull, Payload: sum},
		{State: withdrawn},
	}}
	pp := []byte{kindPushPull}
	pp = appendS8(pp, "a")
	pp = append(pp, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1)
	pp = appendStateWithSummary(pp, &st, sum)
	noLoad := st
	noLoad.Engine = route.EngineLoad{Slots: 8}
	withEngine := st
	withEngine.EngineWire = true
	prefill, decode := withEngine, st
	prefill.Role, prefill.Bootstrap = route.RolePrefill, 8998
	decode.Role = route.RoleDecode
	withLoRA := withEngine
	withLoRA.LoRA = route.MakeLoRAs(2, []string{"m1"}, []string{"m4"}, []string{"m2"}, []string{"m3"})
	nb := batchMsg{header: header{Origin: "a", Boot: 7, Seq: 12}, Entries: []batchEntry{{State: noLoad, Kind: payloadDelta, Payload: delta}}}
	npp := appendS8([]byte{kindPushPull}, "a")
	npp = append(npp, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2)
	npp = appendStateWithSummary(npp, &noLoad, sum)
	npp = appendStateWithSummary(npp, &st, nil)
	return [][]byte{
		st.append(nil),
		b.append(nil),
		fullReq{Origin: "b", Replica: "http://r:1"}.append(nil),
		pp,
		nodeMeta{Region: "eu", API: "http://a:8080", Contract: summary.DefaultContract().ID()}.encode(),
		noLoad.append(nil),
		nb.append(nil),
		npp,
		withEngine.append(nil),
		withLoRA.append(nil),
		usageMsg{Origin: "a", Boot: 7, Payload: []byte{1, 2, 3}}.append(nil),
		prefill.append(nil),
		decode.append(nil),
		(&loadMsg{header: header{Origin: "a", Boot: 7, Seq: 13}, Entries: []loadEntry{
			{Replica: []byte("http://r:1"), InFlight: 2, PendingMilli: 1500}, {Replica: []byte("http://r:2"), InFlight: 300}}}).append(nil),
	}
}

func sampleState() stateMsg {
	return stateMsg{header: header{Origin: "a", Boot: 7, Seq: 9}, Replica: "http://r:1", Owned: true, Healthy: true,
		Capacity: 2048, Epoch: 3, Version: 4, Digest: 5, InFlight: 2, Pending: 1.5, Engine: route.EngineLoad{Running: 3, Waiting: 1, Slots: 8, HasLoad: true},
		Models: []string{"m1", "m2"}, DeclaredBy: []string{"a", "b"}}
}

func TestWireRoundTrip(t *testing.T) {
	msgs := sampleMessages(t)
	tests := []struct {
		name string
		b    []byte
		want any
	}{
		{"state", msgs[0], sampleState()},
		{"full request", msgs[2], fullReq{Origin: "b", Replica: "http://r:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeMsg(tc.b, wireLatest)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	v, err := decodeMsg(msgs[1], wireLatest)
	if err != nil {
		t.Fatal(err)
	}
	b := v.(batchMsg)
	if b.Origin != "a" || len(b.Entries) != 3 || !reflect.DeepEqual(b.Entries[0].State, sampleState()) ||
		b.Entries[0].Kind != payloadDelta || b.Entries[1].Kind != payloadFull || !b.Entries[2].State.Withdrawn {
		t.Fatalf("batch %+v", b)
	}
	if _, err := summary.DecodeDelta(b.Entries[0].Payload); err != nil {
		t.Fatalf("batch delta: %v", err)
	}
	if _, err := summary.Decode(b.Entries[1].Payload, summary.DefaultContract().Fingerprint()); err != nil {
		t.Fatalf("batch full summary: %v", err)
	}
	p, err := decodePushPull(msgs[3], wireLatest)
	if err != nil || p.Origin != "a" || p.Boot != 7 || len(p.Entries) != 1 {
		t.Fatalf("push/pull %+v %v", p, err)
	}
	m, err := decodeMeta(msgs[4])
	if err != nil || m.Region != "eu" || m.API != "http://a:8080" {
		t.Fatalf("meta %+v %v", m, err)
	}
	// Protocol 1's kinds are refused.
	for _, kind := range []byte{2, 4} {
		if _, err := decodeMsg([]byte{kind, 1, 'a'}, wireLatest); err == nil {
			t.Fatalf("kind %d decoded", kind)
		}
	}
}

// goldenState is sampleState() as the encoder wrote it before flagNoLoad
// (main at be3583b): what every router up to then decodes.
const goldenState = "01016100000000000000070000000000000009000a687474703a2f2f723a310300000000000000030000000000000004" +
	"000008000000000000000005000000023ff800000000000000000003000000010000000802026d31026d320201610162"

// TestWireNoLoad: an owner's state whose engine publishes no load counts
// round-trips with NoLoad; a state whose counts are known is encoded
// byte for byte as at wire version 0, so older routers read it as they
// always did, and this decoder reads their states as load known; the
// flag differs from such a state in that bit only (the one older routers
// refuse), and it is refused where no load is carried.
func TestWireNoLoad(t *testing.T) {
	known := sampleState()
	if got := hex.EncodeToString(known.append(nil)); got != goldenState {
		t.Fatalf("a state with known load is encoded\n%s\nwant, as before the flag,\n%s", got, goldenState)
	}
	old, err := hex.DecodeString(goldenState)
	if err != nil {
		t.Fatal(err)
	}
	v, err := decodeMsg(old, wireLatest)
	if err != nil {
		t.Fatalf("an older router's state: %v", err)
	}
	if st := v.(stateMsg); !st.Engine.HasLoad || !reflect.DeepEqual(st, known) {
		t.Fatalf("an older router's state decodes to %+v, want %+v (load known)", st, known)
	}

	none := known
	none.Engine.HasLoad = false
	b := none.append(nil)
	v, err = decodeMsg(b, wireLatest)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v, none) {
		t.Fatalf("got %+v\nwant %+v", v, none)
	}
	diff := 0
	for i := range b {
		if b[i] != old[i] {
			diff++
			if b[i]^old[i] != flagNoLoad {
				t.Fatalf("byte %d: %#x, want %#x with flagNoLoad", i, b[i], old[i])
			}
		}
	}
	if len(b) != len(old) || diff != 1 {
		t.Fatalf("%d bytes differ (lengths %d, %d), want the flags byte only", diff, len(b), len(old))
	}
	// A router before the flag (wireBase) reads the older state and
	// refuses the flag, as the routers before versioning do; for it, the
	// state is encoded without the flag: the older bytes.
	if v, err := decodeMsg(old, wireBase); err != nil || !reflect.DeepEqual(v, known) {
		t.Fatalf("the older state at wireBase: %+v %v", v, err)
	}
	if _, err := decodeMsg(b, wireBase); err == nil {
		t.Fatal("a router before the flag decodes it")
	}
	if ob := none.at(wireBase); hex.EncodeToString(ob.append(nil)) != goldenState {
		t.Fatalf("the state for a router before the flag is not the older bytes")
	}
	// In a batch and a push/pull too.
	bm := batchMsg{header: header{Origin: "a", Boot: 7, Seq: 10}, Entries: []batchEntry{{State: none}, {State: known}}}
	v, err = decodeMsg(bm.append(nil), wireLatest)
	if err != nil || v.(batchMsg).Entries[0].State.Engine.HasLoad || !v.(batchMsg).Entries[1].State.Engine.HasLoad {
		t.Fatalf("batch %+v %v", v, err)
	}
	pp := appendS8([]byte{kindPushPull}, "a")
	pp = append(pp, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1)
	pp = appendStateWithSummary(pp, &none, nil)
	if p, err := decodePushPull(pp, wireLatest); err != nil || len(p.Entries) != 1 || p.Entries[0].State.Engine.HasLoad {
		t.Fatalf("push/pull %+v %v", p, err)
	}

	// Only an owner's full state carries load.
	for _, tc := range []struct {
		name string
		st   stateMsg
	}{
		{"declaration", stateMsg{header: known.header, Replica: known.Replica}},
		{"slim", stateMsg{header: known.header, Replica: known.Replica, Owned: true, Slim: true}},
	} {
		for _, f := range []byte{flagNoLoad, flagEngine} {
			if _, err := decodeMsg(withFlags(tc.st, f), wireLatest); err == nil {
				t.Fatalf("%s with flags %#x decoded", tc.name, f)
			}
		}
	}
	if _, err := decodeMsg(withFlags(none, flagEngine), wireLatest); err == nil {
		t.Fatal("flagNoLoad with flagEngine decoded")
	}
}

// withFlags is st encoded with f set in its flags byte as well.
func withFlags(st stateMsg, f byte) []byte {
	b := st.append(nil)
	b[1+1+len(st.Origin)+16+2+len(st.Replica)] |= f
	return b
}

// TestWireEngine: an owner's state with the engine section (flagEngine)
// round-trips at wireEngine, a decoder before it refuses it, and the
// state for such a router is the counts with flagNoLoad, byte for byte
// what it always read (the golden state, for the sample's counts); the
// section's own fields (route.EngineLoad) reach only routers that read
// it.
func TestWireEngine(t *testing.T) {
	st := sampleState()
	st.EngineWire = true
	b := st.append(nil)
	v, err := decodeMsg(b, wireLatest)
	if err != nil || !reflect.DeepEqual(v, st) {
		t.Fatalf("got %+v %v\nwant %+v", v, err, st)
	}
	for _, old := range []wireVersion{wireBase, wireNoLoad} {
		if _, err := decodeMsg(b, old); err == nil {
			t.Fatalf("a decoder of version %d reads flagEngine", old)
		}
		ob := st.at(old)
		if got := hex.EncodeToString(ob.append(nil)); got != goldenState {
			t.Fatalf("the state for version %d is\n%s\nwant\n%s", old, got, goldenState)
		}
	}
	// Unknown load: the section says it (no counts), and a router before
	// flagEngine gets flagNoLoad, or before that the zero counts.
	st.Engine = route.EngineLoad{Slots: 8}
	if v, err := decodeMsg(st.append(nil), wireLatest); err != nil || v.(stateMsg).Engine != st.Engine {
		t.Fatalf("no load: %+v %v", v, err)
	}
	if ob := st.at(wireNoLoad); !ob.noLoad() || ob.EngineWire {
		t.Fatalf("no load for wireNoLoad: %+v", ob)
	}
	if ob := st.at(wireBase); ob.noLoad() || !ob.Engine.HasLoad || ob.Engine.Running != 0 {
		t.Fatalf("no load for wireBase: %+v", ob)
	}
}

// TestWireRole: a replica's role (flagRole) round-trips at wireRole, a
// decoder before it refuses it, and the state for such a router is the
// state without it, byte for byte what it always read; a whole replica's
// state carries no flag and no section (its bytes are those of every
// version before), and a section that says nothing or what no version
// knows is refused.
func TestWireRole(t *testing.T) {
	for _, tc := range []struct {
		role      route.Role
		bootstrap uint16
		engine    bool
	}{
		{route.RolePrefill, 8998, true},
		{route.RolePrefill, 0, false},
		{route.RoleDecode, 0, true},
	} {
		st := sampleState()
		st.EngineWire, st.Role, st.Bootstrap = tc.engine, tc.role, tc.bootstrap
		b := st.append(nil)
		v, err := decodeMsg(b, wireLatest)
		if err != nil || !reflect.DeepEqual(v, st) {
			t.Fatalf("%v: got %+v %v\nwant %+v", tc, v, err, st)
		}
		if st.needs() != wireRole {
			t.Fatalf("%v needs version %d", tc, st.needs())
		}
		for _, old := range []wireVersion{wireBase, wireNoLoad, wireEngine, wireUsage} {
			if _, err := decodeMsg(b, old); err == nil {
				t.Fatalf("a decoder of version %d reads flagRole", old)
			}
			ob := st.at(old)
			got, err := decodeMsg(ob.append(nil), old)
			if err != nil || got.(stateMsg).Role != route.RoleBoth || got.(stateMsg).Bootstrap != 0 {
				t.Fatalf("the state for version %d reads %+v %v", old, got, err)
			}
		}
		withoutRole := st
		withoutRole.Role, withoutRole.Bootstrap = route.RoleBoth, 0
		got, want := st.at(wireUsage), withoutRole.at(wireUsage)
		if string(got.append(nil)) != string(want.append(nil)) {
			t.Fatalf("%v at wireUsage:\n%x\nwant the state without a role\n%x", tc, got.append(nil), want.append(nil))
		}
	}
	whole := sampleState()
	if whole.hasRole() || whole.needs() != wireBase {
		t.Fatal("a whole replica's state carries a role")
	}
	if got := hex.EncodeToString(whole.append(nil)); got != goldenState {
		t.Fatalf("a whole replica's state changed:\n%s\nwant\n%s", got, goldenState)
	}
	// A section with nothing to say, a role no version knows, a port
	// of a replica that is no prefill one, a slim state's: refused.
	sample := sampleState()
	base := sample.append(nil)
	const flagAt = 1 + 2 + 8 + 8 + 2 + 10 // kind, origin "a", boot, seq, replica "http://r:1"
	for _, sec := range [][]byte{{0, 0, 0}, {3, 0, 0}, {byte(route.RoleDecode), 0x23, 0x26}, {byte(route.RoleBoth), 0x23, 0x26}} {
		b := withRoleSection(t, base, flagAt, sec)
		if _, err := decodeMsg(b, wireLatest); err == nil {
			t.Fatalf("role section %x decodes", sec)
		}
	}
	b := withRoleSection(t, base, flagAt, []byte{byte(route.RoleDecode), 0, 0})
	if v, err := decodeMsg(b, wireLatest); err != nil || v.(stateMsg).Role != route.RoleDecode {
		t.Fatalf("the hand-made decode section: %+v %v (the test's offsets are wrong)", v, err)
	}
	slim := sampleState()
	slim.Slim = true
	sb := slim.append(nil)
	sb[flagAt] |= flagRole
	if _, err := decodeMsg(sb, wireLatest); err == nil {
		t.Fatal("a slim state with flagRole decodes")
	}
}

// withRoleSection is the encoded sample state b with flagRole set (its
// flags at flagAt) and sec inserted after the engine's counts.
func withRoleSection(t *testing.T, b []byte, flagAt int, sec []byte) []byte {
	t.Helper()
	out := append([]byte(nil), b...)
	if out[flagAt] != flagOwned|flagHealthy {
		t.Fatalf("flags at %d are %#x: the test's offsets are wrong", flagAt, out[flagAt])
	}
	out[flagAt] |= flagRole
	// The sample's models and declarers (1+3+3, 1+2+2 bytes) end it.
	at := len(out) - (1 + 3 + 3 + 1 + 2 + 2)
	return append(append(append([]byte(nil), out[:at]...), sec...), out[at:]...)
}

// Every strict prefix of a valid message is an error, never a panic.
func TestWireTruncated(t *testing.T) {
	for i, b := range sampleMessages(t) {
		for n := 0; n < len(b); n++ {
			_, e1 := decodeMsg(b[:n], wireLatest)
			_, e2 := decodePushPull(b[:n], wireLatest)
			_, e3 := decodeMeta(b[:n])
			if e1 == nil && e2 == nil && e3 == nil {
				t.Fatalf("message %d truncated to %d bytes decoded", i, n)
			}
		}
	}
}

// Garbage and truncated messages fed to a live router's delegate never
// panic, and each one that does not decode is counted exactly once.
func TestDelegateGarbage(t *testing.T) {
	a := newRouter(t, "a", nil)
	declare(a, "http://r:1")
	d := &delegate{mem: a.mem, rep: a.rep}
	fp := summary.DefaultContract().Fingerprint()
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := sampleMessages(t)
	// bad counts what the mesh must count as undecodable: the message, or
	// a full summary inside a message that decodes.
	badSum := func(st stateMsg, sum []byte, origin string) bool {
		if len(sum) == 0 || st.Origin == a.cfg.Name || (origin != "" && st.Origin != origin) {
			return false
		}
		_, err := summary.Decode(sum, fp)
		return err != nil
	}
	badMsg := func(b []byte) int {
		v, err := decodeMsg(b, wireLatest)
		if err != nil {
			return 1
		}
		n := 0
		if b, ok := v.(batchMsg); ok && b.Origin != a.cfg.Name {
			for _, e := range b.Entries {
				switch e.Kind {
				case payloadFull:
					if badSum(e.State, e.Payload, "") {
						n++
					}
				case payloadDelta:
					if _, err := summary.DecodeDelta(e.Payload); err != nil {
						n++
					}
				}
			}
		}
		return n
	}
	badPushPull := func(b []byte) int {
		p, err := decodePushPull(b, wireLatest)
		if err != nil {
			return 1
		}
		n := 0
		for _, e := range p.Entries {
			if badSum(e.State, e.Summary, p.Origin) {
				n++
			}
		}
		return n
	}
	garbage := func(i int) []byte {
		b := append([]byte(nil), msgs[i%len(msgs)]...)
		switch i % 3 {
		case 0:
			b = b[:rng.IntN(len(b)+1)]
		case 1:
			for j := 0; j < 1+rng.IntN(4); j++ {
				b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
			}
		default:
			b = make([]byte, rng.IntN(64))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
		}
		return b
	}
	decodeDrops := func() float64 { return testutil.ToFloat64(a.met.dropped.WithLabelValues(dropDecode)) }
	base := decodeDrops()
	want := 0
	for i := 0; i < 2000; i++ {
		b := garbage(i)
		a.rep.handleMsg(b)
		d.MergeRemoteState(b, i%2 == 0)
		want += badMsg(b) + badPushPull(b)
	}
	if want == 0 {
		t.Fatal("the garbage all decoded: the test tests nothing")
	}
	if got := decodeDrops() - base; got != float64(want) {
		t.Fatalf("decode drops = %v, want %d", got, want)
	}
	// Through memberlist's entry point: handed to the inbox, then counted.
	for i := 0; i < 200; i++ {
		b := garbage(i)
		d.NotifyMsg(b)
		if len(b) > 0 {
			want += badMsg(b)
		}
	}
	eventually(t, wait, "inbox messages counted", func() error {
		if got := decodeDrops() - base; got != float64(want) {
			return fmt.Errorf("decode drops = %v, want %d", got, want)
		}
		return nil
	})
	if got := testutil.ToFloat64(a.met.dropped.WithLabelValues(dropHandoffFull)); got != 0 {
		t.Fatalf("hand-off drops = %v with a near-empty inbox", got)
	}
}

func FuzzDecodeMsg(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// What an older version decodes, a newer one decodes the same.
		vb, errBase := decodeMsg(b, wireBase)
		v, err := decodeMsg(b, wireLatest)
		if errBase == nil && (err != nil || !reflect.DeepEqual(vb, v)) {
			t.Fatalf("decoded at wireBase as %+v, at wireLatest as %+v, %v", vb, v, err)
		}
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes (the format has no
		// slack a sender could hide data in).
		var out []byte
		switch m := v.(type) {
		case stateMsg:
			out = m.append(nil)
		case batchMsg:
			out = m.append(nil)
		case fullReq:
			out = m.append(nil)
		case usageMsg:
			out = m.append(nil)
		case loadMsg:
			out = m.append(nil)
		}
		if string(out) != string(b) {
			// The engine section's tags this router does not know are
			// skipped (route.EngineLoad.DecodeWire): the one place a
			// state re-encodes shorter, to what decodes the same.
			again, err := decodeMsg(out, wireLatest)
			if !engineSection(v) || len(out) >= len(b) || err != nil || !reflect.DeepEqual(again, v) {
				t.Fatalf("re-encoding differs:\n%x\n%x", b, out)
			}
		}
	})
}

// engineSection reports that a decoded message holds a state with the
// engine section.
func engineSection(v any) bool {
	switch m := v.(type) {
	case stateMsg:
		return m.EngineWire
	case batchMsg:
		for _, e := range m.Entries {
			if e.State.EngineWire {
				return true
			}
		}
	}
	return false
}

func FuzzDecodePushPull(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	fp := summary.DefaultContract().Fingerprint()
	f.Fuzz(func(t *testing.T, b []byte) {
		pb, errBase := decodePushPull(b, wireBase)
		p, err := decodePushPull(b, wireLatest)
		if errBase == nil && (err != nil || !reflect.DeepEqual(pb, p)) {
			t.Fatalf("decoded at wireBase as %+v, at wireLatest as %+v, %v", pb, p, err)
		}
		if err != nil {
			return
		}
		for _, e := range p.Entries {
			_, _ = summary.Decode(e.Summary, fp)
		}
	})
}

// FuzzBatchPayloads feeds batch payloads to the summary decoders the mesh
// calls on them.
func FuzzBatchPayloads(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	fp := summary.DefaultContract().Fingerprint()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeMsg(b, wireLatest)
		if err != nil {
			return
		}
		if bm, ok := v.(batchMsg); ok {
			for _, e := range bm.Entries {
				if d, err := summary.DecodeDelta(e.Payload); err == nil {
					if s, err := summary.New(summary.Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, d.Epoch); err == nil {
						_ = s.ApplyDelta(d)
					}
				}
				_, _ = summary.Decode(e.Payload, fp)
			}
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err == nil && string(m.encode()) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestWireEngineSkipsNewerFields: a state whose engine section carries a
// tag this router does not know (a field a newer router added) decodes,
// with the fields it knows; that is what lets a field reach the routers
// that know it without a new wire version.
func TestWireEngineSkipsNewerFields(t *testing.T) {
	st := sampleState()
	st.EngineWire = true
	b := st.append(nil)
	at := 1 + 1 + len(st.Origin) + 16 + 2 + len(st.Replica) + 1 + 16 + 4 + 8 + 4 + 8 // the section's length byte
	var l route.EngineLoad
	n, err := l.DecodeWire(b[at:])
	if err != nil || l != st.Engine {
		t.Fatalf("the section is not at byte %d: %+v %v", at, l, err)
	}
	newer := append([]byte(nil), b[:at]...)
	newer = append(newer, b[at]+3)
	newer = append(newer, b[at+1:at+n]...)
	newer = append(newer, 200, 0xAC, 0x02) // tag 200, varint 300
	newer = append(newer, b[at+n:]...)
	v, err := decodeMsg(newer, wireLatest)
	if err != nil || !reflect.DeepEqual(v, st) {
		t.Fatalf("a newer router's state: %+v %v\nwant %+v", v, err, st)
	}
}

// TestWireLoRA: a replica's LoRA adapters ride in the engine section: a
// router of this version reads them back, a router before flagEngine
// gets the state it always got (without them), and a router of
// wireEngine that does not know their tags (EngineLoad.DecodeWire)
// reads the section's load and ends it where it ends, so the models
// after it decode as before.
func TestWireLoRA(t *testing.T) {
	st := sampleState()
	st.EngineWire = true
	st.LoRA = route.MakeLoRAs(2, []string{"m1"}, nil, []string{"m2"}, nil)
	b := st.append(nil)
	v, err := decodeMsg(b, wireLatest)
	if err != nil || !reflect.DeepEqual(v, st) {
		t.Fatalf("got %+v %v\nwant %+v", v, err, st)
	}
	for _, old := range []wireVersion{wireBase, wireNoLoad} {
		if ob := st.at(old); ob.LoRA != (route.LoRAs{}) || hex.EncodeToString(ob.append(nil)) != goldenState {
			t.Fatalf("the state for version %d carries LoRA: %+v", old, ob)
		}
	}
	at := 1 + 1 + len(st.Origin) + 16 + 2 + len(st.Replica) + 1 + 16 + 4 + 8 + 4 + 8 // the section's length byte
	var l route.EngineLoad
	n, err := l.DecodeWire(b[at:])
	if err != nil || l != st.Engine || n != 1+int(b[at]) {
		t.Fatalf("an older router reads the section as %+v (%d bytes), %v", l, n, err)
	}
	without := st
	without.LoRA = route.LoRAs{}
	wb := without.append(nil)
	if string(b[at+n:]) != string(wb[at+1+int(wb[at]):]) {
		t.Fatalf("what follows the section differs with LoRA")
	}
}
