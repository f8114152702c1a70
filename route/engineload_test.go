package route

import (
	"encoding/binary"
	"testing"
)

func engineLoads() []EngineLoad {
	return []EngineLoad{
		{},
		{Slots: 8},
		{HasLoad: true},
		{Running: 3, Waiting: 1, Slots: 8, HasLoad: true},
		{KVUsage: 1},
		{Running: 3, Waiting: 1, Slots: 8, KVUsage: 4127, HasLoad: true},
		{Running: 1<<31 - 1, Waiting: 1<<31 - 1, Slots: 1<<31 - 1, KVUsage: KVFull, HasLoad: true},
		{Running: 2, HasLoad: true, MinSlots: 3},
		{MinSlots: 255, KVUsage: 9},
	}
}

// TestEngineLoadWire: every load round-trips, leaves unknown fields
// out, and is followed by whatever comes after it.
func TestEngineLoadWire(t *testing.T) {
	for _, l := range engineLoads() {
		b := l.AppendWire([]byte{0xAA})
		b = append(b, 0xBB)
		var got EngineLoad
		n, err := got.DecodeWire(b[1:])
		if err != nil || got != l {
			t.Fatalf("%+v: decoded %+v, %v", l, got, err)
		}
		if n != len(b)-2 || b[1+n] != 0xBB {
			t.Fatalf("%+v: %d bytes read of %d", l, n, len(b)-2)
		}
	}
	if b := (EngineLoad{}).AppendWire(nil); len(b) != 1 {
		t.Fatalf("an unknown load takes %d bytes, want the length byte only", len(b))
	}
}

// TestEngineLoadWireSkipsUnknownTags: a field a newer router adds (a
// tag this decoder does not know) is skipped, so the fields known around
// it still decode; a section out of tag order, a truncated varint and a
// count out of range are refused.
func TestEngineLoadWireSkipsUnknownTags(t *testing.T) {
	section := func(fields ...uint64) []byte {
		var body []byte
		for i := 0; i < len(fields); i += 2 {
			body = binary.AppendUvarint(append(body, byte(fields[i])), fields[i+1])
		}
		return append([]byte{byte(len(body))}, body...)
	}
	var l EngineLoad
	if _, err := l.DecodeWire(section(wireRunning, 2, wireWaiting, 0, 200, 1<<40, 201, 7)); err != nil ||
		l != (EngineLoad{Running: 2, HasLoad: true}) {
		t.Fatalf("with unknown tags: %+v %v", l, err)
	}
	for name, b := range map[string][]byte{
		"empty input":        nil,
		"length past input":  {5, wireSlots, 1},
		"tags out of order":  section(wireSlots, 1, wireRunning, 1),
		"repeated tag":       section(wireSlots, 1, wireSlots, 2),
		"tag zero":           section(0, 1),
		"varint cut":         {2, wireSlots, 0x80},
		"count over int32":   section(wireSlots, 1<<31),
		"KV usage over 1":    section(wireKVUsage, KVFull+1),
		"min slots over 255": section(wireMinSlots, 256),
	} {
		if _, err := l.DecodeWire(b); err == nil {
			t.Errorf("%s: decoded %+v", name, l)
		}
	}
}

// TestEngineLoadMergeForget: Merge takes what l does not know from o,
// the counts together; Forget keeps the configuration and what the
// engine was seen to run only.
func TestEngineLoadMergeForget(t *testing.T) {
	metrics := EngineLoad{Running: 2, HasLoad: true}
	info := EngineLoad{Running: 9, Waiting: 9, HasLoad: true, Slots: 4, KVUsage: 7, MinSlots: 3}
	if got := metrics.Merge(info); got != (EngineLoad{Running: 2, HasLoad: true, Slots: 4, KVUsage: 7, MinSlots: 3}) {
		t.Fatalf("merge %+v", got)
	}
	if got := (EngineLoad{}).Merge(info); got != info {
		t.Fatalf("merge into unknown %+v", got)
	}
	if got := info.Forget(); got != (EngineLoad{Slots: 4, MinSlots: 3}) {
		t.Fatalf("forget %+v", got)
	}
}

// FuzzEngineLoadWire: the decoder never panics, never reads past the
// section it reports, and what it decodes re-encodes to a section that
// decodes the same.
func FuzzEngineLoadWire(f *testing.F) {
	for _, l := range engineLoads() {
		f.Add(l.AppendWire(nil))
	}
	f.Add([]byte{4, wireSlots, 8, 99, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l EngineLoad
		n, err := l.DecodeWire(b)
		if err != nil {
			return
		}
		if n < 1 || n > len(b) || n != 1+int(b[0]) {
			t.Fatalf("read %d of %d bytes (length byte %d)", n, len(b), b[0])
		}
		if !l.HasLoad && (l.Running != 0 || l.Waiting != 0) || l.Running < 0 || l.Waiting < 0 || l.Slots < 0 {
			t.Fatalf("decoded an impossible load %+v", l)
		}
		re := l.AppendWire(nil)
		var again EngineLoad
		if _, err := again.DecodeWire(re); err != nil || again != l {
			t.Fatalf("%+v re-encoded as %x decodes to %+v, %v", l, re, again, err)
		}
	})
}
