package route

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
)

// TestMakeLoRAs: base models are told from adapters, loaded (running
// ones first, then most recent) up to the limit, waiting adapters marked,
// in use and resident counted once; the limit is room until it is in
// use, and a free slot until it is loaded; what Forget keeps is what the
// engine is configured with.
func TestMakeLoRAs(t *testing.T) {
	a := MakeLoRAs(2, []string{"base"}, []string{"chat", "med"}, []string{"sql"}, []string{"chat", "legal"})
	if a.Max != 2 || a.Active != 3 || a.Resident != 2 || a.Len() != 4 {
		t.Fatalf("%+v: max %d active %d resident %d entries %d", a, a.Max, a.Active, a.Resident, a.Len())
	}
	fits := map[string]LoRAFit{
		"base":  0,
		"sql":   LoRAAdapter | LoRAResident,
		"chat":  LoRAAdapter | LoRAResident | LoRAWaiting,
		"legal": LoRAAdapter | LoRAWaiting,
		"med":   LoRAAdapter, // past the limit: not loaded; 3 in use of 2: no room
		"other": LoRAAdapter,
	}
	for name, want := range fits {
		if got := a.Fit(LoRAID(name)); got != want {
			t.Errorf("%s: fit %05b, want %05b", name, got, want)
		}
	}
	for _, tc := range []struct {
		a    LoRAs
		want LoRAFit
	}{
		{MakeLoRAs(4, []string{"base"}, []string{"sql"}, nil, nil), LoRAAdapter | LoRARoom | LoRAFree},
		{MakeLoRAs(2, []string{"base"}, []string{"sql", "chat"}, nil, nil), LoRAAdapter | LoRARoom}, // loading it evicts an idle one
		{MakeLoRAs(0, []string{"base"}, nil, nil, nil), LoRAAdapter | LoRARoom | LoRAFree},          // an unknown limit
	} {
		if got := tc.a.Fit(LoRAID("other")); got != tc.want {
			t.Errorf("%+v: fit %05b, want %05b", tc.a, got, tc.want)
		}
	}
	if (LoRAs{}).Fit(LoRAID("x")) != 0 || MakeLoRAs(0, nil, nil, nil, nil) != (LoRAs{}) {
		t.Errorf("an engine that tells nothing of LoRA is a base model's")
	}
	// The same names, in another order where order does not matter, are
	// the same value.
	if b := MakeLoRAs(2, []string{"base"}, []string{"chat", "med", "chat"}, []string{"sql"}, []string{"legal", "chat", "legal"}); b != a {
		t.Errorf("order changed the value: %+v != %+v", b, a)
	}
	f := a.Forget()
	if f.Max != 2 || f.Active != 0 || f.Resident != 0 || f.Fit(LoRAID("base")) != 0 || f.Fit(LoRAID("sql")) != LoRAAdapter|LoRARoom|LoRAFree {
		t.Errorf("forget: %+v", f)
	}
	loaded, waiting := a.Named([]string{"base", "chat", "legal", "med", "nobody", "sql"})
	if !slices.Equal(loaded, []string{"chat", "sql"}) || !slices.Equal(waiting, []string{"chat", "legal"}) {
		t.Errorf("named: loaded %v waiting %v", loaded, waiting)
	}
}

// TestMakeLoRAsBounds: a replica's entries stay bounded whatever its
// engine names, base models first, running before the other loaded and
// before waiting, and the counts stay whole.
func TestMakeLoRAsBounds(t *testing.T) {
	names := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}
	a := MakeLoRAs(64, names("base", 10), names("loaded", 30), names("run", 20), names("wait", 30))
	if a.Len() != MaxLoRAEntries || a.Active != 50 || a.Resident != 50 {
		t.Fatalf("entries %d active %d resident %d", a.Len(), a.Active, a.Resident)
	}
	for _, b := range names("base", maxLoRABases) {
		if a.Fit(LoRAID(b)) != 0 {
			t.Errorf("base %s lost", b)
		}
	}
	for _, w := range append(names("wait", 30), names("loaded", 30)...) {
		if a.Fit(LoRAID(w))&(LoRAWaiting|LoRAResident) != 0 {
			t.Errorf("%s kept while running ones were dropped", w)
		}
	}
}

// TestEngineWireCarriesLoRAs: LoRAs round-trip in the engine section
// after the load, the section fits its length byte at the bounds, and a
// router that does not know LoRAs (EngineLoad.DecodeWire, the reading of
// every router before them) reads the load alone, byte for byte where
// the section ends.
func TestEngineWireCarriesLoRAs(t *testing.T) {
	var many []string
	for i := range 100 {
		many = append(many, fmt.Sprintf("adapter-%d", i))
	}
	full := EngineLoad{Running: 1<<31 - 1, Waiting: 1<<31 - 1, Slots: 1<<31 - 1, KVUsage: KVFull, HasLoad: true}
	for _, tc := range []struct {
		l EngineLoad
		a LoRAs
	}{
		{EngineLoad{}, LoRAs{}},
		{EngineLoad{Running: 2, HasLoad: true}, MakeLoRAs(2, []string{"base"}, []string{"med"}, []string{"sql"}, []string{"chat"})},
		{EngineLoad{}, MakeLoRAs(1, nil, nil, nil, nil)},
		{EngineLoad{Slots: 4}, MakeLoRAs(0, []string{"base"}, nil, nil, nil)},
		{full, MakeLoRAs(1<<16-1, many[:4], many[4:30], many[30:60], many[60:])},
	} {
		b := AppendEngineWire([]byte{0xAA}, tc.l, tc.a)
		b = append(b, 0xBB)
		l, a, n, err := DecodeEngineWire(b[1:])
		if err != nil || l != tc.l || a != tc.a {
			t.Fatalf("%+v %+v: decoded %+v %+v, %v", tc.l, tc.a, l, a, err)
		}
		if n != len(b)-2 || b[1+n] != 0xBB {
			t.Fatalf("%d bytes read of %d", n, len(b)-2)
		}
		var old EngineLoad
		if m, err := old.DecodeWire(b[1:]); err != nil || old != tc.l || m != n {
			t.Fatalf("an older router reads %+v (%d bytes), %v; want %+v (%d)", old, m, err, tc.l, n)
		}
		if tc.a == (LoRAs{}) && !slices.Equal(b[1:len(b)-1], tc.l.AppendWire(nil)) {
			t.Fatalf("a replica without LoRA changed the section's bytes")
		}
	}
}

// TestEngineWireRefusesBadLoRAs: LoRAs' tags are checked as strictly as
// the load's.
func TestEngineWireRefusesBadLoRAs(t *testing.T) {
	section := func(fields ...uint64) []byte {
		var body []byte
		for i := 0; i < len(fields); i += 2 {
			body = binary.AppendUvarint(append(body, byte(fields[i])), fields[i+1])
		}
		return append([]byte{byte(len(body))}, body...)
	}
	if _, a, _, err := DecodeEngineWire(section(wireLoRAMax, 2, wireLoRAActive, 1, wireLoRAResident, 1, wireLoRAEntries, 5<<2|loraLoaded)); err != nil ||
		a.Max != 2 || a.Fit(5)&LoRAResident == 0 {
		t.Fatalf("a good section: %+v %v", a, err)
	}
	for name, b := range map[string][]byte{
		"max zero":             section(wireLoRAMax, 0),
		"max over 16 bits":     section(wireLoRAMax, 1<<16),
		"active zero":          section(wireLoRAActive, 0),
		"resident zero":        section(wireLoRAResident, 0),
		"entry skipped":        section(wireLoRAResident, 2, wireLoRAEntries+1, 5<<2|loraLoaded),
		"ids out of order":     section(wireLoRAResident, 2, wireLoRAEntries, 6<<2|loraLoaded, wireLoRAEntries+1, 5<<2|loraLoaded),
		"id repeated":          section(wireLoRAActive, 1, wireLoRAResident, 2, wireLoRAEntries, 6<<2|loraLoaded, wireLoRAEntries+1, 6<<2|loraWaiting),
		"id over 26 bits":      section(wireLoRAEntries, 1<<28),
		"fewer resident":       section(wireLoRAResident, 1, wireLoRAEntries, 5<<2|loraLoaded, wireLoRAEntries+1, 6<<2|loraLoaded),
		"resident over max":    section(wireLoRAMax, 1, wireLoRAResident, 2),
		"waiting, none in use": section(wireLoRAEntries, 5<<2|loraWaiting),
	} {
		if _, a, _, err := DecodeEngineWire(b); err == nil {
			t.Errorf("%s: decoded %+v", name, a)
		}
	}
}

// FuzzEngineWire: DecodeEngineWire never panics, reads exactly the
// section, decodes LoRAs an older router's reading agrees with on the
// load, and what it decodes re-encodes to what decodes the same.
func FuzzEngineWire(f *testing.F) {
	f.Add(AppendEngineWire(nil, EngineLoad{Running: 1, HasLoad: true}, MakeLoRAs(2, []string{"b"}, []string{"z"}, []string{"x"}, []string{"y"})))
	f.Add(AppendEngineWire(nil, EngineLoad{}, MakeLoRAs(1, nil, nil, nil, nil)))
	f.Add([]byte{6, wireLoRAResident, 1, wireLoRAEntries, 0x85, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, a, n, err := DecodeEngineWire(b)
		if err != nil {
			return
		}
		if n != 1+int(b[0]) {
			t.Fatalf("read %d bytes, length byte %d", n, b[0])
		}
		var old EngineLoad
		if m, err := old.DecodeWire(b); err != nil || m != n || old != l {
			t.Fatalf("load %+v (%d) against %+v (%d), %v", l, n, old, m, err)
		}
		if a.Len() > MaxLoRAEntries || (a.Max > 0 && a.Resident > a.Max) {
			t.Fatalf("impossible %+v", a)
		}
		re := AppendEngineWire(nil, l, a)
		l2, a2, _, err := DecodeEngineWire(re)
		if err != nil || l2 != l || a2 != a {
			t.Fatalf("%+v %+v re-encoded as %x decodes to %+v %+v, %v", l, a, re, l2, a2, err)
		}
	})
}

// loraCands are n replicas with 4 free slots each, of a LoRA engine.
func loraCands(n int) []Candidate {
	cs := candidates(n)
	for i := range cs {
		cs[i].Slots = 4
		cs[i].LoRA = LoRAAdapter | LoRARoom | LoRAFree
	}
	return cs
}

func loraRequest(model string) Request {
	h := chainOf(nil, 3, uint64(LoRAID(model)>>8|1))
	r := request(h)
	r.Model = ModelKey(model)
	return r
}

// TestLoRAPrefersWhereTheAdapterRuns: a replica running the adapter with
// a free slot takes the request, whatever another replica's load or
// rendezvous weight; among several the decision is the usual one (a
// cold request goes to one that can start it).
func TestLoRAPrefersWhereTheAdapterRuns(t *testing.T) {
	cs := loraCands(4)
	cs[2].LoRA |= LoRAResident
	cs[2].InFlight = 3 // one slot left
	for _, model := range []string{"sql", "chat", "legal", "tax"} {
		d := DefaultPolicy().Pick(loraRequest(model), cs)
		if d.Index != 2 || d.LoRA != LoRALoaded {
			t.Fatalf("%s: %+v, want replica 2 where it runs", model, d)
		}
	}
	cs[0].LoRA |= LoRAResident
	cs[2].InFlight = 4
	d := DefaultPolicy().Pick(loraRequest("sql"), cs)
	if d.Index != 0 || d.LoRA != LoRALoaded {
		t.Fatalf("two replicas run it, one full: %+v, want the other (0)", d)
	}
}

// TestLoRALoadsOnOneReplicaByRendezvous: an adapter loaded nowhere is
// loaded on the first replica of (adapter, replica) rendezvous with room
// that can start it, the same for every router (the order of the
// candidates does not matter), different for different adapters; a
// replica at its limit is passed over while another has room.
func TestLoRALoadsOnOneReplicaByRendezvous(t *testing.T) {
	targets := map[string]bool{}
	for a := range 16 {
		model := fmt.Sprintf("adapter-%d", a)
		cs := loraCands(4)
		d := DefaultPolicy().Pick(loraRequest(model), cs)
		if d.LoRA != LoRALoad {
			t.Fatalf("%s: %+v", model, d)
		}
		want := -1
		var wantW uint64
		for i := range cs {
			if w := weight(ModelKey(model), cs[i].Hash); want < 0 || w > wantW {
				want, wantW = i, w
			}
		}
		if d.Index != want {
			t.Fatalf("%s: replica %d, want the rendezvous first %d", model, d.Index, want)
		}
		targets[cs[d.Index].ID()] = true
		// Another router's candidates in another order, and another
		// prompt of the adapter: the same replica.
		rev := slices.Clone(cs)
		slices.Reverse(rev)
		r := loraRequest(model)
		r.Hashes = chainOf(nil, 5, 99)
		if d2 := DefaultPolicy().Pick(r, rev); rev[d2.Index].ID() != cs[want].ID() {
			t.Fatalf("%s: another router loads it on %s, not %s", model, rev[d2.Index].ID(), cs[want].ID())
		}
		// The first choice holds idle adapters only: a free slot elsewhere
		// first.
		cs[want].LoRA = LoRAAdapter | LoRARoom
		if d := DefaultPolicy().Pick(loraRequest(model), cs); d.Index == want || d.LoRA != LoRALoad {
			t.Fatalf("%s: %+v with the first choice's slots all loaded", model, d)
		}
		// No free slot anywhere: the first choice, evicting an idle one.
		for i := range cs {
			cs[i].LoRA = LoRAAdapter | LoRARoom
		}
		if d := DefaultPolicy().Pick(loraRequest(model), cs); d.Index != want || d.LoRA != LoRASwap {
			t.Fatalf("%s: %+v with no free slot, want %d swapping", model, d, want)
		}
		// The first choice at its limit in use: the next one with room.
		cs[want].LoRA = LoRAAdapter
		if d := DefaultPolicy().Pick(loraRequest(model), cs); d.Index == want || d.LoRA != LoRASwap {
			t.Fatalf("%s: %+v with the first choice full", model, d)
		}
		// Every slot in use everywhere: the first choice that can start
		// it, waiting for a slot.
		for i := range cs {
			cs[i].LoRA = LoRAAdapter
		}
		if d := DefaultPolicy().Pick(loraRequest(model), cs); d.Index != want || d.LoRA != LoRAFull {
			t.Fatalf("%s: %+v with every replica full, want %d", model, d, want)
		}
	}
	if len(targets) < 3 {
		t.Fatalf("16 adapters loaded on %d of 4 replicas", len(targets))
	}
}

// TestLoRASpillsToTheLoadTargetWhenLoadedOnesAreFull: with every replica
// running the adapter full, the request may go to the one to load it on
// (a cold request takes the one that can start it), never to another;
// with no room anywhere it queues where the adapter runs.
func TestLoRASpillsToTheLoadTargetWhenLoadedOnesAreFull(t *testing.T) {
	cs := loraCands(4)
	cs[1].LoRA |= LoRAResident
	cs[1].InFlight = 6 // full, 2 queued
	d := DefaultPolicy().Pick(loraRequest("sql"), cs)
	if d.Index == 1 || d.LoRA != LoRALoad {
		t.Fatalf("%+v, want a load on another replica", d)
	}
	target := d.Index
	for range 3 {
		if d := DefaultPolicy().Pick(loraRequest("sql"), cs); d.Index != target {
			t.Fatalf("%+v, the load target moved from %d", d, target)
		}
	}
	for i := range cs {
		if i != 1 {
			cs[i].LoRA = LoRAAdapter // at their limit
		}
	}
	if d := DefaultPolicy().Pick(loraRequest("sql"), cs); d.Index != 1 || d.LoRA != LoRALoaded {
		t.Fatalf("%+v, want a queue where it runs (1)", d)
	}
}

// TestLoRAWaitingRanksBelowRoom: where requests of the adapter already
// wait ranks below room to load it, and above evicting.
func TestLoRAWaitingRanksBelowRoom(t *testing.T) {
	cs := loraCands(3)
	cs[0].LoRA = LoRAAdapter | LoRAWaiting
	cs[1].LoRA = LoRAAdapter
	cs[2].LoRA = LoRAAdapter | LoRARoom | LoRAFree
	if d := DefaultPolicy().Pick(loraRequest("sql"), cs); d.Index != 2 || d.LoRA != LoRALoad {
		t.Fatalf("%+v, want room (2)", d)
	}
	cs[2].LoRA = LoRAAdapter
	if d := DefaultPolicy().Pick(loraRequest("sql"), cs); d.Index != 0 || d.LoRA != LoRAQueued {
		t.Fatalf("%+v, want where it waits (0)", d)
	}
}

// TestLoRAKeepsCacheAwarePlacement: among the replicas running the
// adapter, the holder of the conversation takes its next turn (the
// usual decision); a stale candidate tells nothing, and with every
// candidate stale the request is placed as a base model's.
func TestLoRAKeepsCacheAwarePlacement(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	cs := loraCands(4)
	for i := range cs {
		cs[i].Summary = held(t)
		cs[i].LoRA |= LoRAResident
	}
	cs[3].Summary = held(t, conv)
	r := request(chainOf(conv, 3, 4))
	r.Model = ModelKey("sql")
	if d := DefaultPolicy().Pick(r, cs); d.Index != 3 || d.Reason != ReasonPrefix || d.Match != 10 || d.LoRA != LoRALoaded {
		t.Fatalf("%+v, want the holder (3) by prefix", d)
	}
	// The holder does not run it: it goes where the adapter runs.
	cs[3].LoRA = LoRAAdapter | LoRARoom | LoRAFree
	if d := DefaultPolicy().Pick(r, cs); d.Index == 3 || d.LoRA != LoRALoaded {
		t.Fatalf("%+v, want a replica running the adapter", d)
	}
	for i := range cs {
		cs[i].Stale = true
	}
	if d := DefaultPolicy().Pick(r, cs); d.Index < 0 || d.LoRA != LoRAUnknown || d.Reason != ReasonFallbackStale {
		t.Fatalf("all stale: %+v", d)
	}
}

// TestLoRALeavesBaseModelsAlone: a base model's candidates (LoRA 0) are
// decided exactly as before, and Decision.LoRA stays empty.
func TestLoRALeavesBaseModelsAlone(t *testing.T) {
	conv := chainOf(nil, 10, 2)
	cs := candidates(4)
	for i := range cs {
		cs[i].Summary = held(t)
		cs[i].Slots = 4
	}
	cs[1].Summary = held(t, conv)
	r := request(chainOf(conv, 3, 4))
	r.Model = ModelKey("base")
	d := DefaultPolicy().Pick(r, cs)
	if d.Index != 1 || d.LoRA != "" {
		t.Fatalf("%+v", d)
	}
	for _, i := range []int{0, 2, 3} {
		cs[i].InFlight = int32(i)
	}
	cold := request(chainOf(nil, 3, 77))
	want := DefaultPolicy().Pick(cold, cs)
	cold.Model = ModelKey("base")
	if got := DefaultPolicy().Pick(cold, cs); got != want {
		t.Fatalf("the model's key changed a base model's decision: %+v != %+v", got, want)
	}
}

// TestLoRAsParent: an adapter's parent is the replica's base model (the
// first by name of several), and nothing is the parent of a base model,
// of a model of an engine that says nothing of LoRA, or of an adapter
// of a replica whose base model is not known.
func TestLoRAsParent(t *testing.T) {
	a := MakeLoRAs(2, []string{"base"}, []string{"sql"}, nil, nil)
	models := []string{"base", "chat", "sql"}
	for m, want := range map[string]string{"base": "", "chat": "base", "sql": "base"} {
		if got := a.Parent(models, m); got != want {
			t.Errorf("parent of %s: %q, want %q", m, got, want)
		}
	}
	aliases := MakeLoRAs(2, []string{"zeta", "alpha"}, nil, nil, nil)
	if got := aliases.Parent([]string{"alpha", "chat", "zeta"}, "chat"); got != "alpha" {
		t.Errorf("parent under two base names: %q, want the first by name", got)
	}
	if got := (LoRAs{}).Parent(models, "chat"); got != "" {
		t.Errorf("an engine without LoRA gave chat the parent %q", got)
	}
	if got := MakeLoRAs(2, nil, []string{"sql"}, nil, nil).Parent([]string{"sql"}, "sql"); got != "" {
		t.Errorf("no base model known, yet sql has the parent %q", got)
	}
}
